"""dtype="auto" picks bfloat16 on CPUs with native bfloat16 and float32 elsewhere; explicit dtypes always win;
the converted model folder names its architecture (vLLM and other tools refuse a null `architectures`)."""

import json

import pytest
import torch

from inference import config
from inference.config import EngineArgs
from inference.model_loader import DEFAULT_MODEL, _name_architecture, resolve_model


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_on_cpu_follows_native_bf16(monkeypatch, native):
    monkeypatch.setattr(config, "cpu_has_native_bf16", lambda: native)
    expected = torch.bfloat16 if native else torch.float32
    assert EngineArgs().resolve_dtype(torch.device("cpu")) == expected
    assert EngineArgs(dtype="float32").resolve_dtype(torch.device("cpu")) == torch.float32
    assert EngineArgs(dtype="bfloat16").resolve_dtype(torch.device("cpu")) == torch.bfloat16


def test_native_bf16_detection_matches_the_cpu_flags():
    flags = open("/proc/cpuinfo").read().split("\n\n")[0].split()
    assert config.cpu_has_native_bf16() == ("avx512_bf16" in flags or "amx_tile" in flags)


def test_converted_folder_names_its_architecture(tmp_path):
    assert json.loads((resolve_model(DEFAULT_MODEL) / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLM"]
    # A folder converted before the fix is repaired in place, keeping every other key.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": None, "x": 1}))
    _name_architecture(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()) == {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "x": 1}
