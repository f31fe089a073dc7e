"""dtype="auto" is float32 on CPU (the oracle mode) and explicit dtypes always win; the converted model folder
names its architecture (vLLM and other tools refuse a null `architectures`)."""

import json

import pytest
import torch

from inference.config import EngineArgs
from inference.model_loader import DEFAULT_MODEL, _name_architecture, find_gguf, resolve_model


def test_auto_dtype_is_float32_on_cpu_and_explicit_dtypes_win():
    assert EngineArgs().resolve_dtype(torch.device("cpu")) == torch.float32
    assert EngineArgs(dtype="bfloat16").resolve_dtype(torch.device("cpu")) == torch.bfloat16
    assert EngineArgs(dtype="float32").resolve_dtype(torch.device("cuda")) == torch.float32


def test_vllm_dtype_names_are_accepted():
    # vLLM's example 7 passes dtype="half"; "float" is its name for float32.
    assert EngineArgs(dtype="half").resolve_dtype(torch.device("cpu")) == torch.float16
    assert EngineArgs(dtype="float").resolve_dtype(torch.device("cpu")) == torch.float32
    assert EngineArgs(dtype="half").dtype == "float16"  # stored under one name (the lab shows it)
    with pytest.raises(ValueError, match="'half'"):
        EngineArgs(dtype="double")


def test_converted_folder_names_its_architecture(tmp_path):
    assert json.loads((resolve_model(DEFAULT_MODEL) / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLM"]
    # A folder converted before the fix is repaired in place, keeping every other key.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": None, "x": 1}))
    _name_architecture(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()) == {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "x": 1}


def test_the_converted_folder_of_the_builtin_model_finds_its_bundled_gguf():
    """`LLM(model=<that folder>, quantization="gguf")` runs the file the folder was converted from."""
    folder = resolve_model(DEFAULT_MODEL)
    bundled = find_gguf(DEFAULT_MODEL, folder)
    assert bundled is not None and bundled.suffix == ".gguf" and bundled.is_file()
    assert find_gguf(str(folder), folder) == bundled
