"""`python -m bench`: our engine against HF transformers (static and continuous batching),
llama.cpp and vLLM's CPU backend (when installed: `bench/peers/setup_*.sh`) on the same seeded
workloads in one run, plus the sharing, fixed-budget, roofline and decode-step experiments. `--json` prints one JSON object; `--plot DIR` writes PNGs; `--quick` is a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer

from bench import experiments, plots, quantization, report, roofline, vs_vllm, workloads
from bench.engines import hf_continuous, hf_static, llamacpp, llamacpp_server, ours
from bench.engines.base import EngineRun, RunConfig
from bench.kv import KVGeometry
from inference.model_loader import DEFAULT_MODEL, resolve_model

ENGINES = ("ours", "hf_static", "hf_static_maxlen", "hf_continuous", "llamacpp", "llamacpp_server")
EXPERIMENTS = ("roofline", "prefix-caching", "parallel", "beam", "long", "quantization", "vs-vllm")
# The shared-prefix experiment needs staggered arrivals: requests admitted in the same step as the first
# one cannot hit blocks that are not computed yet, and a playground's users do not arrive all at once.
SHARED_PREFIX_RATE = {"full": 1.0, "quick": 4.0}
# Decode-step batch and contexts of the vs-vLLM experiment (the figures; tiny in the smoke run).
DECODE_STEP_SHAPES = {"full": (32, (128, 1024)), "quick": (4, (32, 96))}


@dataclass(frozen=True)
class Mode:
    """Sizes of one benchmark mode: the issue's full workloads, or the one-minute smoke run."""

    name: str
    specs: dict[str, workloads.WorkloadSpec]
    kv_blocks: int
    max_model_len: int
    roofline_batches: tuple[int, ...]
    roofline_steps: int


FULL = Mode("full", workloads.FULL_SPECS, kv_blocks=1024, max_model_len=2048, roofline_batches=roofline.BATCHES,
            roofline_steps=4)
