"""C++ paged-attention kernels for the CPU: same signatures and semantics as ``kernels.reference``.

Attention reads K/V in place through the block tables with an online softmax in float32
(``kernels/csrc/paged_attention_cpu.cpp``): one routine for decode and prefill, threads over
(sequence, KV head, query tile); a prefill sequence of ``SDPA_MIN_QUERY`` or more new tokens goes through
torch's CPU flash attention instead, on a contiguous copy of its blocks. Float32, bfloat16 and float16 run in C++;
other dtypes (float64) take the reference. ``rotary_embedding_`` rotates q and k in one pass (``kernels/csrc/rotary_cpu.cpp``), ``rms_norm`` normalises a
row in one (``kernels/csrc/rms_norm_cpu.cpp``), and so does the MLP's ``silu_and_mul``.
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
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from kernels import reference, validation

__all__ = ["reshape_and_cache", "paged_attention_decode", "paged_attention_prefill", "copy_blocks",
           "rotary_embedding_", "rms_norm", "silu_and_mul", "available", "unavailable_reason"]

copy_blocks = reference.copy_blocks

_SOURCES = [Path(__file__).with_name("csrc") / name for name in ("paged_attention_cpu.cpp", "rotary_cpu.cpp",
                                                                     "rms_norm_cpu.cpp", "silu_and_mul_cpu.cpp",
                                                                     "reshape_and_cache_cpu.cpp",
                                                                     "weight_only_cpu.cpp")]
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
    validation.check_silu_and_mul(x)
    if x.dtype not in _NATIVE_DTYPES or x.device.type != "cpu" or x.dim() != 2 or x.stride(-1) != 1:
        return reference.silu_and_mul(x)
    return extension().silu_and_mul(x)


def paged_attention_decode(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor, scale: float, out: Tensor | None = None) -> Tensor:
    """See ``kernels.reference.paged_attention_decode``: a prefill where every sequence has one new token."""
    num_seqs = query.shape[0]
    validation.check_attention(query, key_cache, value_cache, block_tables, context_lens, num_seqs)
    if query.dtype not in _NATIVE_DTYPES:
        return reference.paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale,
                                                out=out)
    out = validation.output_for(query, out)
    _run(out, query, key_cache, value_cache, block_tables, context_lens, _decode_starts(num_seqs), scale)
    return out


@functools.lru_cache(maxsize=512)
def _decode_starts(num_seqs: int) -> Tensor:
    """0, 1, ..., num_seqs: a decode step's query_start_loc, made once per batch size (every layer asks for it)."""
    return torch.arange(num_seqs + 1, dtype=torch.int32)


def paged_attention_prefill(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                            context_lens: Tensor, query_start_loc: Tensor, scale: float,
                            out: Tensor | None = None) -> Tensor:
    """See ``kernels.reference.paged_attention_prefill`` (same checks, same errors)."""
    num_seqs = block_tables.shape[0]
    validation.check_attention(query, key_cache, value_cache, block_tables, context_lens, num_seqs)
    validation.check_query_start_loc(query_start_loc, num_seqs)
    if query.dtype not in _NATIVE_DTYPES:
        return reference.paged_attention_prefill(query, key_cache, value_cache, block_tables, context_lens,
                                                 query_start_loc, scale, out=out)
    starts = query_start_loc.to(torch.int32)
    q_lens = starts[1:] - starts[:-1]
    if bool((q_lens < 0).any()) or int(starts[-1]) != query.shape[0] or bool((q_lens > context_lens).any()):
        raise ValueError("query_start_loc must be non-decreasing, end at num_tokens, and give each sequence "
                         "at most context_lens[s] new tokens")
    if query.device.type != "cpu":
        raise ValueError(f"the cpu backend needs CPU tensors, got {query.device}")
    out = validation.output_for(query, out)
    starts_list, contexts = starts.tolist(), context_lens.tolist()
    long = [s for s in range(num_seqs) if starts_list[s + 1] - starts_list[s] >= SDPA_MIN_QUERY]
    width, block_size = block_tables.shape[1], key_cache.shape[1]
    for s in long:  # refused before anything is written, as the C++ planner refuses the others
        if (needed := -(-contexts[s] // block_size)) > width:
            raise ValueError(f"block_tables has {width} columns but a context of {contexts[s]} tokens needs "
                             f"{needed} blocks")
    for s in long:
        _prefill_by_sdpa(out, query, key_cache, value_cache, block_tables[s], starts_list[s], starts_list[s + 1],
                         contexts[s], scale)
    if len(long) == num_seqs:
        return out
    if not long:
        _run(out, query, key_cache, value_cache, block_tables, context_lens, starts, scale)
        return out
    # The short ones (decode rows of a mixed step, short suffixes after a prefix hit) as one sub-batch.
    taken = set(long)
    short = [s for s in range(num_seqs) if s not in taken]
    rows = torch.cat([torch.arange(starts_list[s], starts_list[s + 1]) for s in short])
    lens = torch.tensor([starts_list[s + 1] - starts_list[s] for s in short], dtype=torch.int32)
    sub_starts = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0, dtype=torch.int32)])
    sub_out = torch.empty((rows.numel(), *query.shape[1:]), dtype=query.dtype)
    _run(sub_out, query[rows], key_cache, value_cache, block_tables[short], context_lens[short], sub_starts, scale)
    out[rows] = sub_out
    return out


