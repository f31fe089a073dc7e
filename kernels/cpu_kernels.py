"""C++ paged-attention kernels for the CPU: same signatures and semantics as ``kernels.reference``.

Attention reads K/V in place through the block tables with an online softmax in float32
(``kernels/csrc/paged_attention_cpu.cpp``): one routine for decode and prefill, threads over
(sequence, KV head, query tile); a sequence of ``prompt_min_query()`` or more new tokens (a prompt) goes through
blocked matmuls instead, on a contiguous copy of its blocks (``csrc/prompt_attention_cpu.cpp``). Float32,
bfloat16 and float16 run in C++; other dtypes (float64) take the reference. ``rotary_embedding_`` rotates q and
k in one pass (``kernels/csrc/rotary_cpu.cpp``), ``rms_norm`` normalises a row in one
(``kernels/csrc/rms_norm_cpu.cpp``), and so do the MLP's ``silu_and_mul`` and Gemma's ``gelu_tanh_and_mul``
(``csrc/silu_and_mul_cpu.cpp``). ``decoder_layers`` runs a whole
model's layers for one step in one call (``csrc/decoder_cpu.cpp``), over the same kernels.
``reshape_and_cache`` writes each token's K and V rows with one copy each (``csrc/reshape_and_cache_cpu.cpp``);
``copy_blocks`` is the reference's (one ``index_copy_`` pass per layer, run only on copy-on-write).

The extension is compiled with ``torch.utils.cpp_extension`` on first use (about a minute) into
``$PAGED_PLAYGROUND_CACHE/kernels`` (default ``~/.cache/paged-playground/kernels``), one folder per torch
version and instruction set, and loaded from there after. ``available()`` says whether it could be built;
``unavailable_reason()`` says why not (no compiler, a failed build), so callers can fall back with a clear
message instead of an import error.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from kernels import reference, validation

__all__ = ["reshape_and_cache", "paged_attention_decode", "paged_attention_prefill", "copy_blocks",
           "rotary_embedding_", "rms_norm", "silu_and_mul", "gelu_tanh_and_mul", "decoder_layers", "available", "unavailable_reason"]

copy_blocks = reference.copy_blocks

_SOURCES_DIR = Path(__file__).with_name("csrc")
_SOURCES = [_SOURCES_DIR / name for name in ("paged_attention_cpu.cpp", "rotary_cpu.cpp",
                                                                     "rms_norm_cpu.cpp", "silu_and_mul_cpu.cpp",
                                                                     "reshape_and_cache_cpu.cpp",
                                                                     "weight_only_cpu.cpp", "decoder_cpu.cpp",
                                                                     "prompt_attention_cpu.cpp")]
_NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                      slot_mapping: Tensor) -> None:
    """See ``kernels.reference.reshape_and_cache`` (one row copy per token and cache: ``csrc/reshape_and_cache_cpu.cpp``)."""
    validation.check_cache_pair(key_cache, value_cache)
    validation.check_new_kv(key, value, key_cache, slot_mapping)
    rows_contiguous = all(t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in (key, value))
    if (key.device.type != "cpu" or not rows_contiguous or not key_cache.is_contiguous()
            or not value_cache.is_contiguous() or not key.dtype == value.dtype == key_cache.dtype == value_cache.dtype):
        return reference.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    extension().reshape_and_cache(key, value, key_cache, value_cache, slot_mapping.to(torch.int64))


def rotary_embedding_(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    """See ``kernels.reference.rotary_embedding_`` (bit-equal to it, in one pass: ``csrc/rotary_cpu.cpp``)."""
    validation.check_rotary(x, cos, sin)
    if x.dtype not in _NATIVE_DTYPES or x.device.type != "cpu":
        return reference.rotary_embedding_(x, cos, sin)
    if x.shape[0]:
        extension().rotary_embedding(x, cos.contiguous(), sin.contiguous())


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """See ``kernels.reference.rms_norm`` (one pass per row: ``csrc/rms_norm_cpu.cpp``)."""
    validation.check_rms_norm(x, weight)
    if x.dtype not in _NATIVE_DTYPES or x.device.type != "cpu" or x.dim() != 2 or x.stride(-1) != 1:
        return reference.rms_norm(x, weight, eps)
    return extension().rms_norm(x, weight.contiguous(), float(eps))


def silu_and_mul(x: Tensor) -> Tensor:
    """See ``kernels.reference.silu_and_mul`` (one pass: ``csrc/silu_and_mul_cpu.cpp``)."""
    validation.check_gated_activation(x)
    if x.dtype not in _NATIVE_DTYPES or x.device.type != "cpu" or x.dim() != 2 or x.stride(-1) != 1:
        return reference.silu_and_mul(x)
    return extension().silu_and_mul(x)


def gelu_tanh_and_mul(x: Tensor) -> Tensor:
    """See ``kernels.reference.gelu_tanh_and_mul`` (one pass, as ``silu_and_mul``: ``csrc/silu_and_mul_cpu.cpp``)."""
    validation.check_gated_activation(x)
    if x.dtype not in _NATIVE_DTYPES or x.device.type != "cpu" or x.dim() != 2 or x.stride(-1) != 1:
        return reference.gelu_tanh_and_mul(x)
    return extension().gelu_tanh_and_mul(x)


def paged_attention_decode(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor, scale: float, out: Tensor | None = None,
                           window: int | None = None, softcap: float | None = None) -> Tensor:
    """See ``kernels.reference.paged_attention_decode``: a prefill where every sequence has one new token."""
    num_seqs = query.shape[0]
    validation.check_attention(query, key_cache, value_cache, block_tables, context_lens, num_seqs)
    validation.check_window(window)
    validation.check_softcap(softcap)
    if query.dtype not in _NATIVE_DTYPES:
        return reference.paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale,
                                                out=out, window=window, softcap=softcap)
    out = validation.output_for(query, out)
    _run(out, query, key_cache, value_cache, block_tables, context_lens, _decode_starts(num_seqs), scale, window,
         softcap)
    return out


@functools.lru_cache(maxsize=512)
def _decode_starts(num_seqs: int) -> Tensor:
    """0, 1, ..., num_seqs: a decode step's query_start_loc, made once per batch size (every layer asks for it)."""
    return torch.arange(num_seqs + 1, dtype=torch.int32)


