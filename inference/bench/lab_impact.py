"""`python -m inference.bench.lab_impact`: how much a lab stepping beside a live engine slows the live batch.

The live engine serves a fixed chat-like workload (all requests at t=0, greedy, EOS ignored) while, in
another thread, a lab sandbox sharing its weights plays scenarios at the page's fastest speed (5 steps a
second), the way playground/serving/worker/lab_host.py runs it (at the lowest CPU priority). Runs with and
without the lab alternate (A B A B ...), so drift on a noisy machine hits both; the figure is the ratio of
the live engine's output tokens per second, median over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from inference import LLM, SamplingParams
from inference.lab import yield_to_live_work
from inference.lab_scenarios import SCENARIOS, ScenarioRun


def live_throughput(llm: LLM, prompts: list[str], max_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)


def play_labs(shared, stop: threading.Event, steps_per_s: float, counter: list[int]) -> None:
    """Play every scenario over and over at `steps_per_s` until `stop` (the lab page's Play button)."""
    yield_to_live_work()
    while not stop.is_set():
        for scenario in SCENARIOS:
            run = ScenarioRun.start(scenario.name, shared=shared)
            while not run.finished and not stop.is_set():
                began = time.perf_counter()
                run.step()
                counter[0] += 1
                stop.wait(max(0.0, 1 / steps_per_s - (time.perf_counter() - began)))
            if stop.is_set():
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps-per-s", type=float, default=5.0)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    llm = LLM(dtype=args.dtype, max_num_seqs=args.requests)
    question = "explain in a few sentences why the sky looks blue at noon."
    prompts = [f"User {i} asks: {question}" for i in range(args.requests)]
    live_throughput(llm, prompts[:4], 8)  # warm up
    alone, beside, lab_steps = [], [], []
    for _ in range(args.rounds):
        alone.append(live_throughput(llm, prompts, args.max_tokens))
        stop, counter = threading.Event(), [0]
        lab = threading.Thread(target=play_labs, args=(llm.llm_engine, stop, args.steps_per_s, counter))
        lab.start()
        time.sleep(1.0)  # the lab is stepping before the live batch starts
        beside.append(live_throughput(llm, prompts, args.max_tokens))
        stop.set()
        lab.join()
        lab_steps.append(counter[0])
    ratio = statistics.median(b / a for a, b in zip(alone, beside))
    print(f"live tok/s alone:       {[round(x, 1) for x in alone]}")
    print(f"live tok/s beside labs: {[round(x, 1) for x in beside]} (lab steps per round: {lab_steps})")
    print(f"ratio beside/alone (median of {args.rounds} rounds): {ratio:.3f}  -> slowdown {100 * (1 - ratio):.1f}%")


if __name__ == "__main__":
    main()
