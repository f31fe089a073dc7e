"""The prepared GPU check for the kernels: ``python -m kernels.bench`` (under 8 minutes on one GPU).

On CUDA it (1) runs the kernel tests on the GPU, (2) times paged decode attention (batch 64 x context 4096
and a few other shapes) and one varlen prefill with ``triton.testing.do_bench`` against the torch reference
(a block gather, then batched matmuls for decode or one SDPA per sequence for prefill) and SDPA over a
contiguous cache holding the same data, (3) reports achieved bandwidth (K/V bytes read / time) against the
measured device-to-device copy bandwidth, (4) runs an end-to-end engine
throughput check through ``inference.LLM`` when the model is available, and prints the table last.

Without CUDA (or with ``--cpu-smoke``) it runs the same pipeline on tiny shapes, timing with
``time.perf_counter``; Triton then runs only under ``TRITON_INTERPRET=1``. The kernel tests exercise this path.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from kernels import reference

REPO = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Shape:
    """One attention workload: ``batch`` sequences of ``context`` tokens (``query_len`` new ones each)."""

    batch: int
    context: int
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    query_len: int = 1

    @property
    def label(self) -> str:
        kind = "decode" if self.query_len == 1 else f"prefill q{self.query_len}"
        return (f"{kind} {self.batch}x{self.context} h{self.heads}/{self.kv_heads} d{self.head_dim} "
                f"bs{self.block_size} {self.dtype}")


GPU_SHAPES = [
    Shape(64, 4096, 32, 8, 128, 16, "bf16"),    # the target: Llama-3-8B-like heads, 64 x 4096
    Shape(64, 4096, 32, 8, 128, 16, "fp16"),
    Shape(1, 4096, 32, 8, 128, 16, "bf16"),     # one long sequence: only split-K fills the GPU
    Shape(8, 16384, 32, 8, 128, 16, "bf16"),
    Shape(256, 1024, 32, 8, 128, 32, "bf16"),
    Shape(64, 2048, 9, 3, 64, 16, "bf16"),      # SmolLM2-135M heads
    Shape(8, 2048, 32, 8, 128, 16, "bf16", query_len=512),  # chunked prefill on a 1.5k-token prefix
]
CPU_SHAPES = [Shape(2, 48, 4, 2, 64, 16, "fp32"), Shape(2, 40, 4, 2, 64, 8, "fp32", query_len=8)]


@dataclass
class Row:
    label: str
    triton_ms: float | None
    reference_ms: float
    contiguous_ms: float
    kv_bytes: int
    max_error: float | None

    def cells(self, copy_gbps: float) -> list[str]:
        gbps = self.kv_bytes / (self.triton_ms * 1e6) if self.triton_ms else None
        return [self.label, _fmt(self.triton_ms, "{:.3f}"), f"{self.reference_ms:.3f}", f"{self.contiguous_ms:.3f}",
                _fmt(self.triton_ms and self.reference_ms / self.triton_ms, "{:.1f}x"), _fmt(gbps, "{:.0f}"),
                _fmt(gbps and 100 * gbps / copy_gbps, "{:.0f}%"), _fmt(self.max_error, "{:.1e}")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (automatic without CUDA)")
    parser.add_argument("--skip-tests", action="store_true", help="do not run the kernel tests first")
    parser.add_argument("--skip-engine", action="store_true", help="skip the end-to-end engine throughput check")
    parser.add_argument("--full-tests", action="store_true", help="also run the tests marked slow")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available() and not args.cpu_smoke
    device = torch.device("cuda" if on_gpu else "cpu")
    started = time.perf_counter()
    notes = [f"device: {torch.cuda.get_device_name() if on_gpu else 'cpu (smoke run, tiny shapes)'}"]

    if not args.skip_tests:
        notes.append(run_kernel_tests(on_gpu, args.full_tests))
    triton_ops = _triton_ops(device)
    if triton_ops is None:
        notes.append("triton: not run (needs CUDA, or TRITON_INTERPRET=1 on the CPU)")
    copy_gbps = copy_bandwidth(device, (1 << 30) if on_gpu else (1 << 22))
    rows = [bench_attention(shape, device, triton_ops) for shape in (GPU_SHAPES if on_gpu else CPU_SHAPES)]
    if not args.skip_engine:
        notes.extend(engine_throughput(on_gpu))
    notes.append(f"measured device-to-device copy bandwidth: {copy_gbps:.0f} GB/s (bytes read + written)")
    notes.append(f"total bench time: {time.perf_counter() - started:.0f} s")
    print_table(rows, copy_gbps, notes)
    return 0


def run_kernel_tests(on_gpu: bool, full: bool) -> str:
    """The kernel tests in a subprocess: compiled on the GPU (TRITON_INTERPRET=0), interpreted on the CPU."""
    env = {**os.environ, "TRITON_INTERPRET": "0" if on_gpu else "1", "PYTHONPATH": str(REPO)}
    tests = REPO / "tests" / "kernels"
    command = [sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider",
               "--ignore", str(tests / "test_kernel_bench.py"), *([] if full else ["-m", "not slow"])]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    summary = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    if result.returncode != 0:
        print(result.stdout[-6000:], result.stderr[-2000:], sep="\n")
    return f"kernel tests ({'GPU' if on_gpu else 'CPU interpreter'}): {summary}"


def bench_attention(shape: Shape, device: torch.device, triton_ops: ModuleType | None) -> Row:
    """Time Triton, the torch reference and contiguous SDPA on the same randomly paged data."""
    inputs = _paged_inputs(shape, device)
    query, key_cache, value_cache, tables, context_lens, starts, keys, values, scale = inputs
    if shape.query_len == 1:
        def run(ops: ModuleType) -> torch.Tensor:
            return ops.paged_attention_decode(query, key_cache, value_cache, tables, context_lens, scale)
    else:
        def run(ops: ModuleType) -> torch.Tensor:
            return ops.paged_attention_prefill(query, key_cache, value_cache, tables, context_lens, starts, scale)

    dense_query = query.view(shape.batch, shape.query_len, shape.heads, shape.head_dim).transpose(1, 2)
    causal = shape.query_len > 1

    def contiguous() -> torch.Tensor:
        mask = None
        if causal:  # the new tokens are the last query_len positions
            mask = torch.ones(shape.query_len, shape.context, dtype=torch.bool, device=device).tril(
                shape.context - shape.query_len)
        return F.scaled_dot_product_attention(dense_query, keys, values, attn_mask=mask, scale=scale,
                                              enable_gqa=True)

    expected = run(reference)
    triton_ms = max_error = None
    if triton_ops is not None:
        max_error = (run(triton_ops).float() - expected.float()).abs().max().item()
        triton_ms = measure(lambda: run(triton_ops), device)
    kv_bytes = 2 * shape.batch * shape.context * shape.kv_heads * shape.head_dim * key_cache.element_size()
    return Row(shape.label, triton_ms, measure(lambda: run(reference), device), measure(contiguous, device),
               kv_bytes, max_error)


def _paged_inputs(shape: Shape, device: torch.device) -> tuple:
    """Random K/V scattered over shuffled physical blocks, plus the same K/V contiguous for the baseline."""
    dtype = DTYPES[shape.dtype]
    per_seq = math.ceil(shape.context / shape.block_size)
    num_blocks = shape.batch * per_seq
    key_cache = torch.randn(num_blocks, shape.block_size, shape.kv_heads, shape.head_dim, device=device,
                            dtype=dtype)
    value_cache = torch.randn_like(key_cache)
    tables = torch.randperm(num_blocks, device=device).view(shape.batch, per_seq).to(torch.int32)
    context_lens = torch.full((shape.batch,), shape.context, dtype=torch.int32, device=device)
    starts = torch.arange(shape.batch + 1, dtype=torch.int32, device=device) * shape.query_len
    query = torch.randn(shape.batch * shape.query_len, shape.heads, shape.head_dim, device=device, dtype=dtype)

    def contiguous(cache: torch.Tensor) -> torch.Tensor:  # [batch, kv_heads, context, head_dim]
        flat = cache[tables.long()].flatten(1, 2)[:, :shape.context]
        return flat.transpose(1, 2).contiguous()

    return (query, key_cache, value_cache, tables, context_lens, starts, contiguous(key_cache),
            contiguous(value_cache), 1.0 / math.sqrt(shape.head_dim))


def measure(fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds per call: ``triton.testing.do_bench`` on CUDA, a median of a few calls on the CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100)
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """GB/s of a plain device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = measure(lambda: dst.copy_(src), device)
    return 2 * nbytes / (ms * 1e6)


