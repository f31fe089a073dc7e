"""The benchmark: its accounting (percentiles, KV timelines, capacity), its workloads, and a `--quick` run
whose JSON must carry every figure for every engine it ran, with values that make sense."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from bench import kv, report, vs_vllm, workloads
from bench.engines import llamacpp_server, vllm_cpu
from bench.engines.base import RunConfig
from bench.engines.hf_static import static_batch_size
from bench.stats import RequestTiming, latency_figures, percentile
from inference.model_loader import DEFAULT_MODEL, resolve_model

REPO = Path(__file__).resolve().parents[2]
GEOMETRY = kv.KVGeometry(num_layers=30, num_kv_heads=3, head_dim=64, dtype_bytes=4)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))


# --- accounting ---------------------------------------------------------------------------------------------

def test_percentile_interpolates_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert math.isnan(percentile([], 50))


def test_latency_figures_from_token_times():
    timings = [RequestTiming("a#0", arrival=0.0, num_prompt_tokens=5, token_times=[1.0, 1.5, 2.0]),
               RequestTiming("b#0", arrival=0.5, num_prompt_tokens=5, token_times=[3.0, 4.0])]
    figures = latency_figures(timings, start=0.0).as_dict()
    assert figures["output_tokens"] == 5 and figures["elapsed_s"] == 4.0
    assert figures["output_tokens_per_s"] == pytest.approx(5 / 4)
    assert figures["ttft_p50_s"] == pytest.approx((1.0 + 2.5) / 2)
    assert figures["itl_p50_s"] == pytest.approx(0.5)  # gaps 0.5, 0.5, 1.0


def test_latency_figures_reject_a_request_without_output():
    with pytest.raises(ValueError, match="without any output"):
        latency_figures([RequestTiming("a#0", 0.0, 3, [])], start=0.0)


def test_contiguous_padded_batch_waste_is_measured():
    # Two rows: prompts 10 and 4 (padded to 10), outputs 2 and 1 token; the batch runs 2 steps.
    batch = kv.StaticBatch(start=0.0, end=3.0, step_times=[1.0, 2.0], prompt_lens=[10, 4], output_lens=[2, 1])
    timeline = kv.contiguous_timeline([batch])
    points = [(s.time, s.reserved, s.live) for s in timeline.samples]
    # t=0: 2 rows x 10 reserved, 14 live; t=1: 2 x 11 reserved, row 2 done (1 token) so only 11 live;
    # t=2: 2 x 12 reserved, both rows done; t=3: the cache is dropped.
    assert points == [(0.0, 20, 14), (1.0, 22, 11), (2.0, 24, 0), (3.0, 0, 0)]
    summary = timeline.summary(GEOMETRY, block_size=16)
    assert summary["kv_slot_utilization_avg"] == pytest.approx((14 + 11) / (20 + 22 + 24))
    assert summary["kv_peak_reserved_tokens"] == 24
    prealloc = kv.contiguous_timeline([batch], reserve_len=100).summary(GEOMETRY, 16)
    assert prealloc["kv_slot_utilization_avg"] == pytest.approx((14 + 11) / 600)


def test_paged_timeline_rounds_each_sequence_up_to_its_pages():
    spans = [kv.SequenceSpan(start=0.0, num_prompt_tokens=17, token_times=[1.0, 2.0]),
             kv.SequenceSpan(start=0.5, num_prompt_tokens=3, token_times=[1.5])]
    timeline = kv.paged_timeline(spans, page_size=16)
    by_time = {s.time: (s.reserved, s.live) for s in timeline.samples}
    assert by_time[0.0] == (32, 17)      # 17 tokens need 2 pages
    assert by_time[0.5] == (48, 20)      # + 3 tokens in 1 page
    assert by_time[1.0] == (48, 21)      # the first has its first output token
    assert by_time[1.5] == (32, 18)      # the second sequence is gone after its last token
    assert by_time[2.0] == (0, 0)


def test_capacity_of_each_allocation_policy():
    cap = kv.capacity(budget_tokens=4096, seq_lens=[100, 300, 500], padded_row_len=512, max_model_len=2048,
                      block_size=16)
    assert cap["max_length_prealloc"] == 2
    assert cap["padded_to_longest"] == 8
    assert cap["paging"] == pytest.approx(4096 / ((112 + 304 + 512) / 3))


def test_kv_geometry_of_smollm2():
    assert GEOMETRY.bytes_per_token == 2 * 30 * 3 * 64 * 4


# --- workloads ----------------------------------------------------------------------------------------------

def test_chat_workload_is_seeded_and_in_range(tokenizer):
    spec = workloads.WorkloadSpec(12, (20, 400), (16, 256))
    a = workloads.build("chat", tokenizer, seed=3, spec=spec)
    b = workloads.build("chat", tokenizer, seed=3, spec=spec)
    c = workloads.build("chat", tokenizer, seed=4, spec=spec)
    assert [r.prompt_token_ids for r in a.requests] == [r.prompt_token_ids for r in b.requests]
    assert [r.prompt_token_ids for r in a.requests] != [r.prompt_token_ids for r in c.requests]
    assert all(20 <= r.num_prompt_tokens <= 400 and 16 <= r.max_tokens <= 256 for r in a.requests)
    assert all(r.arrival_time == 0.0 for r in a.requests)
    text = tokenizer.decode(a.requests[0].prompt_token_ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


def test_shared_prefix_workload_shares_a_300_token_system_prompt(tokenizer):
    w = workloads.build("shared-prefix", tokenizer, spec=workloads.WorkloadSpec(3, (330, 420), (8, 8)))
    first, second = (r.prompt_token_ids for r in w.requests[:2])
    common = next(i for i, (x, y) in enumerate(zip(first, second)) if x != y)
    assert common >= workloads.SHARED_SYSTEM_PROMPT_TOKENS


def test_long_workload_is_near_max_model_len(tokenizer):
    w = workloads.build("long", tokenizer, spec=workloads.WorkloadSpec(2, (0, 0), (16, 16)), max_model_len=1024)
    assert all(1024 - 64 <= r.num_prompt_tokens + r.max_tokens < 1024 for r in w.requests)


def test_poisson_arrivals_are_increasing_at_about_the_rate(tokenizer):
    spec = workloads.WorkloadSpec(40, (20, 40), (4, 4))
    w = workloads.build("chat", tokenizer, spec=spec, arrival="poisson", rate=10.0)
    times = [r.arrival_time for r in w.requests]
    assert times == sorted(times) and times[0] == 0.0
    assert 1.0 < times[-1] < 10.0  # 39 gaps of mean 0.1 s
    with pytest.raises(ValueError, match="rate"):
        workloads.build("chat", tokenizer, spec=spec, arrival="poisson")


def test_unknown_kind_is_rejected(tokenizer):
    with pytest.raises(ValueError, match="unknown workload kind"):
        workloads.build("chess", tokenizer)


def test_jsonl_round_trip(tokenizer, tmp_path):
    w = workloads.build("parallel", tokenizer, spec=workloads.WorkloadSpec(2, (30, 60), (8, 8)))
    workloads.save(w, tmp_path / "w.jsonl")
    loaded = workloads.load(tmp_path / "w.jsonl")
    assert loaded == w and all(r.n == 4 for r in loaded.requests)


# --- the quick run ------------------------------------------------------------------------------------------

ENGINE_KEYS = [
    "output_tokens", "num_requests", "elapsed_s", "output_tokens_per_s", "requests_per_s",
    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s",
    "kv_peak_blocks", "kv_peak_reserved_tokens", "kv_peak_reserved_bytes", "kv_avg_reserved_bytes",
    "kv_avg_live_bytes", "kv_slot_utilization_avg", "kv_budget_tokens", "num_preemptions", "cpu_s",
    "output_tokens_per_cpu_s",
    "prefix_cache_hit_rate", "prompt_tokens_computed", "max_concurrent_requests", "notes",
]


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
    """`python -m bench --quick` without the peers a bench session may have installed (vLLM, llama.cpp): the
    suite checks the same thing on every machine, each peer's note saying how to install it; running vLLM here
    took 90 s of the suite. The peers' runners are tested with stubs below."""
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json", "--plot", str(out / "plots"),
         "--workloads", str(out / "workloads")],
        cwd=REPO, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PAGED_PLAYGROUND_PEERS": str(tmp_path_factory.mktemp("no-peers"))},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), out


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_quick_run_has_every_figure_for_every_engine(quick_result):
    result, _ = quick_result
    engines, workload = result["engines"], result["workload"]
    assert {"ours", "hf_static", "hf_static_maxlen", "hf_continuous"} <= set(engines)
    ran = {name.split("_np")[0] for name in engines}  # llama.cpp's server runs once per slot count
    assert ran | set(result["skipped"]) == {"ours", "hf_static", "hf_static_maxlen", "hf_continuous", "llamacpp",
                                            "llamacpp_server"}
    for name, fig in engines.items():
        missing = [k for k in ENGINE_KEYS if k not in fig]
        assert not missing, f"{name} lacks {missing}"
        assert fig["output_tokens"] == workload["output_tokens"], name
        assert fig["num_requests"] == workload["num_requests"], name
        assert fig["output_tokens_per_s"] > 0 and fig["requests_per_s"] > 0, name
        assert fig["cpu_s"] > 0 and fig["output_tokens_per_cpu_s"] > 0, name
        assert 0 < fig["kv_slot_utilization_avg"] <= 1, name
        assert 0 < fig["kv_avg_live_bytes"] <= fig["kv_avg_reserved_bytes"] <= fig["kv_peak_reserved_bytes"], name
        assert fig["kv_peak_reserved_tokens"] <= fig["kv_budget_tokens"], name
        assert fig["ttft_p50_s"] <= fig["ttft_p90_s"] <= fig["ttft_p99_s"], name
        assert 0 < fig["max_concurrent_requests"] <= workload["num_requests"], name
    ours, static = engines["ours"], engines["hf_static"]
    assert ours["prompt_tokens_computed"] <= workload["prompt_tokens"]  # no padding, maybe cache hits
    assert static["prompt_tokens_computed"] >= workload["prompt_tokens"]  # padding is computed too
    # Reserving max_model_len per row fits fewer rows in the same budget than reserving the longest row.
    maxlen_rows = result["config"]["kv_budget_tokens"] // result["config"]["max_model_len"]
    assert engines["hf_static_maxlen"]["max_concurrent_requests"] == min(maxlen_rows, workload["num_requests"])
    assert engines["hf_static_maxlen"]["max_concurrent_requests"] <= static["max_concurrent_requests"]
    assert ours["num_preemptions"] >= 0 and 0 <= ours["prefix_cache_hit_rate"] <= 1
    assert set(result["ratios"]) == set(engines) - {"ours"}


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_quick_run_experiments_and_outputs(quick_result):
    result, out = quick_result
    roof = result["roofline"]
    assert roof["matmul_flops_per_s"] > 1e9
    assert [row["batch"] for row in roof["decode"]] == [1, 4]
    assert all(0 < row["ours_fraction_of_roofline"] < 1 for row in roof["decode"])
    prefix = result["prefix_caching"]
    assert prefix["on"]["prompt_tokens_computed"] < prefix["off"]["prompt_tokens_computed"]
    assert prefix["off"]["prefix_cache_hit_rate"] == 0 < prefix["on"]["prefix_cache_hit_rate"]
    assert prefix["shared_prefix_tokens"] >= 300
    assert 0 < prefix["prompt_tokens_computed_reduction"] < 1 and 0 < prefix["ideal_reduction"] < 1
    parallel = result["parallel_sharing"]
    assert parallel["shared"]["kv_peak_blocks"] < parallel["unshared"]["kv_peak_blocks"]
    assert parallel["shared"]["kv_peak_blocks_unshared"] > parallel["shared"]["kv_peak_blocks"]
    beam = result["beam_sharing"]
    assert beam["peak_blocks_shared"] < beam["peak_blocks_unshared"] and 0 < beam["blocks_saved_avg"] < 1
    quant = result["quantization"]["variants"]  # the quick run measures float32 and int4 only
    assert set(quant) == {"fp32", "int4"}
    assert quant["int4"]["weight_mib"] < 0.3 * quant["fp32"]["weight_mib"]
    assert quant["fp32"]["argmax_agreement_vs_fp32"] == 1 and quant["fp32"]["mean_kl_vs_fp32"] == 0
    assert 0.5 < quant["int4"]["argmax_agreement_vs_fp32"] <= 1 and quant["int4"]["mean_kl_vs_fp32"] > 0
    # Token by token (the decode path's kernels): float32 agrees with its own prompt pass to rounding.
    assert quant["fp32"]["decode_argmax_agreement_vs_fp32"] > 0.95 and quant["fp32"]["decode_mean_kl_vs_fp32"] < 1e-3
    assert 0.5 < quant["int4"]["decode_argmax_agreement_vs_fp32"] <= 1 and quant["int4"]["decode_mean_kl_vs_fp32"] > 0
    assert all(r["chat_output_tok_s"] > 0 and r["decode_batch1_tok_s"] > 0 for r in quant.values())
    cap = result["fixed_budget"]["capacity"]
    assert cap["max_length_prealloc"] <= cap["padded_to_longest"] <= cap["paging"]
    assert {t["what"] for t in result["targets"]} and all("met" in t for t in result["targets"])
    pngs = sorted(Path(p).name for p in result["plots"])
    assert pngs == ["kv_memory_over_time.png", "prefix_caching.png", "throughput_vs_concurrency.png", "ttft_cdf.png"]
    assert all((out / "plots" / name).read_bytes()[:4] == b"\x89PNG" for name in pngs)
    saved = sorted(p.name for p in (out / "workloads").iterdir())
    # Named by arrival: the prefix-caching experiment's Poisson workload is not the t=0 one of vs-vllm.
    assert "chat-quick.jsonl" in saved and "shared-prefix-poisson-quick.jsonl" in saved
    vs = result["vs_vllm"]  # ours always; vLLM where its venv is installed, else a note saying how
    (one,) = vs["rounds"]
    assert one["ours"]["chat"]["output_tokens"] == result["workload"]["output_tokens"]
    assert all(one["ours"][f"decode_{c}"]["step_s"] > 0 for c in (32, 96))
    if "skipped" in vs:
        assert "setup_vllm.sh" in vs["skipped"] or "vLLM failed" in vs["skipped"]
    else:
        assert one["vllm"]["chat"]["output_tokens"] == result["workload"]["output_tokens"]
        assert set(vs["ratios"]) == {"chat", "decode_32", "decode_96"} and all(r > 0 for r in vs["ratios"].values())
        assert vs["ratios_min"] == vs["ratios"] == one["ratios"]  # one round: its own median and worst


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_report_renders_a_saved_result(quick_result, tmp_path):
    result, _ = quick_result
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(result))
    proc = subprocess.run([sys.executable, "-m", "bench", "--report", str(saved)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    assert "| figure | ours | hf_static | hf_static_maxlen | hf_continuous |" in text
    assert "### targets" in text and ("met" in text or "MISSED" in text)
    assert f"{result['engines']['ours']['output_tokens_per_s']:.1f}" in text


def test_static_batch_never_outgrows_the_budget(tokenizer):
    w = workloads.build("chat", tokenizer, spec=workloads.WorkloadSpec(16, (20, 400), (16, 128)))
    config = RunConfig(model_path=Path("."), geometry=GEOMETRY, kv_budget_tokens=4096)
    rows = static_batch_size(w, config)
    longest_prompt = max(r.num_prompt_tokens for r in w.requests)
    longest_output = max(r.max_tokens for r in w.requests)
    assert rows * (longest_prompt + longest_output) <= 4096 < (rows + 1) * (longest_prompt + longest_output)
    # The seeds' reservation: every row holds room for max_model_len tokens.
    assert static_batch_size(w, replace(config, max_model_len=1024), max_length=True) == 4


def test_dtype_option_reaches_our_engine_and_its_kv_geometry():
    from bench.__main__ import parse_args
    from bench.engines import ours
    from transformers import AutoConfig

    args = parse_args(["--dtype", "bfloat16"])
    model_path = resolve_model(DEFAULT_MODEL)
    geometry = kv.KVGeometry.from_hf_config(AutoConfig.from_pretrained(model_path), args.dtype)
    assert geometry.bytes_per_token == GEOMETRY.bytes_per_token // 2
    engine = ours.make_engine(RunConfig(model_path=model_path, geometry=geometry, kv_budget_tokens=1024,
                                        max_model_len=512, dtype=args.dtype))
    assert engine.runner.dtype == torch.bfloat16
    assert parse_args([]).dtype == "float32"


def test_lora_bench_writes_adapters_the_engine_loads(tmp_path):
    from bench.lora import write_random_adapter
    from inference.lora import TARGET_MODULES, LoRARequest, load_adapter
    from inference.model import ModelConfig

    cfg = ModelConfig.from_folder(resolve_model(DEFAULT_MODEL))
    write_random_adapter(tmp_path / "a", cfg, rank=4, seed=0)
    adapter = load_adapter(LoRARequest("a", 1, str(tmp_path / "a")), cfg, max_rank=4)
    assert adapter.rank == 4 and len(adapter.weights) == cfg.num_layers * len(TARGET_MODULES)
    a, b = adapter.weights[(0, "gate_proj")]
    assert a.shape == (4, cfg.hidden_size) and b.shape == (cfg.intermediate_size, 4)


def test_vllm_peer_gets_our_kv_budget_and_its_token_times_become_figures():
    config = RunConfig(model_path=Path("."), geometry=GEOMETRY, kv_budget_tokens=23296)
    # 23,296 slots x 46,080 bytes (float32 K and V) is just under 1 GiB; vLLM takes whole GiB, rounded up.
    assert vllm_cpu.kv_cache_gib(config) == 1
    assert vllm_cpu.kv_cache_gib(replace(config, kv_budget_tokens=100_000)) == 5
    w = workloads.Workload("chat", 0, [workloads.BenchRequest("a", [1, 2, 3], 2),
                                       workloads.BenchRequest("b", [4, 5], 3, arrival_time=0.5)])
    served = {"token_times": {"a": [0.2, 0.3], "b": [0.7, 0.8, 1.0]}, "cpu_s": 2.0}
    figures = vllm_cpu.engine_run(w, served, kv_blocks=10, config=config).figures(config)
    assert figures["output_tokens"] == 5 and figures["num_requests"] == 2
    assert figures["ttft_p50_s"] == pytest.approx(0.2)  # a: 0.2 after 0; b: 0.2 after 0.5
    assert figures["output_tokens_per_cpu_s"] == pytest.approx(2.5)
    assert figures["kv_peak_reserved_tokens"] == 160  # the 10 blocks vLLM allocated, not our budget


def test_vs_vllm_ratios_are_ours_faster_by():
    out = {"ours": {"chat": {"output_tokens_per_s": 300.0}, "decode_128": {"step_s": 0.02}},
           "vllm": {"chat": {"output_tokens_per_s": 200.0}, "decode_128": {"step_s": 0.03}}}
    assert vs_vllm.ratios(out) == pytest.approx({"chat": 1.5, "decode_128": 1.5})


class _FakeSession:
    """vllm_cpu.Session's surface (vs_vllm.figures is replaced beside it)."""

    def __init__(self, config):
        self.info = {"vllm_version": "0.32.0", "kv_blocks": 8}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_vs_vllm_rounds_report_the_median_and_hold_the_worst_to_the_target(monkeypatch):
    """Three rounds whose chat ratios are 1.5, 0.75 and 1.2: the table shows the median 1.2x and every round,
    the issue-12 target takes the worst round (0.75, missed). Each task runs on both engines back to back,
    ours first in the first round and vLLM first in the next."""
    calls = []

    def figures(runner, task, config, batch, progress=False):
        side = "vllm" if isinstance(runner, _FakeSession) else "ours"
        calls.append(f"{side}:{'chat' if isinstance(task, workloads.Workload) else task}")
        if isinstance(task, workloads.Workload):
            return {"output_tokens_per_s": next(vllm_tok_s) if side == "vllm" else 300.0}
        return {"step_s": 0.03 if side == "vllm" else 0.02}

    vllm_tok_s = iter([200.0, 400.0, 250.0])
    monkeypatch.setattr(vs_vllm, "MIN_TASK_S", 0.0)  # one run of each task a round
    monkeypatch.setattr(vs_vllm.ours, "make_engine", lambda config: object())
    monkeypatch.setattr(vllm_cpu, "Session", _FakeSession)
    monkeypatch.setattr(vllm_cpu, "available", lambda: True)
    monkeypatch.setattr(vs_vllm, "figures", figures)
    config = RunConfig(model_path=Path("."), geometry=GEOMETRY, kv_budget_tokens=4096)
    chat = workloads.Workload("chat", 0, [])
    vs = vs_vllm.measure({"chat": chat}, config, batch=2, contexts=(128,), rounds=3)
    assert calls == ["ours:chat", "vllm:chat", "ours:128", "vllm:128",
                     "vllm:chat", "ours:chat", "vllm:128", "ours:128",
                     "ours:chat", "vllm:chat", "ours:128", "vllm:128"]
    assert [r["ratios"]["chat"] for r in vs["rounds"]] == pytest.approx([1.5, 0.75, 1.2])
    assert vs["ratios"]["chat"] == pytest.approx(1.2) and vs["ratios_min"]["chat"] == pytest.approx(0.75)
    text = report.vs_vllm_section(vs)
    assert "3 rounds" in text and "| chat output tok/s | 300.0 | 250.0 | 1.20x | 1.50, 0.75, 1.20 | 1 |" in text
    (chat,) = [t for t in report.targets({"vs_vllm": vs}) if t.what.startswith("chat output tok/s, ours / vLLM")]
    assert chat.value == pytest.approx(0.75) and chat.met is False


def test_vs_vllm_repeats_a_short_task_and_keeps_each_engines_median_run(monkeypatch):
    """A task whose first pair takes 4 s (of MIN_TASK_S = 10 per engine) runs in 5 pairs, alternating who goes
    first; a 30 s task runs once. Each engine's median run stands for the round, every run's figure beside it."""
    clock, calls = [0.0], []
    ours_steps, vllm_steps = iter([0.05, 0.01, 0.04, 0.02, 0.03]), iter([0.02, 0.03, 0.09, 0.01, 0.02])

    def figures(runner, task, config, batch, progress=False):
        side = "vllm" if isinstance(runner, _FakeSession) else "ours"
        calls.append(side)
        if isinstance(task, workloads.Workload):
            clock[0] += 30
            return {"output_tokens_per_s": 100.0}
        clock[0] += 2
        return {"step_s": next(ours_steps if side == "ours" else vllm_steps), "run": len(calls)}

    monkeypatch.setattr(vs_vllm, "MIN_TASK_S", 10.0)
    monkeypatch.setattr(vs_vllm.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(vs_vllm.ours, "make_engine", lambda config: object())
    monkeypatch.setattr(vllm_cpu, "Session", _FakeSession)
    monkeypatch.setattr(vllm_cpu, "available", lambda: True)
    monkeypatch.setattr(vs_vllm, "figures", figures)
    config = RunConfig(model_path=Path("."), geometry=GEOMETRY, kv_budget_tokens=4096)
    vs = vs_vllm.measure({"chat": workloads.Workload("chat", 0, [])}, config, batch=2, contexts=(128,))
    assert calls == ["ours", "vllm"] + ["ours", "vllm", "vllm", "ours"] * 2 + ["ours", "vllm"]
    (one,) = vs["rounds"]
    assert one["ours"]["decode_128"] == {"step_s": 0.03, "run": 11, "repeats": [0.05, 0.01, 0.04, 0.02, 0.03]}
    assert one["vllm"]["decode_128"]["step_s"] == 0.02 and one["ours"]["chat"]["repeats"] == [100.0]
    assert one["ratios"]["decode_128"] == pytest.approx(0.02 / 0.03)


def test_every_workload_run_starts_from_an_empty_prefix_cache(monkeypatch):
    """A repeated workload must not find its own prompts cached: ours is reset before each run, vLLM is asked to."""
    events = []

    class Engine:
        def reset_prefix_cache(self):
            events.append("ours:reset")

    class Session(_FakeSession):
        def run(self, task):
            events.append(f"vllm:{task['kind']}:reset={task.get('reset_prefix_cache')}")
            return {"token_times": {}, "cpu_s": 1.0}

    class Served:
        def figures(self, config):
            return {"output_tokens_per_s": 1.0}

    def run(task, config, engine, progress):
        events.append("ours:run")
        return Served()

    monkeypatch.setattr(vllm_cpu, "Session", Session)
    monkeypatch.setattr(vllm_cpu, "engine_run", lambda *args: Served())
    monkeypatch.setattr(vs_vllm.ours, "run", run)
    config = RunConfig(model_path=Path("."), geometry=GEOMETRY, kv_budget_tokens=4096)
    chat = workloads.Workload("chat", 0, [])
    for runner in (Engine(), Session(config), Engine()):
        vs_vllm.figures(runner, chat, config, batch=2)
    assert events == ["ours:reset", "ours:run", "vllm:workload:reset=True", "ours:reset", "ours:run"]


# A stand-in for peers/vllm_runner.py speaking its protocol: a first answer once "loaded", then one answer per
# task line (the task echoed back), "die" exits without answering, "hang" never answers.
_STUB_RUNNER = """
import json, os, sys, time
job, results = json.loads(sys.argv[1]), os.fdopen(int(sys.argv[2]), "w")
print("a log line on stdout", flush=True)
results.write(json.dumps({"vllm_version": "stub", "kv_blocks": job["block_size"]}) + "\\n"); results.flush()
for line in sys.stdin:
    task = json.loads(line)
    if task["kind"] == "die": sys.exit(3)
    if task["kind"] == "hang": time.sleep(60)
    results.write(json.dumps({"echo": task, "pid": os.getpid()}) + "\\n"); results.flush()
"""


@pytest.fixture
def stub_runner(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / "runner.py").write_text(_STUB_RUNNER)
    monkeypatch.setattr(vllm_cpu, "venv", lambda: tmp_path)
    monkeypatch.setattr(vllm_cpu, "RUNNER", tmp_path / "runner.py")
    return RunConfig(model_path=Path("."), geometry=GEOMETRY, kv_budget_tokens=4096, block_size=32, threads=1)


def _stopped(pid: int) -> bool:
    """Whether the process is stopped within 2 s (a SIGSTOP is delivered asynchronously)."""
    deadline = time.monotonic() + 2
    while Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "T":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_vllm_session_answers_each_task_and_is_stopped_between_them(stub_runner):
    with vllm_cpu.Session(stub_runner) as session:
        assert session.info == {"vllm_version": "stub", "kv_blocks": 32}
        pid = session._proc.pid
        assert _stopped(pid)  # while ours would run
        for i in range(2):
            answer = session.run({"kind": "workload", "i": i})
            assert answer == {"echo": {"kind": "workload", "i": i}, "pid": pid} and _stopped(pid)
    assert session._proc.returncode == 0  # ended at the end of its input


def test_vllm_session_reports_a_runner_that_dies_or_hangs(stub_runner):
    with vllm_cpu.Session(stub_runner) as session:
        with pytest.raises(RuntimeError, match=r"exit 3.*a log line on stdout"):
            session.run({"kind": "die"})
    with vllm_cpu.Session(stub_runner, timeout_s=0.5) as session:
        with pytest.raises(subprocess.TimeoutExpired):
            session.run({"kind": "hang"})
        assert session._proc.returncode is not None  # ended, not left running


class _FakeLlamaServer(BaseHTTPRequestHandler):
    """llama-server's streamed /completion as the peer adapter reads it: one event per token, then a final
    event with stop and the count; `short_by` tokens fewer than asked, to check the count is enforced."""

    short_by = 0

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body["n_predict"] - self.short_by
        assert body["ignore_eos"] and body["prompt"] == [5, 6, 7] and body["stream"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            self.wfile.write(f"data: {json.dumps({'content': f't{i}', 'stop': False})}\n\n".encode())
        final = {"content": "", "stop": True, "tokens_predicted": n, "timings": {"predicted_n": n}}
        self.wfile.write(f"data: {json.dumps(final)}\n\n".encode())

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("short_by", [0, 1])
def test_llama_server_peer_times_every_streamed_token_and_checks_the_count(short_by):
    handler = type("Handler", (_FakeLlamaServer,), {"short_by": short_by})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        if short_by:
            with pytest.raises(RuntimeError, match="streamed 3 tokens"):
                llamacpp_server.complete(httpd.server_address[1], [5, 6, 7], 4)
        else:
            times, timings = llamacpp_server.complete(httpd.server_address[1], [5, 6, 7], 4)
            assert len(times) == 4 and times == sorted(times) and timings == {"predicted_n": 4}
    finally:
        httpd.shutdown()