QUICK = Mode("quick", workloads.QUICK_SPECS, kv_blocks=256, max_model_len=512, roofline_batches=(1, 4),
             roofline_steps=2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="one-minute smoke run: tiny workloads, few tokens")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    p.add_argument("--plot", type=Path, metavar="DIR", help="write PNG figures into DIR")
    p.add_argument("--workloads", type=Path, metavar="DIR",
                   help="load workloads from DIR/<kind>.jsonl when present, else build and save them there")
    p.add_argument("--engines", default=",".join(ENGINES),
                   help=f"chat-workload engines: comma-separated subset of {', '.join(ENGINES)}, or 'none'")
    p.add_argument("--experiments", default=",".join(EXPERIMENTS),
                   help=f"comma-separated subset of {', '.join(EXPERIMENTS)}, or 'none'")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arrival", choices=("all", "poisson"), default="all", help="chat workload arrivals")
    p.add_argument("--rate", type=float, help="requests/s for --arrival poisson")
    p.add_argument("--kv-blocks", type=int, help="shared KV budget in blocks (default 1024, quick 256)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, help="default 2048 (quick 512)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--out", type=Path, metavar="JSON",
                   help="also write the result object here, after every stage (a crash keeps what finished)")
    p.add_argument("--vllm-rounds", type=int, default=1, metavar="N",
                   help="vs-vllm: N rounds, each task on both engines back to back (who goes first alternates); "
                        "the report gives the medians and every round's ratio")
    p.add_argument("--chat-max-output", type=int, help="longest chat output (default 128, the issue's upper "
                   "bound is 256: costly on 2 shared cores)")
    p.add_argument("--chat-requests", type=int, help="number of chat requests (default 64; the llama.cpp "
                   "target is stated at 16 concurrent requests)")
    p.add_argument("--quant-decode-tokens", type=int, metavar="N",
                   help="tokens per sequence of the quantization experiment's batch-1 and batch-64 decode runs "
                        f"(default {quantization.DECODE_TOKENS}, quick 8)")
    p.add_argument("--quant-variants", default=",".join(quantization.VARIANTS), metavar="NAMES",
                   help=f"the quantization experiment's formats, a subset of {', '.join(quantization.VARIANTS)} "
                        "(fp32, the reference, always runs)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="precision of ours and the HF engines (llama.cpp runs its GGUF's own weights)")
    p.add_argument("--report", type=Path, metavar="JSON",
                   help="print the text report of a saved --json result instead of running anything")
    args = p.parse_args(argv)
    args.engine_list = _choices(p, "engine", args.engines, ENGINES)
    args.experiment_list = _choices(p, "experiment", args.experiments, EXPERIMENTS)
    args.quant_variant_list = _choices(p, "quantization variant", args.quant_variants, tuple(quantization.VARIANTS))
    if args.arrival == "poisson" and (args.rate is None or args.rate <= 0):
        p.error("--arrival poisson needs a positive --rate")
    if args.vllm_rounds < 1:
        p.error("--vllm-rounds needs at least one round")
    return args


def _choices(parser: argparse.ArgumentParser, what: str, given: str, allowed: tuple[str, ...]) -> list[str]:
    chosen = [] if given.strip() == "none" else [x.strip() for x in given.split(",") if x.strip()]
    unknown = set(chosen) - set(allowed)
    if unknown:
        parser.error(f"unknown {what}(s) {', '.join(sorted(unknown))}; choose from {', '.join(allowed)} or 'none'")
    return chosen


def load_or_build(kind: str, args: argparse.Namespace, mode: Mode, tokenizer: Any,
                  spec: workloads.WorkloadSpec | None = None, **kwargs: Any) -> workloads.Workload:
    arrival = "" if kwargs.get("arrival", "all") == "all" else f"-{kwargs['arrival']}"
    path = args.workloads / f"{kind}{arrival}{'-quick' if mode is QUICK else ''}.jsonl" if args.workloads else None
    if path is not None and path.is_file():
        return workloads.load(path)
    workload = workloads.build(kind, tokenizer, seed=args.seed, spec=spec or mode.specs[kind],
                               max_model_len=args.max_model_len, **kwargs)
    if path is not None:
        workloads.save(workload, path)
    return workload


class Stages:
    """Wall seconds per benchmark stage (model loading included) and the machine's load average when it
    ended: on a shared machine, a ratio between two stages is only as fair as their loads were equal."""

    def __init__(self, on_done: Callable[[], None]) -> None:
        self.seconds: dict[str, float] = {}
        self.load: dict[str, float] = {}
        self.on_done = on_done

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - start
            self.load[name] = os.getloadavg()[1]  # 5-minute average
            print(f"[bench] {name}: {self.seconds[name]:.0f} s, load {self.load[name]:.1f}", file=sys.stderr,
                  flush=True)
            self.on_done()


def run_engines(chat: workloads.Workload, config: RunConfig, names: list[str], progress: bool, stages: Stages,
                result: dict[str, Any]) -> dict[str, EngineRun]:
    """Every requested engine on the chat workload, one after the other, each with its own model copy; each
    engine's figures go into result["engines"] (or a note into result["skipped"]) as soon as it is done."""
    runs = {}
    for name in names:
        if name == "llamacpp" and not llamacpp.available():
            result["skipped"][name] = llamacpp.unavailable_reason()
            continue
        if name == "hf_continuous" and not hf_continuous.available():
            result["skipped"][name] = "this transformers version has no continuous batching"
            continue
        if name == "llamacpp_server":  # one run per slot count; the issue compares against the best
            if not llamacpp_server.available():
                result["skipped"][name] = llamacpp_server.unavailable_reason()
                continue
            for slots in llamacpp_server.SLOT_COUNTS:
                with stages.time(f"chat:{name}_np{slots}"):
                    served = llamacpp_server.run(chat, config, slots, progress=progress)
                    runs[served.engine] = served
                    result["engines"][served.engine] = served.figures(config)
            continue
        runner = {"ours": ours.run, "hf_static": hf_static.run, "hf_static_maxlen": hf_static.run_max_length,
                  "hf_continuous": hf_continuous.run, "llamacpp": llamacpp.run}[name]
        with stages.time(f"chat:{name}"):
            runs[name] = runner(chat, config, progress=progress)
            result["engines"][name] = runs[name].figures(config)
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        print(report.text_report(json.loads(args.report.read_text())))
        return 0
    mode = QUICK if args.quick else FULL
    progress = not args.quick
    began = time.time()
    model_path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    geometry = KVGeometry.from_hf_config(AutoConfig.from_pretrained(model_path), args.dtype)
    kv_blocks = args.kv_blocks or mode.kv_blocks
    args.max_model_len = args.max_model_len or mode.max_model_len
    config = RunConfig(model_path=model_path, geometry=geometry, block_size=args.block_size,
                       kv_budget_tokens=kv_blocks * args.block_size, max_model_len=args.max_model_len,
                       max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                       seed=args.seed, dtype=args.dtype)
    spec = mode.specs["chat"]
    if args.chat_max_output:
        spec = replace(spec, output_tokens=(min(spec.output_tokens[0], args.chat_max_output), args.chat_max_output))
    if args.chat_requests:
        spec = replace(spec, num_requests=args.chat_requests)
    chat = load_or_build("chat", args, mode, tokenizer, spec=spec, arrival=args.arrival, rate=args.rate)
    result: dict[str, Any] = {
        "mode": mode.name,
        "machine": machine(),
        "config": {"model": args.model, "dtype": args.dtype, "kv_budget_tokens": config.kv_budget_tokens, "block_size": config.block_size,
                   "max_model_len": config.max_model_len, "max_num_seqs": config.max_num_seqs,
                   "max_num_batched_tokens": config.max_num_batched_tokens, "seed": args.seed,
                   "kv_bytes_per_token": geometry.bytes_per_token},
        "workload": {"kind": chat.kind, "num_requests": len(chat.requests), "output_tokens": chat.total_output_tokens,
                     "prompt_tokens": sum(r.num_prompt_tokens for r in chat.requests), "arrival": args.arrival,
                     "rate": args.rate, "padded_row_len": chat.padded_row_len,
                     "output_range": [min(r.max_tokens for r in chat.requests), max(r.max_tokens for r in chat.requests)]},
        "engines": {},
        "skipped": {},
    }
    stages = Stages(on_done=lambda: _save(args.out, result, stages, began))
    runs = run_engines(chat, config, args.engine_list, progress, stages, result)
    result["ratios"] = report.ratios(result["engines"])
    result["fixed_budget"] = experiments.fixed_budget(chat, config, runs)
    run_experiments(args, mode, config, tokenizer, progress, stages, result, chat)
    result["targets"] = [t.__dict__ for t in report.targets(result)]
    if args.plot:
        result["plots"] = [str(p) for p in plots.write_all(args.plot, result, runs, geometry.bytes_per_token)]
    _save(args.out, result, stages, began)
    if args.json:
        print(json.dumps(result, default=_json_default))
    else:
        print(report.text_report(result))
    return 0


def _save(path: Path | None, result: dict[str, Any], stages: Stages, began: float) -> None:
    """Stamp the stage timings into `result` and, with --out, write it (after every stage and at the end)."""
    result["stage_s"] = stages.seconds
    result["stage_load_avg_5min"] = stages.load
    result["elapsed_s"] = time.time() - began
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, default=_json_default, indent=1))