def engine_throughput(on_gpu: bool) -> list[str]:
    """Greedy generation through ``inference.LLM`` with each backend: tokens/s and whether outputs agree."""
    try:
        from inference import LLM, SamplingParams
    except ImportError as exc:
        return [f"engine throughput: skipped (inference not importable: {exc})"]
    prompts = [f"Write a short story about the number {i}." for i in range(64 if on_gpu else 2)]
    params = SamplingParams(temperature=0, max_tokens=128 if on_gpu else 4, ignore_eos=True)
    backends = ["triton", "torch"] if (on_gpu or _interpreting()) else ["torch"]
    notes, tokens = [], {}
    for backend in backends:
        try:
            llm = LLM(model="smollm2-135m-instruct", attention_backend=backend, max_model_len=1024,
                      gpu_memory_utilization=0.3)
            llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)  # warm up
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
        except Exception as exc:  # the model may be absent on a bare GPU machine: report, don't abort the bench
            notes.append(f"engine throughput ({backend}): skipped ({type(exc).__name__}: {exc})")
            continue
        tokens[backend] = [o.outputs[0].token_ids for o in outputs]
        generated = sum(len(t) for t in tokens[backend])
        notes.append(f"engine throughput ({backend}): {len(prompts)} prompts, {generated} tokens in {elapsed:.2f} s "
                     f"= {generated / elapsed:.1f} tok/s")
        del llm
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
    if len(tokens) == 2:
        same = sum(a == b for a, b in zip(tokens["triton"], tokens["torch"]))
        notes.append(f"engine greedy outputs identical across backends: {same}/{len(prompts)}")
    return notes


def print_table(rows: list[Row], copy_gbps: float, notes: list[str]) -> None:
    header = ["shape", "triton ms", "reference ms", "contig SDPA ms", "speedup", "triton GB/s", "% copy BW",
              "max err"]
    body = [row.cells(copy_gbps) for row in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    for note in notes:
        print(note)
    print()
    for line in [header, ["-" * w for w in widths], *body]:
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths)) + " |")


def _triton_ops(device: torch.device) -> ModuleType | None:
    if device.type != "cuda" and not _interpreting():
        return None
    try:
        return importlib.import_module("kernels.triton_kernels")
    except ImportError:
        return None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _fmt(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


if __name__ == "__main__":
    sys.exit(main())
