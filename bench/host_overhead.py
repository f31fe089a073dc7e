"""Host overhead: how long an engine step takes when the model's own arithmetic is tiny, ours against vLLM's
CPU backend, and where our step's time goes (issue 41).

A 135M model on a GPU spends almost all of a step in host-side Python; on a CPU its matmuls hide that. So this
bench takes a tiny random Llama (2 layers, 4 heads of 64 — vLLM's CPU attention wants head_dim 64 — hidden 256,
SmolLM2's tokenizer and vocabulary) and runs 256 sequences of 16-token prompts for 64 tokens each, all arriving
at once: ours and vLLM on the same model folder, one right after the other, in alternating order per round
(bench/vs_vllm.py does the pairing). Reported per round: each side's output tok/s, and the decode step at batch
256 (median wall time). Ours alone is also run with a timer around each part of `LLMEngine.step` — scheduling,
building the batch, the forward, the logits, sampling, and the rest (detokenising, stop checks, outputs) — so
the split says how much of a step is Python around the model.

    python -m bench.host_overhead --rounds 3 --out bench/results/41-host-overhead-float32.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from inference import LLMEngine, SamplingParams
from inference import engine as engine_module
from inference import model_runner
from inference.model_loader import build_folder, cache_dir
from bench import vs_vllm
from bench.engines import ours
from bench.engines.base import RunConfig
from bench.kv import KVGeometry
from bench.workloads import BenchRequest, Workload

SEQUENCES, PROMPT_TOKENS, OUTPUT_TOKENS = 256, 16, 64
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, head_dim=64, max_position_embeddings=512)
PHASES = ("schedule", "batch", "forward", "logits", "sample", "rest")


def tiny_model(folder: Path | None = None) -> Path:
    """The bench's random tiny Llama (seeded), saved once with SmolLM2's tokenizer; reused after."""
    folder = folder or cache_dir() / "bench" / "host-overhead-tiny-llama"
    return folder if (folder / "config.json").is_file() else build_folder(folder, _save_tiny_model)


def _save_tiny_model(folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from inference.model_loader import DEFAULT_MODEL, TOKENIZER_FILES, resolve_model

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=49152, tie_word_embeddings=True, **SHAPE)).eval()
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        (folder / name).write_bytes((resolve_model(DEFAULT_MODEL) / name).read_bytes())


def workload(sequences: int = SEQUENCES, prompt_tokens: int = PROMPT_TOKENS,
             output_tokens: int = OUTPUT_TOKENS, seed: int = 0) -> Workload:
    """`sequences` random prompts of `prompt_tokens` ids (distinct, so no prefix is shared), all at time 0."""
    rng = random.Random(seed)
    requests = [BenchRequest(f"host-{i}", [rng.randrange(1000, 40000) for _ in range(prompt_tokens)], output_tokens)
                for i in range(sequences)]
    return Workload("host_overhead", seed, requests, {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens})


def run_config(folder: Path, sequences: int = SEQUENCES, prompt_tokens: int = PROMPT_TOKENS,
               output_tokens: int = OUTPUT_TOKENS, dtype: str = "float32") -> RunConfig:
    """Room for every sequence at once, and a token budget that prefills them all in one step."""
    from transformers import AutoConfig

    per_seq = prompt_tokens + output_tokens + 32
    return RunConfig(model_path=folder, geometry=KVGeometry.from_hf_config(AutoConfig.from_pretrained(folder), dtype),
                     block_size=32, kv_budget_tokens=sequences * per_seq, max_model_len=256, max_num_seqs=sequences,
                     max_num_batched_tokens=max(2048, sequences * prompt_tokens), dtype=dtype)


class StepSplit:
    """Seconds spent in each part of `LLMEngine.step`, summed over steps, by timers around the functions each
    part is (installed with `timing`, removed after): the scheduler's `schedule`, `StepBatch.build`, the model's
    forward and `compute_logits`, the sampler's `sample`; "rest" is the step minus those."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0

    def per_step_ms(self) -> dict[str, float]:
        return {phase: 1000 * self.seconds[phase] / max(self.steps, 1) for phase in PHASES}

    def timed(self, phase: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - began
        return wrapper

    @contextmanager
    def timing(self, engine: LLMEngine) -> Iterator[None]:
        model = engine.runner.model
        patches = [(engine.scheduler, "schedule"), (model, "forward"), (model, "compute_logits")]
        saved = [(owner, name, owner.__dict__.get(name)) for owner, name in patches]
        build, sample, step = model_runner.StepBatch.__dict__["build"], engine_module.sample, engine.step
        phase = {"schedule": "schedule", "forward": "forward", "compute_logits": "logits"}
        for owner, name in patches:
            setattr(owner, name, self.timed(phase[name], getattr(owner, name)))
        model_runner.StepBatch.build = self.timed("batch", model_runner.StepBatch.build)
        engine_module.sample = self.timed("sample", sample)

        def counted_step():
            self.steps += 1
            return self.timed("step", step)()

        engine.step = counted_step
        try:
            yield
        finally:
            for owner, name, value in saved:
                if value is None:
                    delattr(owner, name)
                else:
                    setattr(owner, name, value)
            model_runner.StepBatch.build, engine_module.sample = build, sample
            del engine.step
            self.seconds["rest"] = self.seconds.pop("step", 0.0) - sum(self.seconds[p] for p in PHASES[:-1])


def split(engine: LLMEngine, task: Workload) -> dict[str, Any]:
    """Ours on `task` with the step timed part by part: ms per step of each part, and the steps taken."""
    timer = StepSplit()
    engine.reset_prefix_cache()
    params = {r.request_id: SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True)
              for r in task.requests}
    with timer.timing(engine):
        for r in task.requests:
            engine.add_request(r.request_id, {"prompt_token_ids": r.prompt_token_ids}, params[r.request_id])
        while engine.has_unfinished_requests():
            engine.step()
    per_step = timer.per_step_ms()
    return {"steps": timer.steps, "ms_per_step": per_step, "step_ms": sum(per_step.values()),
            "python_share": 1 - (per_step["forward"] + per_step["logits"]) / max(sum(per_step.values()), 1e-9)}


def measure(rounds: int, folder: Path | None = None, sequences: int = SEQUENCES, dtype: str = "float32",
            progress: bool = False) -> dict[str, Any]:
    """The whole record: ours against vLLM (vs_vllm's pairing, the workload and the decode step at `sequences`),
    then ours alone, split, once per round."""
    folder = tiny_model(folder)
    config = run_config(folder, sequences, dtype=dtype)
    task = workload(sequences)
    paired = vs_vllm.measure({"host_overhead": task}, config, batch=sequences, contexts=(PROMPT_TOKENS + 16,),
                             rounds=rounds, progress=progress)
    engine = ours.make_engine(config)
    splits = [split(engine, task) for _ in range(rounds)]
    return {"model": {"folder": str(folder), **SHAPE, "vocab_size": 49152}, "sequences": sequences,
            "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS, "dtype": dtype, "paired": paired,
            "ours_split": splits,
            "ours_split_median_step_ms": statistics.median(s["step_ms"] for s in splits)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.host_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sequences", type=int, default=SEQUENCES)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--out", type=Path, help="write the record here as JSON")
    args = p.parse_args(argv)
    record = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              **measure(args.rounds, sequences=args.sequences, dtype=args.dtype, progress=True)}
    text = json.dumps(record, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