# A sequence with at least this many new tokens attends through torch's CPU flash attention (blocked matmuls),
# 2-3x faster than the row-by-row kernel for a prompt (BENCHMARKS.md, issue 12); shorter ones use the kernel.
SDPA_MIN_QUERY = 32


def _prefill_by_sdpa(out: Tensor, query: Tensor, key_cache: Tensor, value_cache: Tensor, table: Tensor, start: int,
                     end: int, context: int, scale: float) -> None:
    """One sequence's new rows `start:end` attending to its `context` cached tokens (the new ones last): its
    blocks' K/V gathered into a contiguous copy, then `scaled_dot_product_attention`, causal from the query's
    offset (a prefix-cache hit or an earlier chunk puts `context - (end - start)` tokens before it)."""
    block_size = key_cache.shape[1]
    blocks = table[: -(-context // block_size)].long()
    keys = key_cache.index_select(0, blocks).flatten(0, 1)[:context].transpose(0, 1).unsqueeze(0)  # 5x `[blocks]`
    values = value_cache.index_select(0, blocks).flatten(0, 1)[:context].transpose(0, 1).unsqueeze(0)
    q = query[start:end].transpose(0, 1).unsqueeze(0)
    q_len = end - start
    mask = None
    if context > q_len:  # row i sits at position context - q_len + i
        mask = torch.arange(context) <= torch.arange(context - q_len, context).unsqueeze(1)
    result = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                              is_causal=mask is None, scale=scale, enable_gqa=True)
    out[start:end] = result[0].transpose(0, 1)


def _run(out: Tensor, query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
         context_lens: Tensor, query_start_loc: Tensor, scale: float) -> None:
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
                                float(scale))


def cache_root() -> Path:
    """Where built extensions live: $PAGED_PLAYGROUND_CACHE/kernels, else ~/.cache/paged-playground/kernels."""
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
        # kernels.tiled_weights; the OS is asked for AMX tile data at run time, and may refuse it.
        if {"avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16"} <= cpu_flags:
            flags += ["-mavx512bf16", "-mavx512vnni", "-mamx-tile", "-mamx-bf16"]
    return flags


@functools.cache
def _build() -> tuple[ModuleType | None, str]:
    """Compile (or load the cached build of) the extension once per process: (module or None, why not)."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return None, f"no C++ compiler ({compiler!r} is not on PATH); install g++ to build the cpu kernels"
    from torch.utils import cpp_extension

    # -fopenmp: at::parallel_for is a header template over `#pragma omp parallel`, so without it the kernel
    # runs on one thread. It links torch's own libgomp, so one OpenMP runtime serves torch and the kernel.
    # -ffp-contract=off: no product is fused into an FMA behind the code's back, so scalar code rounds where
    # torch's reference does (the rotary op is bit-equal to it); the attention's FMAs are explicit intrinsics.
    flags = ["-O3", "-fopenmp", "-ffp-contract=off", *isa_flags()]
    torch_lib = Path(torch.__file__).parent / "lib"
    ldflags = [f"-L{torch_lib}", "-l:libgomp.so.1", f"-Wl,-rpath,{torch_lib}"]
    tag = hashlib.sha256(" ".join([torch.__version__, sys.version, *flags, *ldflags]).encode()).hexdigest()[:12]
    build_dir = cache_root() / f"paged_attention_cpu-{tag}"
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        # torch's own build lock is a plain file that a build killed midway leaves behind, and every later
        # process then waits for it forever (a worker that never starts). An flock dies with its holder: under
        # it, no other process is building, so a leftover torch lock is stale and is removed.
        with open(build_dir / "build.flock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            (build_dir / "lock").unlink(missing_ok=True)
            module = cpp_extension.load(name="paged_attention_cpu", sources=[str(path) for path in _SOURCES], extra_cflags=flags,
                                        extra_ldflags=ldflags, build_directory=str(build_dir), verbose=False)
    except (RuntimeError, OSError, ImportError) as exc:
        return None, f"building the cpu kernels failed ({type(exc).__name__}: {str(exc).strip()[-500:]})"
    return module, ""


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