def run_experiments(args: argparse.Namespace, mode: Mode, config: RunConfig, tokenizer: Any, progress: bool,
                    stages: Stages, out: dict[str, Any], chat: workloads.Workload) -> None:
    """Roofline, prefix caching on/off, n=4 sharing, beam sharing, long prompts (ours, plus HF for the
    roof), the weight formats on the chat workload, and ours vs vLLM CPU, each added to `out` as soon as it
    is done."""
    todo = args.experiment_list
    if "quantization" in todo:
        with stages.time("quantization"):
            decode_tokens = args.quant_decode_tokens or (8 if mode is QUICK else quantization.DECODE_TOKENS)
            # The smoke run checks the column's plumbing on two formats.
            names = ("fp32", "int4") if mode is QUICK else tuple(args.quant_variant_list)
            out["quantization"] = quantization.measure(chat, config, names, decode_tokens, progress)
    if "roofline" in todo:
        with stages.time("roofline"):
            hf_model = hf_static.load_model(config) if "hf_static" in args.engine_list else None
            out["roofline"] = roofline.measure(ours.make_engine(config), hf_model, config.model_path,
                                               mode.roofline_batches, mode.roofline_steps)
            del hf_model
    if "prefix-caching" in todo:
        with stages.time("prefix_caching"):
            shared = load_or_build("shared-prefix", args, mode, tokenizer, arrival="poisson",
                                   rate=SHARED_PREFIX_RATE[mode.name])
            out["prefix_caching"] = experiments.prefix_caching(shared, config, progress)
    if "parallel" in todo:
        with stages.time("parallel_sharing"):
            parallel = load_or_build("parallel", args, mode, tokenizer)
            out["parallel_sharing"] = experiments.parallel_sharing(parallel, config, progress)
    if "beam" in todo:
        with stages.time("beam_sharing"):
            out["beam_sharing"] = experiments.beam_sharing(load_or_build("beam", args, mode, tokenizer), config)
    if "long" in todo:
        with stages.time("long"):
            long = load_or_build("long", args, mode, tokenizer)
            out["long"] = ours.run(long, config, progress=progress).figures(config)
    if "vs-vllm" in todo:
        with stages.time("vs_vllm"):
            compared = {"chat": chat}
            if mode is FULL:  # the smoke run keeps to the chat workload
                # All at t=0, like chat: a throughput race (Poisson arrivals at 1 req/s only measure the rate).
                compared["shared-prefix"] = load_or_build("shared-prefix", args, mode, tokenizer)
            batch, contexts = DECODE_STEP_SHAPES[mode.name]
            out["vs_vllm"] = vs_vllm.measure(compared, config, batch, contexts, args.vllm_rounds, progress)


def machine() -> dict[str, Any]:
    """What this run ran on (the CPU model as lscpu reports it, and the cores torch uses)."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


if __name__ == "__main__":
    sys.exit(main())