def paged_attention_prefill(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                            context_lens: Tensor, query_start_loc: Tensor, scale: float,
                            out: Tensor | None = None, window: int | None = None,
                            softcap: float | None = None) -> Tensor:
    """See ``kernels.reference.paged_attention_prefill`` (same checks, same errors)."""
    num_seqs = block_tables.shape[0]
    validation.check_attention(query, key_cache, value_cache, block_tables, context_lens, num_seqs)
    validation.check_query_start_loc(query_start_loc, num_seqs)
    validation.check_window(window)
    validation.check_softcap(softcap)
    if query.dtype not in _NATIVE_DTYPES:
        return reference.paged_attention_prefill(query, key_cache, value_cache, block_tables, context_lens,
                                                 query_start_loc, scale, out=out, window=window, softcap=softcap)
    starts = query_start_loc.to(torch.int32)
    _query_lens(starts, context_lens, query.shape[0])
    if query.device.type != "cpu":
        raise ValueError(f"the cpu backend needs CPU tensors, got {query.device}")
    out = validation.output_for(query, out)
    _run(out, query, key_cache, value_cache, block_tables, context_lens, starts, scale, window, softcap)
    return out


def decoder_layers(hidden: Tensor, weights: list[Tensor], kv_caches: list[tuple[Tensor, Tensor]], cos: Tensor,
                   sin: Tensor, slot_mapping: Tensor, block_tables: Tensor, context_lens: Tensor,
                   query_start_loc: Tensor, num_heads: int, scale: float, eps: float,
                   rows: Tensor | None = None, windows: list[int] | None = None) -> Tensor:
    """Every decoder layer of a Llama-family model for one step, in one C++ call (``csrc/decoder_cpu.cpp``):
    the final norm of the last layer's output, at every token or only at ``rows`` (then the last layer writes
    every token's K/V but runs the rest for those rows alone). ``weights`` holds six tensors per layer (input
    norm, packed q/k/v, packed o, post-attention norm, packed gate/up, packed down) and the final norm's last
    (``inference.model.LlamaForCausalLM``). ``windows`` holds each layer's sliding window (0: full attention),
    or is empty where every layer is full. No soft cap: a family with one departs from the Llama block and runs
    layer by layer. The metadata is checked once here, not once a layer."""
    windows = windows or []
    if windows and (len(windows) != len(kv_caches) or any(w < 0 for w in windows)):
        raise ValueError(f"windows must hold one window >= 0 per layer ({len(kv_caches)}), got {windows}")
    key_cache, value_cache = kv_caches[0]
    num_seqs = block_tables.shape[0]
    num_kv_heads, head_dim = key_cache.shape[2:]
    query_shape = torch.Size((hidden.shape[0], num_heads, head_dim))
    validation.check_attention(torch.empty(query_shape, device="meta"), key_cache, value_cache, block_tables,
                               context_lens, num_seqs)
    validation.check_query_start_loc(query_start_loc, num_seqs)
    _query_lens(query_start_loc, context_lens, hidden.shape[0])
    if hidden.dtype not in _NATIVE_DTYPES or hidden.device.type != "cpu" or key_cache.dtype != hidden.dtype:
        raise ValueError(f"decoder_layers runs {_NATIVE_DTYPES} on the CPU with caches of the hidden dtype, got "
                         f"{hidden.dtype} on {hidden.device} and {key_cache.dtype} caches")
    if rows is not None:
        rows = rows.to(torch.int64).contiguous()
        if rows.dim() != 1 or bool(((rows < 0) | (rows >= hidden.shape[0])).any()):
            raise ValueError(f"rows must be a 1-d tensor of row numbers below {hidden.shape[0]}")
    return extension().decoder_layers(
        hidden.contiguous(), weights, [k for k, _ in kv_caches], [v for _, v in kv_caches], cos.contiguous(),
        sin.contiguous(), slot_mapping.to(torch.int64), block_tables.to(torch.int32).contiguous(),
        context_lens.to(torch.int32).contiguous(), query_start_loc.to(torch.int32).contiguous(), num_heads,
        num_kv_heads, head_dim, float(scale), float(eps), rows, windows)


