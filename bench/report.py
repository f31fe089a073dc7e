"""Turn the benchmark's result object into text tables, ratios of ours to each peer, and target verdicts.

The targets are the issues' (2, 4, 8, 12 and 14), each checked as a ratio measured in this one run.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

MIB = 1024**2

# (column title, key in an engine's figures, format)
ENGINE_COLUMNS = [
    ("tok/s", "output_tokens_per_s", "{:.1f}"),
    ("tok per CPU-s", "output_tokens_per_cpu_s", "{:.1f}"),
    ("req/s", "requests_per_s", "{:.3f}"),
    ("TTFT p50", "ttft_p50_s", "{:.2f}s"),
    ("TTFT p90", "ttft_p90_s", "{:.2f}s"),
    ("TTFT p99", "ttft_p99_s", "{:.2f}s"),
    ("ITL p50", "itl_p50_s", "{:.3f}s"),
    ("ITL p90", "itl_p90_s", "{:.3f}s"),
    ("ITL p99", "itl_p99_s", "{:.3f}s"),
    ("peak KV blocks", "kv_peak_blocks", "{}"),
    ("peak KV MiB", "kv_peak_reserved_bytes", "mib"),
    ("avg reserved MiB", "kv_avg_reserved_bytes", "mib"),
    ("avg live MiB", "kv_avg_live_bytes", "mib"),
    ("slot util (avg)", "kv_slot_utilization_avg", "{:.3f}"),
    ("preemptions", "num_preemptions", "{}"),
    ("prefix hit rate", "prefix_cache_hit_rate", "{:.2f}"),
    ("prompt tok computed", "prompt_tokens_computed", "{}"),
    ("max concurrent", "max_concurrent_requests", "{}"),
]


def fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if spec == "mib":
        return f"{value / MIB:.1f}"
    return spec.format(value)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def engines_table(engines: dict[str, dict[str, Any]]) -> str:
    """Engines as columns, figures as rows (the table stays readable with many figures)."""
    names = list(engines)
    rows = [[title] + [fmt(engines[n].get(key), spec) for n in names] for title, key, spec in ENGINE_COLUMNS]
    return markdown_table(["figure"] + names, rows)


def ratios(engines: dict[str, dict[str, Any]], ours: str = "ours") -> dict[str, dict[str, float]]:
    """Ours over each peer: throughput ratios (>1 = ours faster), TTFT ratio peer/ours (>1 = ours sooner)."""
    if ours not in engines:
        return {}
    mine = engines[ours]
    out = {}
    for name, peer in engines.items():
        if name == ours:
            continue
        out[name] = {
            "output_tokens_per_s": mine["output_tokens_per_s"] / peer["output_tokens_per_s"],
            "output_tokens_per_cpu_s": mine["output_tokens_per_cpu_s"] / peer["output_tokens_per_cpu_s"],
            "requests_per_s": mine["requests_per_s"] / peer["requests_per_s"],
            "ttft_p50_peer_over_ours": peer["ttft_p50_s"] / mine["ttft_p50_s"],
            "kv_avg_reserved_peer_over_ours": peer["kv_avg_reserved_bytes"] / mine["kv_avg_reserved_bytes"],
        }
    return out


@dataclass
class Target:
    issue: int
    what: str
    value: float | None
    goal: str  # e.g. ">= 4"
    met: bool | None  # None: not measured in this run

    def row(self) -> list[str]:
        verdict = "not measured" if self.met is None else ("met" if self.met else "MISSED")
        shown = "n/a" if self.value is None else f"{self.value:.3f}"
        return [str(self.issue), self.what, shown, self.goal, verdict]


def _at_least(issue: int, what: str, value: float | None, goal: float) -> Target:
    return Target(issue, what, value, f">= {goal:g}", None if value is None else value >= goal)


def _at_most(issue: int, what: str, value: float | None, goal: float) -> Target:
    return Target(issue, what, value, f"<= {goal:g}", None if value is None else value <= goal)


def targets(result: dict[str, Any]) -> list[Target]:
    """Every target of issues 2, 4, 8, 12 and 14 that this run's result can speak to."""
    r = result.get("ratios", {})
    engines = result.get("engines", {})
    tput = {peer: v["output_tokens_per_s"] for peer, v in r.items()}
    cpu = {peer: v["output_tokens_per_cpu_s"] for peer, v in r.items()}
    roof = {row["batch"]: row["ours_fraction_of_roofline"] for row in result.get("roofline", {}).get("decode", [])}
    prefix = result.get("prefix_caching", {})
    parallel = result.get("parallel_sharing", {})
    budget = result.get("fixed_budget", {})
    util = engines.get("ours", {}).get("kv_slot_utilization_avg")
    quant = result.get("quantization", {}).get("variants", {})
    servers = [v for peer, v in tput.items() if peer.startswith("llamacpp_server_np")]
    llama_single = result.get("quantization", {}).get("llamacpp_server_decode_batch1_tok_s")
    vs_worst = result.get("vs_vllm", {}).get("ratios_min", {})
    vs_dtype = result.get("vs_vllm", {}).get("dtype", "")

    def quant_ratio(key: str, num: str, den: str) -> float | None:
        if num not in quant or den not in quant:
            return None
        return quant[num][key] / quant[den][key]

    return [
        _at_least(2, "output tok/s, ours / HF static", tput.get("hf_static"), 2),
        _at_least(8, "output tok/s, ours / HF static, rows reserve max_model_len (seeds' baseline, same KV budget)",
                  tput.get("hf_static_maxlen"), 4),
        _at_least(8, "same, per CPU-second (robust to other jobs on the cores)", cpu.get("hf_static_maxlen"), 4),
        _at_least(8, "output tok/s, ours / HF static, rows reserve the workload's longest row (same KV budget)",
                  tput.get("hf_static"), 4),
        _at_least(8, "same, per CPU-second", cpu.get("hf_static"), 4),
        _at_least(8, "output tok/s, ours / HF continuous batching", tput.get("hf_continuous"), 1.5),
        _at_least(8, "same, per CPU-second", cpu.get("hf_continuous"), 1.5),
        _at_least(8, "output tok/s, ours / llama.cpp", tput.get("llamacpp"), 1),
        _at_least(12, "output tok/s, ours / llama.cpp server at its best slot count", min(servers, default=None), 3),
        *[_at_least(12, f"{figure}, ours / vLLM CPU ({vs_dtype}, worst round)", vs_worst.get(key), 1)
          for key, figure in [("chat", "chat output tok/s"), ("shared-prefix", "shared-prefix output tok/s"),
                              ("decode_128", "decode step at batch 32, 128 context, speed"),
                              ("decode_1024", "decode step at batch 32, 1,024 context, speed")]],
        _at_least(2, "time-averaged kv_slot_utilization (ours)", util, 0.96),
        _at_least(8, "sequences held in the fixed budget, paging / max-length pre-allocation",
                  budget.get("paging_vs_max_length_prealloc"), 4),
        _at_least(8, "decode at batch 64, fraction of matmul roofline", roof.get(64), 0.40),
        _at_least(4, "shared prefix: prompt tokens computed, reduction", prefix.get("prompt_tokens_computed_reduction"), 0.85),
        _at_least(4, "shared prefix: TTFT p50 off / on", prefix.get("ttft_p50_speedup"), 3),
        _at_most(4, "n=4: peak KV blocks shared / unshared", parallel.get("peak_blocks_ratio"), 0.40),
        _at_least(4, "beam width 4: KV blocks saved by sharing, step average (paper: 0.37-0.55)",
                  result.get("beam_sharing", {}).get("blocks_saved_avg"), 0.37),
        _at_most(14, "int4 resident weights / float32's", quant_ratio("weight_mib", "int4", "fp32"), 0.30),
        _at_least(14, "int4 decode at batch 1 / our float32", quant_ratio("decode_batch1_tok_s", "int4", "fp32"), 2),
        _at_least(14, "GGUF Q4_1 decode at batch 1 / our float32",
                  quant_ratio("decode_batch1_tok_s", "gguf-q4_1", "fp32"), 2),
        _at_least(14, "int4 decode at batch 1 / llama.cpp server single stream, same GGUF",
                  quant["int4"]["decode_batch1_tok_s"] / llama_single if llama_single and "int4" in quant else None, 1),
        _at_least(14, "GGUF Q4_1 decode at batch 1 / llama.cpp server single stream",
                  quant["gguf-q4_1"]["decode_batch1_tok_s"] / llama_single if llama_single and "gguf-q4_1" in quant
                  else None, 1),
        _at_least(14, "int4 decode tok/s at batch 64 / bfloat16", quant_ratio("decode_batch64_tok_s", "int4", "bf16"), 1),
    ]


