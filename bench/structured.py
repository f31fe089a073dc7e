"""`python -m bench.structured`: what the grammar mask costs, measured as ratios in one run.

1. Schema compile time: each schema compiled cold (a fresh `StructuredOutputManager`, so nothing is
   cached), and the cost of a cache hit.
2. Throughput: a batch of chat requests, each constrained by one of the schemas, against the same batch
   unconstrained. The unconstrained twin of each request is made to generate exactly as many tokens as the
   constrained one did (`max_tokens` = its length, `ignore_eos`), so both runs do the same model work and
   the difference is the mask: filling each row's bitmask, applying it, advancing the matchers. The two
   runs alternate `--rounds` times; the medians are compared. Grammars are compiled before timing.
3. The mask's own time: during the masked runs, the seconds spent building masks (`token_mask`: each row's
   bitmask, unpacked) and advancing matchers (`accept`), as a share of the whole run. This share is the
   least noisy figure on a loaded machine, since both parts are timed in the same steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

from inference import LLM, SamplingParams
from inference.sampling_params import StructuredOutputsParams
from inference.structured_outputs import StructuredOutputManager

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"]}},
        "required": ["name", "age", "address"]},
    "groceries": {"type": "array", "items": {"type": "object", "properties": {
        "item": {"type": "string", "maxLength": 16}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["item", "qty"]}, "minItems": 1, "maxItems": 4},
    "weather": {"type": "object", "properties": {
        "celsius": {"type": "number", "minimum": -50, "maximum": 60},
        "sky": {"enum": ["clear", "cloudy", "rain", "snow"]}, "wind_kmh": {"type": "integer", "minimum": 0}},
        "required": ["celsius", "sky", "wind_kmh"]},
    "film": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40}, "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "action", "horror"]}, "maxItems": 3}},
        "required": ["title", "year", "genres"]},
}
PROMPTS = {
    "person": "Make up a person and give their name, age and address as JSON.",
    "groceries": "List some groceries with quantities as JSON.",
    "weather": "Report the weather in Oslo today as JSON.",
    "film": "Describe a famous film as JSON.",
}


def compile_times(llm: LLM) -> dict[str, float]:
    """Seconds to compile each schema from nothing, then one cache hit (milliseconds would show)."""
    engine = llm.llm_engine
    manager = StructuredOutputManager(engine.tokenizer, engine.runner.cfg.vocab_size)
    times = {}
    for name, schema in SCHEMAS.items():
        start = time.perf_counter()
        manager.request_grammar(StructuredOutputsParams(json=schema)).result()
        times[name] = time.perf_counter() - start
    start = time.perf_counter()
    manager.request_grammar(StructuredOutputsParams(json=SCHEMAS["person"])).result()
    times["cache hit"] = time.perf_counter() - start
    manager.shutdown()
    return times


class Stopwatch:
    """Wraps functions to add up the seconds spent in them."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


def run(llm: LLM, prompts: list[dict], params: list[SamplingParams]) -> tuple[float, list[int]]:
    """Wall seconds of one batch, and each request's generated token count."""
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed, [len(o.outputs[0].token_ids) for o in outputs]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.8)
    args = parser.parse_args(argv)

    llm = LLM(num_kv_blocks=512)
    compiled = compile_times(llm)
    print(f"compile seconds: {json.dumps({k: round(v, 4) for k, v in compiled.items()})}", file=sys.stderr)
    names = [list(SCHEMAS)[i % len(SCHEMAS)] for i in range(args.requests)]
    prompts = [{"prompt_token_ids": llm.encode_chat([{"role": "user", "content": PROMPTS[n]}]), "prompt": None}
               for n in names]
    masked = [SamplingParams(temperature=args.temperature, seed=i, max_tokens=args.max_tokens,
                             structured_outputs=StructuredOutputsParams(json=SCHEMAS[n])) for i, n in enumerate(names)]
    run(llm, prompts[: len(SCHEMAS)], masked[: len(SCHEMAS)])  # warm up; compiles every grammar
    _, lengths = run(llm, prompts, masked)
    free = [SamplingParams(temperature=args.temperature, seed=i, max_tokens=n, ignore_eos=True)
            for i, n in enumerate(lengths)]
    manager = llm.llm_engine.structured
    mask_time = Stopwatch()
    manager.token_mask, manager.accept = mask_time.wrap(manager.token_mask), mask_time.wrap(manager.accept)
    times = {"masked": [], "unmasked": []}
    for r in range(args.rounds):
        times["masked"].append(run(llm, prompts, masked)[0])
        times["unmasked"].append(run(llm, prompts, free)[0])
        print(f"round {r + 1}: {times['masked'][-1]:.1f} s masked, {times['unmasked'][-1]:.1f} s unmasked, "
              f"{mask_time.seconds:.2f} s in the mask so far, {sum(lengths)} tokens a run", file=sys.stderr)
    tokens = sum(lengths)
    rates = {k: tokens / statistics.median(v) for k, v in times.items()}
    result = {
        "requests": args.requests, "generated_tokens": tokens, "rounds": args.rounds,
        "tokens_per_s": {k: round(v, 1) for k, v in rates.items()},
        "ratio_masked_over_unmasked": round(rates["masked"] / rates["unmasked"], 3),
        "mask_share_of_masked_runs": round(mask_time.seconds / sum(times["masked"]), 4),
        "mask_ms_per_generated_token": round(1000 * mask_time.seconds / (tokens * args.rounds), 3),
        "compile_s": {k: round(v, 4) for k, v in compiled.items()},
        "batch_seconds": {k: [round(t, 2) for t in v] for k, v in times.items()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
