"""`python -m bench.lora`: decode throughput with 0, 1 and 4 LoRA adapters mixed, against the base model.

One seeded `chat` workload (EOS ignored, so every configuration generates the same tokens) runs on
- `base`: an engine without LoRA;
- `lora engine, 0 adapters`: an engine with `enable_lora=True` serving only base-model requests;
- `1 adapter`: every request under one adapter;
- `4 adapters mixed`: requests assigned round-robin to four adapters (one batch mixes all four).
The adapters are random rank-`--rank` PEFT folders adapting every projection, written to a temporary folder.
Configurations are interleaved over `--repeats` rounds (the median is reported), with the prefix cache reset
before each run, so a loaded machine's drift hits them alike. A second table times single decode steps of
the same batch (every request past its prefill; best and median of `--steps` steps), which the adapters'
per-step cost dominates less noisily than whole runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from inference import LLM, LoRARequest, SamplingParams
from bench import workloads
from inference.lora import TARGET_MODULES, module_shapes
from inference.model import ModelConfig
from inference.model_loader import DEFAULT_MODEL, resolve_model


def write_random_adapter(folder: Path, cfg: ModelConfig, rank: int, seed: int) -> None:
    """A PEFT-layout adapter adapting every projection, with small random A and B."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg.num_layers):
        for module, (in_features, out_features) in module_shapes(cfg).items():
            sublayer = TARGET_MODULES[module][0]
            prefix = f"base_model.model.model.layers.{layer}.{sublayer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features, generator=g) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank, generator=g) * 0.02
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGET_MODULES)}))


def decode_step_ms(llm: LLM, prompts: list[dict], loras: list[LoRARequest | None] | None,
                   steps: int) -> tuple[float, float]:
    """(best, median) milliseconds of one engine step once every request of the batch is decoding."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=steps + 64, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"decode-{i}", prompt, params, lora_request=None if loras is None else loras[i])
    while engine.scheduler.waiting or any(s.num_uncomputed_tokens > 1 for s in engine.scheduler.running):
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - start) * 1000)
    for i in range(len(prompts)):
        engine.abort_request(f"decode-{i}")
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-output", type=int, default=64)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    folder = resolve_model(DEFAULT_MODEL)
    cfg = ModelConfig.from_folder(folder)
    base = LLM(num_kv_blocks=1024)
    lora = LLM(num_kv_blocks=1024, enable_lora=True, max_loras=4, max_lora_rank=args.rank)
    spec = workloads.WorkloadSpec(args.requests, (20, 400), (16, args.max_output))
    workload = workloads.build("chat", base.get_tokenizer(), seed=0, spec=spec)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in workload.requests]
    params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True) for r in workload.requests]

    with tempfile.TemporaryDirectory() as tmp:
        adapters = []
        for i in range(4):
            write_random_adapter(Path(tmp) / f"adapter{i}", cfg, args.rank, seed=i)
            adapters.append(LoRARequest(f"adapter{i}", i + 1, str(Path(tmp) / f"adapter{i}")))
        n = len(prompts)
        configs = {
            "base": (base, None),
            "lora engine, 0 adapters": (lora, [None] * n),
            "1 adapter": (lora, [adapters[0]] * n),
            "4 adapters mixed": (lora, [adapters[i % 4] for i in range(n)]),
        }
        for llm, loras in configs.values():  # warm up (and load adapters into the host cache)
            llm.generate(prompts[:2], params[:2], use_tqdm=False, lora_request=None if loras is None else loras[:2])
        times: dict[str, list[float]] = {name: [] for name in configs}
        for _ in range(args.repeats):
            for name, (llm, loras) in configs.items():
                llm.reset_prefix_cache()
                start = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
                times[name].append(time.perf_counter() - start)
        steps = {name: decode_step_ms(llm, prompts, loras, args.steps) for name, (llm, loras) in configs.items()}

    tokens = workload.total_output_tokens
    base_tps = tokens / statistics.median(times["base"])
    print(f"{n} chat requests, {tokens} output tokens, rank {args.rank}, {args.repeats} rounds, "
          f"{torch.get_num_threads()} torch threads")
    print("| configuration | median s | output tok/s | vs base |")
    print("|---|---|---|---|")
    for name, runs in times.items():
        tps = tokens / statistics.median(runs)
        print(f"| {name} | {statistics.median(runs):.2f} | {tps:.1f} | {tps / base_tps:.2f}x |")
    print(f"\none decode step of the {n} requests, {args.steps} steps")
    print("| configuration | best ms | median ms | best vs base |")
    print("|---|---|---|---|")
    for name, (best, median) in steps.items():
        print(f"| {name} | {best:.1f} | {median:.1f} | {steps['base'][0] / best:.2f}x |")


if __name__ == "__main__":
    main()