def targets_table(result: dict[str, Any]) -> str:
    return markdown_table(["issue", "target", "value", "goal", "verdict"], [t.row() for t in targets(result)])


def text_report(result: dict[str, Any]) -> str:
    """The human-readable report printed at the end of a run (markdown; figures worth keeping become records)."""
    parts = []
    if result["engines"]:
        parts += [f"## chat workload ({result['workload']['num_requests']} requests, "
                  f"{result['workload']['output_tokens']} output tokens, arrival {result['workload']['arrival']})",
                  engines_table(result["engines"])]
    for name, note in result.get("skipped", {}).items():
        parts.append(f"- {name}: skipped ({note})")
    if result.get("ratios"):
        parts.append("### ours / peer")
        parts.append(markdown_table(
            ["peer", "tok/s ratio", "tok per CPU-s ratio", "req/s ratio", "TTFT p50 peer/ours",
             "avg KV reserved peer/ours"],
            [[peer, f"{v['output_tokens_per_s']:.2f}", f"{v['output_tokens_per_cpu_s']:.2f}", f"{v['requests_per_s']:.2f}",
              f"{v['ttft_p50_peer_over_ours']:.2f}", f"{v['kv_avg_reserved_peer_over_ours']:.2f}"]
             for peer, v in result["ratios"].items()]))
    if result.get("fixed_budget", {}).get("measured"):
        parts.append(fixed_budget_section(result["fixed_budget"]))
    if "roofline" in result:
        parts.append(roofline_section(result["roofline"]))
    if "prefix_caching" in result:
        prefix = result["prefix_caching"]
        parts.append(pair_section("prefix caching (shared-prefix workload)", prefix, "on", "off")
                     + f"\n\nshared prefix {prefix['shared_prefix_tokens']} tokens; prompt tokens computed "
                       f"{prefix['prompt_tokens_computed_reduction']:.1%} fewer with caching, of an ideal "
                       f"{prefix['ideal_reduction']:.1%} for this workload; TTFT p50 {prefix['ttft_p50_speedup']:.2f}x lower")
    if "parallel_sharing" in result:
        parts.append(pair_section("n=4 parallel sampling", result["parallel_sharing"], "shared", "unshared"))
    if "beam_sharing" in result:
        beam = result["beam_sharing"]
        parts.append(f"### beam search (width {beam['beam_width']}, {beam['num_requests']} prompts)\n" + markdown_table(
            ["figure", "with sharing", "without (sum of ref counts)"],
            [["peak KV blocks", str(beam["peak_blocks_shared"]), str(beam["peak_blocks_unshared"])],
             ["blocks saved", f"at peak {beam['blocks_saved_at_peak']:.2f}", f"step average {beam['blocks_saved_avg']:.2f}"]]))
    if "quantization" in result:
        parts.append(quantization_section(result["quantization"]))
    if "long" in result:
        parts.append("### long prompts (near max_model_len), ours\n" + engines_table({"ours": result["long"]}))
    if "vs_vllm" in result:
        parts.append(vs_vllm_section(result["vs_vllm"]))
    parts.append("### targets\n" + targets_table(result))
    return "\n\n".join(parts)


