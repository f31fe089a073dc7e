"""Backend choice: by device for ``kernels.<op>``, by name through ``get_backend``; triton imported lazily."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from kernel_cases import assert_close_to, build_case, dense_attention
from kernels import cpu_kernels, reference

REPO = Path(__file__).resolve().parents[2]


def test_auto_picks_the_cpu_kernels_on_cpu_and_torch_the_reference():
    assert cpu_kernels.available(), cpu_kernels.unavailable_reason()
    assert kernels.get_backend(None, "cpu") is cpu_kernels
    assert kernels.get_backend("auto", torch.device("cpu")) is cpu_kernels
    assert kernels.get_backend("cpu", "cpu") is cpu_kernels
    assert kernels.get_backend("torch", "cpu") is reference


def test_cpu_backend_off_the_cpu_is_refused():
    with pytest.raises(ValueError, match="CPU only"):
        kernels.get_backend("cpu", "cuda")


def test_without_a_compiler_auto_falls_back_to_the_reference_with_a_warning(tmp_path):
    """No compiler (and no cached build): "auto" warns and serves the reference, "cpu" refuses, saying why."""
    script = (
        "import warnings, kernels\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    assert kernels.get_backend(None, 'cpu') is kernels.reference\n"
        "print('warned:', caught[0].message)\n"
        "try:\n"
        "    kernels.get_backend('cpu', 'cpu')\n"
        "except ValueError as exc:\n"
        "    print('refused:', exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "CXX": "no-such-compiler", "PAGED_PLAYGROUND_CACHE": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "warned: C++ CPU kernels unavailable, using the (slower) torch reference: no C++ compiler" in result.stdout
    assert "refused: the cpu backend is unavailable: no C++ compiler ('no-such-compiler'" in result.stdout


def test_triton_on_cpu_under_the_interpreter(triton_ops):
    assert os.environ["TRITON_INTERPRET"] == "1" or torch.cuda.is_available()
    assert kernels.get_backend("triton", "cpu" if triton_ops.INTERPRETED else "cuda") is triton_ops


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        kernels.get_backend("triton", "cpu")


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="'flash'"):
        kernels.get_backend("flash", "cpu")


def test_top_level_ops_dispatch_by_device(device):
    """``kernels.<op>`` on this device's tensors gives the right answer (C++ kernels on CPU, Triton on CUDA)."""
    case = build_case(block_size=8, num_heads=6, kv_heads=2, head_dim=64, dtype=torch.float32,
                      context_lens=[3, 12], query_lens=[3, 4], seed=7, device=device)
    out = kernels.paged_attention_prefill(case.query, case.key_cache, case.value_cache, case.block_tables,
                                          case.context_lens, case.query_start_loc, case.scale)
    assert_close_to(out, dense_attention(case), torch.float32)
    last_rows = case.query_start_loc[1:].long() - 1
    decode = kernels.paged_attention_decode(case.query[last_rows], case.key_cache, case.value_cache,
                                            case.block_tables, case.context_lens, case.scale)
    assert_close_to(decode, out[last_rows], torch.float32)


def test_import_without_triton_still_serves_the_reference():
    """``import kernels`` must not need triton; asking for it then fails with a clear error."""
    script = (
        "import sys; sys.modules['triton'] = None\n"
        "import kernels\n"
        "assert kernels.get_backend('torch', 'cpu') is kernels.reference\n"
        "try:\n"
        "    kernels.get_backend('triton', 'cuda')\n"
        "except ValueError as exc:\n"
        "    print('refused:', exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "refused: the triton backend is unavailable" in result.stdout


def test_a_build_lock_left_by_a_killed_build_does_not_hang_the_next_start(monkeypatch, tmp_path):
    """torch's build lock is a plain file; a build killed midway leaves it, and the next process waited for it
    forever. Under our flock (held by no one else), the leftover is removed before building."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("PAGED_PLAYGROUND_CACHE", str(tmp_path))
    builds = []

    def killed_midway(name, sources, build_directory, **options):
        (Path(build_directory) / "lock").touch()  # what the killed build leaves behind
        raise RuntimeError("killed")

    def build(name, sources, build_directory, **options):
        builds.append((Path(build_directory) / "lock").exists())
        return object()

    try:
        for load in (killed_midway, build):
            cpu_kernels._build.cache_clear()
            monkeypatch.setattr(cpp_extension, "load", load)
            cpu_kernels._build()
        assert builds == [False]
    finally:
        cpu_kernels._build.cache_clear()  # later tests load the real extension again


def test_two_checkouts_of_the_same_sources_share_one_build_and_a_changed_source_gets_its_own(monkeypatch, tmp_path):
    """ninja rebuilds when a source's path changes: checkouts (git worktrees) that built from their own paths into
    one folder recompiled it in turn. The build is keyed by the sources' contents and compiles copies inside it."""
    import shutil

    from torch.utils import cpp_extension

    monkeypatch.setenv("PAGED_PLAYGROUND_CACHE", str(tmp_path / "cache"))
    loads = []
    monkeypatch.setattr(cpp_extension, "load", lambda name, sources, build_directory, **options:
                        loads.append((build_directory, sources)) or object())

    def build_from(checkout: Path) -> tuple[str, list[str]]:
        monkeypatch.setattr(cpu_kernels, "_SOURCES_DIR", checkout)
        monkeypatch.setattr(cpu_kernels, "_SOURCES", [checkout / path.name for path in cpu_kernels._SOURCES])
        cpu_kernels._build.cache_clear()
        cpu_kernels._build()
        return loads[-1]

    try:
        checkouts = [shutil.copytree(cpu_kernels._SOURCES_DIR, tmp_path / name / "csrc") for name in ("a", "b")]
        first, second = build_from(checkouts[0]), build_from(checkouts[1])
        assert first == second  # same folder, same source paths: nothing for ninja to redo
        assert all(Path(source).parent == Path(first[0]) / "src" for source in first[1])
        with open(checkouts[1] / "cpu_math.h", "a") as header:  # a header counts too
            header.write("\n// changed\n")
        changed = build_from(checkouts[1])
        assert changed[0] != first[0]
        assert (Path(changed[0]) / "src" / "cpu_math.h").read_text().endswith("// changed\n")
    finally:
        cpu_kernels._build.cache_clear()