def _query_lens(query_start_loc: Tensor, context_lens: Tensor, num_tokens: int) -> Tensor:
    """Each sequence's new rows, after checking what the C++ planner trusts: offsets non-decreasing from 0 to
    `num_tokens`, and no sequence with more new rows than its context."""
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    if (int(query_start_loc[0]) != 0 or bool((q_lens < 0).any()) or int(query_start_loc[-1]) != num_tokens
            or bool((q_lens > context_lens).any())):
        raise ValueError("query_start_loc must be non-decreasing, end at num_tokens, and give each sequence "
                         "at most context_lens[s] new tokens")
    return q_lens


def prompt_min_query() -> int:
    """New rows from which a sequence attends through blocked matmuls (``csrc/prompt_attention_cpu.cpp``) rather
    than row by row: the C++ routine's own constant."""
    return extension().PROMPT_MIN_QUERY


def _run(out: Tensor, query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
         context_lens: Tensor, query_start_loc: Tensor, scale: float, window: int | None,
         softcap: float | None) -> None:
    """Hand contiguous-last-dim tensors of the right index dtypes to the C++ routine (few tensor ops: this
    runs once per layer per step)."""
    if query.device.type != "cpu":
        raise ValueError(f"the cpu backend needs CPU tensors, got {query.device}")
    if query.shape[0] == 0:
        return
    key_cache, value_cache = (c if c.stride(-1) == 1 else c.contiguous() for c in (key_cache, value_cache))
    if value_cache.dtype != query.dtype or key_cache.dtype != query.dtype:
        raise ValueError(f"query and caches must share a dtype, got {query.dtype}, {key_cache.dtype}")
    query = query if query.stride(-1) == 1 else query.contiguous()
    # A context needing more blocks than block_tables has columns is refused (ValueError) by the C++ planner.
    extension().paged_attention(out, query, key_cache, value_cache, block_tables.to(torch.int32).contiguous(),
                                context_lens.to(torch.int32).contiguous(), query_start_loc.contiguous(),
                                float(scale), window or 0, float(softcap or 0.0))


def cache_root() -> Path:
    """Where built extensions live: $PAGED_PLAYGROUND_KERNELS (an image's read-only build, apart from the model
    volume), else $PAGED_PLAYGROUND_CACHE/kernels, else ~/.cache/paged-playground/kernels."""
    if os.environ.get("PAGED_PLAYGROUND_KERNELS"):
        return Path(os.environ["PAGED_PLAYGROUND_KERNELS"])
    root = os.environ.get("PAGED_PLAYGROUND_CACHE") or Path.home() / ".cache" / "paged-playground"
    return Path(root) / "kernels"