def fixed_budget_section(budget: dict[str, Any]) -> str:
    cap = budget["capacity"]
    rows = [["max-length pre-allocation", f"{cap['max_length_prealloc']}"],
            ["padded to the workload's longest", f"{cap['padded_to_longest']}"],
            ["paging (average sequence)", f"{cap['paging']:.1f}"]]
    measured = [[name, str(m["max_concurrent_requests"]), f"{m['output_tokens_per_s']:.1f}"]
                for name, m in budget["measured"].items()]
    return (f"### fixed KV budget ({budget['kv_budget_tokens']} token slots)\n"
            + markdown_table(["policy", "sequences held at once"], rows) + "\n\n"
            + markdown_table(["engine", "max concurrent (measured)", "tok/s"], measured))


def quantization_section(quant: dict[str, Any]) -> str:
    variants = quant["variants"]
    fp32 = variants["fp32"]  # always measured: the reference
    rows = [[name, r["dtype"], f"{r['weight_mib']:.1f}", fmt(r["weight_mib"] / fp32["weight_mib"], "{:.0%}"),
             f"{r['chat_output_tok_s']:.1f}", f"{r['ttft_p50_s'] * 1000:.0f}", f"{r['decode_batch1_tok_s']:.1f}",
             fmt(r["decode_batch1_tok_s"] / fp32["decode_batch1_tok_s"], "{:.2f}"),
             f"{r['weight_matmul_ms_batch1']:.1f}", f"{r['decode_batch64_tok_s']:.1f}",
             f"{r['argmax_agreement_vs_fp32']:.1%}", f"{r['mean_kl_vs_fp32']:.4f}",
             f"{r['decode_argmax_agreement_vs_fp32']:.1%}", f"{r['decode_mean_kl_vs_fp32']:.4f}"]
            for name, r in variants.items()]
    header = ["weights", "activations", "resident MiB", "of fp32", "chat tok/s", "TTFT p50 ms", "decode b=1 tok/s",
              "b=1 / fp32", "weight matmuls ms/token (b=1)",
              "decode b=64 tok/s", f"argmax = fp32 ({quant['text_tokens']} tokens)",
              "mean KL vs fp32", "same, token by token: argmax = fp32", "mean KL vs fp32"]
    llama = quant.get("llamacpp_server_decode_batch1_tok_s")
    peer = (f"\nllama.cpp server, same Q4_1 GGUF, one stream: decode b=1 {llama:.1f} tok/s\n" if llama else
            f"\nllama.cpp server: {quant.get('llamacpp_server_skipped', 'not measured')}\n")
    return ("### quantization (one engine per weight format, same chat workload)\n" + markdown_table(header, rows)
            + peer)


