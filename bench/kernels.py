"""The kernels' GPU check: ``python -m bench.kernels`` (a minute or two on one GPU).

On CUDA it (1) runs the kernel tests on the GPU, (2) times paged decode attention (batch 64 x context 4096
and a few other shapes) and one varlen prefill with ``triton.testing.do_bench`` against the torch reference
(a block gather, then batched matmuls for decode or one SDPA per sequence for prefill) and SDPA over a
contiguous cache holding the same data, (3) reports achieved bandwidth (K/V bytes read / time) against the
measured device-to-device copy bandwidth, and prints the table last. The whole GPU run, with the engine's
oracle and throughput on the device, is ``python -m bench.gpu_suite``, which calls this.

Without CUDA (or with ``--cpu-smoke``) it runs the same pipeline on tiny shapes, timing with
``time.perf_counter``; Triton then runs only under ``TRITON_INTERPRET=1``. The kernel tests exercise this path.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
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

    @property
    def triton_gbps(self) -> float | None:
        """K/V bytes the Triton kernel read per second (GB/s)."""
        return self.kv_bytes / (self.triton_ms * 1e6) if self.triton_ms else None

    def as_dict(self, copy_gbps: float) -> dict:
        """The row with its derived figures, for the GPU suite's JSON."""
        gbps = self.triton_gbps
        return {**asdict(self), "triton_gbps": gbps, "share_of_copy_bandwidth": gbps and gbps / copy_gbps,
                "speedup_vs_reference": self.triton_ms and self.reference_ms / self.triton_ms,
                "speedup_vs_contiguous_sdpa": self.triton_ms and self.contiguous_ms / self.triton_ms}

    def cells(self, copy_gbps: float) -> list[str]:
        gbps = self.triton_gbps
        return [self.label, _fmt(self.triton_ms, "{:.3f}"), f"{self.reference_ms:.3f}", f"{self.contiguous_ms:.3f}",
                _fmt(self.triton_ms and self.reference_ms / self.triton_ms, "{:.1f}x"), _fmt(gbps, "{:.0f}"),
                _fmt(gbps and 100 * gbps / copy_gbps, "{:.0f}%"), _fmt(self.max_error, "{:.1e}")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (automatic without CUDA)")
    parser.add_argument("--skip-tests", action="store_true", help="do not run the kernel tests first")
    parser.add_argument("--full-tests", action="store_true", help="also run the tests marked slow")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available() and not args.cpu_smoke
    started = time.perf_counter()
    notes = [f"device: {torch.cuda.get_device_name() if on_gpu else 'cpu (smoke run, tiny shapes)'}"]
    if not args.skip_tests:
        notes.append(run_kernel_tests(on_gpu, args.full_tests).line)
    rows, copy_gbps, note = attention_table(on_gpu)
    notes += [*note, f"measured device-to-device copy bandwidth: {copy_gbps:.0f} GB/s (bytes read + written)",
              f"total bench time: {time.perf_counter() - started:.0f} s"]
    print_table(rows, copy_gbps, notes)
    return 0


def attention_table(on_gpu: bool) -> tuple[list[Row], float, list[str]]:
    """Every shape of the device's list timed (`bench_attention`), the copy bandwidth, and a note where Triton
    could not run."""
    device = torch.device("cuda" if on_gpu else "cpu")
    triton_ops = _triton_ops(device)
    notes = [] if triton_ops else ["triton: not run (needs CUDA, or TRITON_INTERPRET=1 on the CPU)"]
    copy_gbps = copy_bandwidth(device, (1 << 30) if on_gpu else (1 << 22))
    rows = [bench_attention(shape, device, triton_ops) for shape in (GPU_SHAPES if on_gpu else CPU_SHAPES)]
    return rows, copy_gbps, notes


@dataclass
class KernelTestRun:
    """The kernel tests' outcome: where they ran, pytest's exit code and its last line (the counts)."""

    where: str
    returncode: int
    summary: str

    @property
    def line(self) -> str:
        return f"kernel tests ({self.where}): {self.summary}"


def run_kernel_tests(on_gpu: bool, full: bool, timeout_s: float = 900) -> KernelTestRun:
    """The kernel tests in a subprocess: compiled on the GPU (TRITON_INTERPRET=0), interpreted on the CPU.

    On the GPU, pytest-xdist (where installed) spreads them over 8 workers: compiling each test's kernel
    variants is most of their time there, and compiles run on the host's cores. Past `timeout_s` the run is
    stopped and reported as such (a GPU lease is minutes long; the figures after the tests still matter)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "0" if on_gpu else "1", "PYTHONPATH": path}
    tests = REPO / "tests" / "kernels"
    command = [sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider",
               *([] if full else ["-m", "not slow"])]
    if on_gpu and importlib.util.find_spec("xdist") is not None:
        command += ["-n", "8"]
    where = "GPU" if on_gpu else "CPU interpreter"
    try:
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        print(exc.stdout[-6000:] if isinstance(exc.stdout, str) else (exc.stdout or b"")[-6000:].decode())
        return KernelTestRun(where, -1, f"stopped after {timeout_s:.0f} s")
    summary = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    if result.returncode != 0:
        print(result.stdout[-6000:], result.stderr[-2000:], sep="\n")
    return KernelTestRun(where, result.returncode, summary)


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
    if device.type != "cuda" and not interpreting():
        return None
    try:
        return importlib.import_module("kernels.triton_kernels")
    except ImportError:
        return None


def interpreting() -> bool:
    """Whether Triton runs through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _fmt(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


if __name__ == "__main__":
    sys.exit(main())
