"""`python -m bench.moe`: a tiny mixture-of-experts model's CPU decode throughput against a dense model with the
same active parameters.

Both are seeded random Qwen3-family models built from transformers' config classes (Qwen3-MoE and Qwen3) and
saved with SmolLM2's tokenizer: the same hidden size, layers, attention and vocabulary. The MoE has `--experts`
experts of `--expert-intermediate` rows each and routes every token to `--top-k` of them; the dense model's MLP
is `top_k * expert_intermediate` wide, so a token multiplies by the same number of MLP weights in both (the
MoE's router, `E x H` per layer, aside). What the MoE adds per step is its routing and grouping; and where a
batch's tokens spread over many experts it reads many experts' weights, up to all E, where the dense model
reads one MLP: its decode rate against the dense one's, by batch size, is what this measures.

Each round builds one engine per model and times decode of `batch` sequences (`bench.quantization.decode_tok_s`:
32-token prompts prefilled outside the timing) for every `--batch`; rounds alternate which model goes first.
`--record` also writes the record `python -m bench.render` turns into a BENCHMARKS.md table (one row per batch
size, MoE over dense):

    python -m bench.moe --rounds 3 --out bench/results/raw/<date>-moe-vs-dense.json \\
        --record bench/results/90-moe-1-decode.json && python -m bench.render
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from bench.quantization import decode_tok_s
from bench.render import REPO
from inference import LLM, SamplingParams
from inference.model_loader import DEFAULT_MODEL, TOKENIZER_FILES, resolve_model

MODELS = ("moe", "dense")


def model_configs(args: argparse.Namespace) -> dict[str, Qwen3Config | Qwen3MoeConfig]:
    """The MoE and its dense twin: same shape, the dense MLP `top_k * expert_intermediate` wide."""
    shape = dict(vocab_size=49152, hidden_size=args.hidden, num_hidden_layers=args.layers,
                 num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                 max_position_embeddings=512, tie_word_embeddings=True)
    return {
        "moe": Qwen3MoeConfig(**shape, num_experts=args.experts, num_experts_per_tok=args.top_k,
                              moe_intermediate_size=args.expert_intermediate, norm_topk_prob=True),
        "dense": Qwen3Config(**shape, intermediate_size=args.top_k * args.expert_intermediate),
    }


def save_model(folder: Path, config: Qwen3Config | Qwen3MoeConfig) -> dict[str, int]:
    """Save a seeded random model of `config` (with the default model's tokenizer) to `folder`; its total
    parameters and those one token multiplies by (the experts it is not routed to left out)."""
    torch.manual_seed(0)
    model = (Qwen3MoeForCausalLM if isinstance(config, Qwen3MoeConfig) else Qwen3ForCausalLM)(config).eval()
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        (folder / name).write_bytes((resolve_model(DEFAULT_MODEL) / name).read_bytes())
    total = sum(p.numel() for p in model.parameters())
    idle = 0
    if isinstance(config, Qwen3MoeConfig):  # each sparse layer: E - k experts of 3 * H * I the token skips
        expert = 3 * config.hidden_size * config.moe_intermediate_size
        idle = config.num_hidden_layers * (config.num_experts - config.num_experts_per_tok) * expert
    return {"total_params": total, "active_params": total - idle}


def measure(folder: Path, args: argparse.Namespace) -> dict[str, float]:
    """One fresh engine's decode tok/s at every batch size (`decode_batch<N>_tok_s`)."""
    batches = [int(b) for b in args.batch.split(",")]
    with LLM(model=str(folder), dtype=args.dtype, num_kv_blocks=args.kv_blocks, max_model_len=64 + args.tokens,
             max_num_seqs=max(batches), enable_prefix_caching=False) as llm:
        engine = llm.llm_engine
        engine.add_request("warmup", {"prompt_token_ids": list(range(1000, 1040))},
                           SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        return {f"decode_batch{b}_tok_s": decode_tok_s(engine, b, args.tokens) for b in batches}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every round's figures for both models, the models' parameter counts and the settings."""
    configs = model_configs(args)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = {name: Path(tmp) / name for name in MODELS}
        params = {name: save_model(folders[name], configs[name]) for name in MODELS}
        for i in range(args.rounds):
            order = MODELS if i % 2 == 0 else MODELS[::-1]
            rounds.append({name: measure(folders[name], args) for name in order})
    return {"config": {k: v for k, v in vars(args).items() if k not in ("out", "record")}, "models": params,
            "rounds": rounds}


def record(result: dict[str, Any], raw: Path, command: str) -> dict[str, Any]:
    """The BENCHMARKS.md record of a run saved at `raw` (a path inside the repository): one row per batch
    size, the MoE's decode rate against the dense model's, every round."""
    raw = raw.resolve().relative_to(REPO)  # records name their raw files from the repository root
    cfg, models = result["config"], result["models"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
             if line.startswith("model name")]
    cpu = names[0] if names else platform.machine()
    return {
        "capability": "Mixture of experts",
        "title": (f"CPU decode of a tiny MoE ({cfg['experts']} experts, top-{cfg['top_k']}) against a dense model "
                  f"with the same active parameters, {cfg['dtype']}"),
        "command": command,
        "machine": f"{cpu}, {os.cpu_count()} vCPUs (load {os.getloadavg()[0]:.1f} at the end)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "source": str(raw),
        "note": (f"hidden {cfg['hidden']}, {cfg['layers']} layers; active parameters {models['moe']['active_params']:,}"
                 f" (MoE, of {models['moe']['total_params']:,}) and {models['dense']['active_params']:,} (dense)"),
        "raw": [str(raw)],
        "columns": [f"MoE top-{cfg['top_k']} of {cfg['experts']}", "dense"],
        "rows": [{"figure": f"decode, batch {b}", "unit": "tok/s", "better": "higher",
                  "paths": [f"rounds.*.{name}.decode_batch{b}_tok_s" for name in MODELS]}
                 for b in cfg["batch"].split(",")],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.moe", description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--expert-intermediate", type=int, default=512, help="each expert's intermediate size")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", default="1,8,32", help="comma-separated decode batch sizes")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each sequence decodes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kv-blocks", type=int, default=512)
    parser.add_argument("--out", type=Path, metavar="JSON", help="write the raw result here")
    parser.add_argument("--record", type=Path, metavar="JSON",
                        help="also write a bench/results record pointing at --out (which must lie in the repository)")
    args = parser.parse_args(argv)
    if args.record is not None and (args.out is None or not args.out.resolve().is_relative_to(REPO)):
        parser.error(f"--record needs --out inside {REPO} (the raw result the record points at)")
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.record is not None:
        command = "python -m bench.moe " + " ".join(argv if argv is not None else sys.argv[1:])
        args.record.write_text(json.dumps(record(result, args.out, command), indent=1) + "\n")


if __name__ == "__main__":
    main()