def roofline_section(roof: dict[str, Any]) -> str:
    rows = [[str(r["batch"]), f"{r['ours_step_s'] * 1000:.1f}", f"{r['ours_tokens_per_s']:.1f}",
             f"{r['ours_fraction_of_roofline']:.3f}",
             fmt(r.get("hf_tokens_per_s"), "{:.1f}")] for r in roof["decode"]]
    return (f"### roofline (matmul {roof['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s, "
            f"{roof['model_flops_per_token'] / 1e6:.0f} MFLOP/token)\n"
            + markdown_table(["batch", "ours step ms", "ours tok/s", "fraction of roof", "HF generate tok/s"], rows))


def pair_section(title: str, pair: dict[str, Any], a: str, b: str) -> str:
    keys = [("prompt tok computed", "prompt_tokens_computed", "{}"), ("TTFT p50", "ttft_p50_s", "{:.2f}s"),
            ("tok/s", "output_tokens_per_s", "{:.1f}"),
    ("tok per CPU-s", "output_tokens_per_cpu_s", "{:.1f}"), ("peak KV blocks", "kv_peak_blocks", "{}"),
            ("prefix hit rate", "prefix_cache_hit_rate", "{:.2f}")]
    rows = [[t, fmt(pair[a].get(k), s), fmt(pair[b].get(k), s)] for t, k, s in keys]
    return f"### {title}\n" + markdown_table(["figure", a, b], rows)


def vs_vllm_section(vs: dict[str, Any]) -> str:
    """Ours vs vLLM CPU: tok/s per workload and decode step ms per context, the medians of the rounds, with the
    median ratio (>= 1: ours wins) and each round's."""
    rounds = vs["rounds"]
    title = f"### ours vs vLLM CPU ({vs['dtype']}, back to back, {len(rounds)} round{'s' * (len(rounds) > 1)})"
    if "skipped" in vs:
        return f"{title}\n- vllm: skipped ({vs['skipped']})"
    rows = []
    for name, figures in rounds[0]["ours"].items():
        each = ", ".join(f"{r['ratios'][name]:.2f}" for r in rounds)
        runs = [len(r["ours"][name]["repeats"]) for r in rounds]  # each engine's runs of the task a round
        runs_a_round = f"{min(runs)}" if min(runs) == max(runs) else f"{min(runs)}-{max(runs)}"
        if "step_s" in figures:
            # vLLM's runner reports the fewest sequences one of its timed steps ran (ours raises below the batch).
            fewest = min(r["vllm"][name].get("batch_min", vs["decode_batch"]) for r in rounds)
            rows.append([f"decode step, batch {vs['decode_batch']}, {name.split('_')[1]} context (ms)",
                         f"{_median(rounds, 'ours', name, 'step_s') * 1000:.1f}",
                         f"{_median(rounds, 'vllm', name, 'step_s') * 1000:.1f}"
                         + (f" (only {fewest} ran)" if fewest < vs["decode_batch"] else ""),
                         f"{vs['ratios'][name]:.2f}x", each, runs_a_round])
        else:
            rows.append([f"{name} output tok/s", f"{_median(rounds, 'ours', name, 'output_tokens_per_s'):.1f}",
                         f"{_median(rounds, 'vllm', name, 'output_tokens_per_s'):.1f}", f"{vs['ratios'][name]:.2f}x",
                         each, runs_a_round])
    vllm = rounds[0]["vllm"]
    return (f"{title} (vLLM {vllm['version']}, {vllm['kv_blocks']} KV blocks; both engines: blocks of "
            f"{vs['block_size']} tokens, a budget of {vs['kv_budget_tokens']} token slots; medians of the rounds, a "
            f"round's figure being each engine's median run of the task that round)\n"
            + markdown_table(["figure", "ours", "vLLM", "ours faster by", "each round", "runs a round"], rows))


def _median(rounds: list[dict[str, Any]], engine: str, name: str, key: str) -> float:
    return statistics.median(r[engine][name][key] for r in rounds)