def isa_flags() -> list[str]:
    """Vector flags for what this CPU reports (never -march=native: some VMs report AMX they do not enable)."""
    try:
        cpu_flags = set(Path("/proc/cpuinfo").read_text().split("\n\n")[0].split())
    except OSError:
        cpu_flags = set()
    flags = []
    if {"avx2", "fma"} <= cpu_flags:
        flags += ["-mavx2", "-mfma", "-mf16c"]
    if {"avx512f", "avx512bw", "avx512vl"} <= cpu_flags:
        flags += ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"]
        if "avx512_bf16" in cpu_flags:  # bfloat16 dot products (the attention's scores)
            flags += ["-mavx512bf16"]
        # kernels.tiled_weights; the OS is asked for AMX tile data at run time, and may refuse it.
        if {"avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16"} <= cpu_flags:
            flags += ["-mavx512vnni", "-mamx-tile", "-mamx-bf16"]
    return flags


@functools.cache
def _build() -> tuple[ModuleType | None, str]:
    """Compile (or load the cached build of) the extension once per process: (module or None, why not)."""
    from torch.utils import cpp_extension

    # -fopenmp: at::parallel_for is a header template over `#pragma omp parallel`, so without it the kernel
    # runs on one thread. It links torch's own libgomp, so one OpenMP runtime serves torch and the kernel.
    # -ffp-contract=off: no product is fused into an FMA behind the code's back, so scalar code rounds where
    # torch's reference does (the rotary op is bit-equal to it); the attention's FMAs are explicit intrinsics.
    flags = ["-O3", "-fopenmp", "-ffp-contract=off", *isa_flags()]
    torch_lib = Path(torch.__file__).parent / "lib"
    ldflags = [f"-L{torch_lib}", "-l:libgomp.so.1", f"-Wl,-rpath,{torch_lib}"]
    # The build is keyed by what it is built from (the sources' contents, not their paths), and compiles copies
    # kept inside it: ninja rebuilds when a source's path changes, so two checkouts of the same code (git
    # worktrees) building from their own paths into one folder recompiled it in turn, minutes each time.
    sources = {path.name: path.read_bytes() for path in sorted(_SOURCES_DIR.iterdir()) if path.is_file()}
    recipe = [torch.__version__, sys.version, *flags, *ldflags, *(name + hashlib.sha256(text).hexdigest()
                                                                   for name, text in sources.items())]
    tag = hashlib.sha256(" ".join(recipe).encode()).hexdigest()[:12]
    build_dir = cache_root() / f"paged_attention_cpu-{tag}"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        prebuilt = build_dir / "paged_attention_cpu.so"
        if prebuilt.is_file():  # compiled for this CPU and torch by the image's builder stage (Dockerfile)
            return _load_prebuilt(prebuilt), ""
        return None, (f"no C++ compiler ({compiler!r} is not on PATH) and no build for this CPU and torch in "
                      f"{build_dir}; install g++ to build the cpu kernels")
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        # torch's own build lock is a plain file that a build killed midway leaves behind, and every later
        # process then waits for it forever (a worker that never starts). An flock dies with its holder: under
        # it, no other process is building, so a leftover torch lock is stale and is removed.
        with open(build_dir / "build.flock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            (build_dir / "lock").unlink(missing_ok=True)
            copies = build_dir / "src"
            copies.mkdir(exist_ok=True)
            for name, text in sources.items():
                if not (copies / name).is_file() or (copies / name).read_bytes() != text:
                    (copies / name).write_bytes(text)
            module = cpp_extension.load(name="paged_attention_cpu", sources=[str(copies / path.name) for path in _SOURCES],
                                        extra_cflags=flags, extra_ldflags=ldflags, build_directory=str(build_dir),
                                        verbose=False)
    except (RuntimeError, OSError, ImportError) as exc:
        return None, f"building the cpu kernels failed ({type(exc).__name__}: {str(exc).strip()[-500:]})"
    return module, ""


def _load_prebuilt(path: Path) -> ModuleType:
    """Import an extension built earlier, without a compiler: a runtime image ships the builder stage's .so."""
    spec = importlib.util.spec_from_file_location("paged_attention_cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extension() -> ModuleType:
    """The compiled extension; raises RuntimeError with the reason when it cannot be built."""
    module, why = _build()
    if module is None:
        raise RuntimeError(why)
    return module


def available() -> bool:
    return _build()[0] is not None


def unavailable_reason() -> str:
    return _build()[1]
