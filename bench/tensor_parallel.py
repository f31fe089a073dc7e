"""`python -m bench.tensor_parallel`: decode step time and tok/s at several tensor-parallel sizes,
with the time rank 0 spends in collectives measured apart.

For each size a fresh engine holds `--batch` sequences of `--prompt-len` seeded random tokens past their
prefill; `--steps` decode steps are timed one by one (median reported), and rank 0's time inside the
all-reduces, the logits' gather and the step's broadcast (`Group.seconds`) is read around each step. That
time includes waiting for the slowest rank, so on an oversubscribed CPU it holds the ranks' imbalance too.
On CPU every rank (rank 0 included) runs `cpu_threads_per_rank(N)` torch threads.

    python -m bench.tensor_parallel --tp 1,3                          # CPU, gloo
    python -m bench.tensor_parallel --device cuda --dtype bfloat16 \\
        --model /models/Llama-3.2-1B-Instruct --tp 1,2,4                         # CUDA, NCCL

SmolLM2 (the default model: 9 query / 3 KV heads) splits over 1 or 3 ranks only; for 2, 4 or 8 GPUs pass a
local Llama-family folder whose head counts they divide (Llama 3.2 1B: 32 / 8 heads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from inference import LLM, SamplingParams
from inference.model_loader import DEFAULT_MODEL
from inference.parallel.ranks import cpu_threads_per_rank


def measure(size: int, args: argparse.Namespace) -> dict[str, Any]:
    """One engine of `size` ranks: its median decode step, tok/s and rank 0's time in collectives."""
    threads = torch.get_num_threads()
    if args.device == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(size))
    try:
        return _measure(size, args)
    finally:
        torch.set_num_threads(threads)


def _measure(size: int, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    with LLM(model=args.model, device=args.device, dtype=args.dtype, tensor_parallel_size=size,
             num_kv_blocks=args.kv_blocks, max_model_len=args.prompt_len + args.steps + 16,
             max_num_seqs=args.batch, enable_prefix_caching=False) as llm:
        start_s = time.perf_counter() - started
        engine, group = llm.llm_engine, llm.llm_engine.runner.group
        vocab = engine.runner.cfg.vocab_size
        llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        g = torch.Generator().manual_seed(0)
        params = SamplingParams(temperature=0, max_tokens=args.steps + 2, ignore_eos=True)
        for i in range(args.batch):
            ids = torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist()
            engine.add_request(f"decode-{i}", {"prompt_token_ids": ids}, params)
        while any(s.num_computed_tokens < s.num_prompt_tokens for r in engine.requests.values() for s in r.seqs):
            engine.step()  # the prefills
        steps, comm = [], []
        totals = dict(group.seconds)
        for _ in range(args.steps):
            before = sum(group.seconds.values())
            start = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - start)
            comm.append(sum(group.seconds.values()) - before)
        for request_id in list(engine.requests):
            engine.abort_request(request_id)
        step_s, comm_s = statistics.median(steps), statistics.median(comm)
        return {
            "tensor_parallel_size": size,
            "start_s": start_s,
            "step_ms": step_s * 1000,
            "tok_per_s": args.batch / step_s,
            "comm_ms": comm_s * 1000,
            "comm_share": comm_s / step_s,
            # Mean ms per step in each kind of collective (all_reduce, gather, broadcast).
            "comm_ms_by_kind": {kind: (seconds - totals.get(kind, 0.0)) * 1000 / args.steps
                                for kind, seconds in group.seconds.items()},
            "threads_per_rank": torch.get_num_threads(),
            "kv_pool_bytes_per_rank": engine.metrics(block_map=False)["kv_pool_bytes_per_rank"],
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tensor_parallel",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--tp", default="1,3", help="comma-separated tensor-parallel sizes")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batch", type=int, default=8, help="sequences decoding together")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="decode steps timed")
    parser.add_argument("--kv-blocks", type=int, default=256)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    results = [measure(int(size), args) for size in args.tp.split(",")]
    if args.json:
        print(json.dumps({"config": vars(args), "results": results}, indent=2))
        return
    print(f"{args.model} on {args.device}, batch {args.batch} x {args.prompt_len}-token prompts, "
          f"median of {args.steps} decode steps")
    print("| TP | threads/rank | start s | step ms | tok/s | in collectives (rank 0) ms | share | by kind ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        kinds = ", ".join(f"{kind} {ms:.1f}" for kind, ms in sorted(r["comm_ms_by_kind"].items())) or "-"
        print(f"| {r['tensor_parallel_size']} | {r['threads_per_rank']} | {r['start_s']:.1f} | {r['step_ms']:.1f} "
              f"| {r['tok_per_s']:.1f} | {r['comm_ms']:.1f} | {r['comm_share']:.0%} | {kinds} |")


if __name__ == "__main__":
    main()
