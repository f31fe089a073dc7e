"""`python -m bench.lab_impact`: how much a lab stepping beside a live engine slows the live batch.

A StreamingEngine (a worker's engine loop) serves a fixed chat-like workload (all requests at t=0, greedy,
EOS ignored) while another thread plays lab scenarios at the page's fastest speed (5 steps a second) in
sandboxes sharing its weights, each step handed to the loop as a background call — the way
playground/serving/worker/lab_host.py runs labs. Runs with and without the lab alternate (A B A B ...), so
drift on a noisy machine hits both; the figure is the ratio of the live batch's output tokens per second,
median over the rounds. The lab steps a busy loop let through are counted too: they are what a presenter
sees while the worker is busy.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from inference import SamplingParams, StreamingEngine
from inference.lab_scenarios import SCENARIOS, ScenarioRun


def live_throughput(engine: StreamingEngine, prompts: list[str], max_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    streams = [engine.add_request(p, params) for p in prompts]
    tokens = 0
    for stream in streams:
        for delta in stream:
            tokens += len(delta.token_ids)
    return tokens / (time.perf_counter() - start)


def play_labs(engine: StreamingEngine, stop: threading.Event, steps_per_s: float, counter: list[int]) -> None:
    """Play every scenario over and over at `steps_per_s` until `stop` (the lab page's Play button)."""
    while not stop.is_set():
        for scenario in SCENARIOS:
            run = engine.call_in_background(lambda shared: ScenarioRun.start(scenario.name, shared=shared)).result()
            while not run.finished and not stop.is_set():
                began = time.perf_counter()
                engine.call_in_background(lambda _: run.step()).result()
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
    engine = StreamingEngine(dtype=args.dtype, max_num_seqs=args.requests)
    engine.start()
    question = "explain in a few sentences why the sky looks blue at noon."
    prompts = [f"User {i} asks: {question}" for i in range(args.requests)]
    live_throughput(engine, prompts[:4], 8)  # warm up
    alone, beside, lab_steps = [], [], []
    for _ in range(args.rounds):
        alone.append(live_throughput(engine, prompts, args.max_tokens))
        stop, counter = threading.Event(), [0]
        lab = threading.Thread(target=play_labs, args=(engine, stop, args.steps_per_s, counter))
        lab.start()
        time.sleep(1.0)  # the lab is stepping before the live batch starts
        counter[0] = 0
        beside.append(live_throughput(engine, prompts, args.max_tokens))
        lab_steps.append(counter[0])
        stop.set()
        lab.join()
    engine.shutdown()
    ratio = statistics.median(b / a for a, b in zip(alone, beside))
    print(f"live tok/s alone:       {[round(x, 1) for x in alone]}")
    print(f"live tok/s beside labs: {[round(x, 1) for x in beside]} "
          f"(lab steps while the batch ran, per round: {lab_steps})")
    print(f"ratio beside/alone (median of {args.rounds} rounds): {ratio:.3f}  -> slowdown {100 * (1 - ratio):.1f}%")


if __name__ == "__main__":
    main()
