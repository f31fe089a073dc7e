"""The lab's sandbox engine and scenarios: every scenario steps to its end with the invariants holding, its
quiz answer is the engine's own figure, replaying its recording redraws its pool at every step, and two
sandboxes sharing one set of weights never share a pool. The comparison scenario (MHA, GQA and MLA tiny models
in pools of the same bytes) shows the engines' own bytes per token, blocks and admissions."""

import json
import math
import re

import pytest

from inference.counterfactual import contiguous_admission, reserved_tokens
from inference.events import event_from_dict, replay_steps
from inference.lab import LabConfig, LabRequest, LabSession
from inference.lab_models import LAB_MODELS, WIDTH, lab_model_engine, lab_model_folder
from inference.lab_scenarios import SCENARIOS, SCENARIOS_BY_NAME, ScenarioRun

SINGLE_POOL = [s for s in SCENARIOS if not s.models]


@pytest.fixture(scope="module")
def base():
    """One sandbox whose loaded weights the others share (loading the model once)."""
    return LabSession(LabConfig())


def test_contiguous_policies_count_whole_blocks_first_come_first_served():
    assert reserved_tokens("max_model_len", 5, 10, 128) == 128
    assert reserved_tokens("prompt_plus_max_tokens", 5, 10, 128) == 15
    assert reserved_tokens("prompt_plus_max_tokens", 100, 100, 128) == 128
    figures = contiguous_admission([(5, 10, 1), (60, 60, 2), (3, 4, 1)], num_blocks=20, block_size=8,
                                   max_model_len=128)
    assert figures["max_model_len"] == {"reserved_blocks": 64, "admitted": 1, "requests": 3}
    # 2 + 2 * 15 + 1 blocks; the second request (30 blocks) does not fit in the 18 left, and the third may
    # not overtake it.
    assert figures["prompt_plus_max_tokens"] == {"reserved_blocks": 33, "admitted": 1, "requests": 3}
    with pytest.raises(ValueError, match="unknown contiguous policy"):
        reserved_tokens("whatever", 1, 1, 8)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_blocks": 4}, "num_blocks must be an integer in"),
    ({"block_size": 12}, "block_size must be an integer in|block_size must be one of"),
    ({"num_blocks": 8, "max_model_len": 128}, "cannot hold one sequence"),
    ({"max_num_seqs": 16, "max_num_batched_tokens": 16, "num_blocks": 32}, None),
])
def test_lab_config_ranges(kwargs, message):
    if message is None:
        LabConfig(**kwargs)
        return
    with pytest.raises(ValueError, match=message):
        LabConfig(**kwargs)


def test_lab_requests_are_validated_before_anything_changes(base):
    with pytest.raises(ValueError, match="non-empty prompt"):
        LabRequest("  ")
    with pytest.raises(ValueError, match="n must be an integer"):
        LabRequest("hi", n=9)
    with pytest.raises(ValueError, match="leave n at 1"):
        LabRequest("hi", n=2, beam_width=2)
    with pytest.raises(ValueError, match="not running or waiting"):
        base.abort("Z")


def test_sandboxes_share_weights_not_pools(base):
    other = LabSession(LabConfig(num_blocks=16), shared=base.engine)
    assert other.engine.runner.model is base.engine.runner.model
    assert other.engine.runner.kv_caches[0][0].data_ptr() != base.engine.runner.kv_caches[0][0].data_ptr()
    label = other.add(LabRequest("Hello there", max_tokens=3))
    other.step()
    assert sum(b["ref_count"] for b in other.snapshot()["blocks"]) > 0
    assert all(b["ref_count"] == 0 for b in base.snapshot()["blocks"])  # the base pool saw nothing
    other.abort(label)
    assert other.is_idle() and all(b["state"] != "used" for b in other.snapshot()["blocks"])
    other.engine.check_integrity()


def test_abort_frees_and_the_step_reports_it(base):
    label = base.add(LabRequest("Once upon a time there was", max_tokens=20))
    snap = base.step()
    view = next(r for r in snap["requests"] if r["label"] == label)
    assert view["status"] == "running" and view["seqs"][0]["block_table"]
    base.abort(label)
    snap = base.step()
    freed = [e for e in snap["events"] if e["kind"] == "freed"]
    assert freed and freed[0]["reason"] == "aborted" and label in freed[0]["text"]
    assert snap["counters"]["num_blocks_used"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SINGLE_POOL, ids=lambda s: s.name)
def test_scenario_runs_to_its_end_and_replays(base, scenario):
    run = ScenarioRun.start(scenario.name, shared=base.engine)
    pools = {}
    snap = None
    for _ in range(400):
        snap = run.step()
        run.session.engine.check_integrity()
        pools[snap["step"]] = [b["ref_count"] for b in snap["blocks"]]
        if run.finished:
            break
    assert run.finished and snap["finished"] and snap["quiz_due"]
    assert run.answer is not None and run.check(run.answer) and not run.check(run.answer + 1)
    kinds = {e.kind for e in run.session.engine.events.events}
    expected_kind = {"fragmentation": "allocated", "parallel_sampling": "copy_on_write", "beam_search": "forked",
                     "shared_prefix": "touched", "preemption": "preempted", "lru_eviction": "evicted"}
    assert expected_kind[scenario.name] in kinds
    # The recording alone (no model) redraws the pool exactly at every step.
    recording = run.session.recording()
    assert not recording["truncated"]
    replayed = replay_steps(recording["num_blocks"], [event_from_dict(e) for e in recording["events"]],
                            recording["initial"])
    last = None
    for step in sorted(pools):
        last = replayed.get(step, last)
        assert last.ref_counts == pools[step], f"{scenario.name} step {step}"


@pytest.mark.slow
def test_quiz_answers_are_the_engines_figures(base):
    """Each answer checked against a figure computed independently of the quiz's own function."""
    frag = ScenarioRun.start("fragmentation", shared=base.engine)
    frag.step()
    config = frag.scenario.config
    assert frag.answer == config.num_blocks // -(-config.max_model_len // config.block_size) == 2
    sampling = ScenarioRun.start("parallel_sampling", shared=base.engine)
    sampling.step()
    shared = {b for s in sampling.session.engine.requests["A"].seqs for b in s.block_table}
    prompt_blocks = -(-len(sampling.session.engine.requests["A"].prompt_token_ids) // config.block_size)
    assert len(shared) == prompt_blocks  # after the fork every sample holds the prompt's blocks by reference
    sampling.step()
    held = {b for s in sampling.session.engine.requests["A"].seqs for b in s.block_table}
    assert sampling.answer == len(held) > len(shared)  # copy-on-write split the partial block
    while not sampling.finished:
        sampling.step()


@pytest.mark.slow
def test_cache_receipts_say_where_each_prompt_token_came_from(base):
    """Receipts of the shared-prefix and preemption scenarios: cached, computed and recomputed spans that
    cover the prompt, and figures that match the engine's own counters."""
    from inference.receipt import cache_receipt

    receipts = {}
    for name in ("shared_prefix", "preemption"):
        run = ScenarioRun.start(name, shared=base.engine)
        while not run.finished:
            run.step()
        session = run.session
        for label, request in session._engine_requests.items():
            out = sum(s.num_output_tokens for s in request.seqs)
            receipts[name, label] = (cache_receipt(request.metrics, run.scenario.config.block_size, out), request)
    receipt, request = receipts["shared_prefix", "C"]
    assert receipt.provenance[0] == [0, receipt.cached_tokens, "cached"] and receipt.cached_tokens >= 16
    assert receipt.provenance[-1][1] == len(request.prompt_token_ids)
    assert [s[2] for s in receipt.provenance] == ["cached", "computed"] and receipt.recomputed_tokens == 0
    assert receipt.cached_blocks == receipt.cached_tokens // 8 and receipt.preemptions == 0
    assert receipt.ttft_ms >= receipt.prefill_ms >= 0 and receipt.tpot_ms > 0
    first, _ = receipts["shared_prefix", "A"]
    assert first.provenance == [[0, len(receipts["shared_prefix", "A"][1].prompt_token_ids), "computed"]]
    preempted = [r for (name, _), (r, _) in receipts.items() if name == "preemption" and r.preemptions]
    assert len(preempted) == 1 and preempted[0].recomputed_tokens > 0
    assert any(kind == "recomputed" for _, _, kind in preempted[0].provenance)


@pytest.mark.slow
def test_a_lora_workers_step_index_is_invisible_to_a_sandbox_thread():
    """Sandboxes share a LoRA-enabled worker's layers; the live step's row->adapter index must not leak into
    a forward that another thread (the lab's) runs through them."""
    import threading

    engine = LabSession(LabConfig()).engine  # a fresh engine, so the shared base's layers stay untouched
    from inference.lora_slots import LoRAManager

    manager = LoRAManager(engine.runner.model, 2, 8, 2, engine.runner.device, engine.runner.dtype)
    manager.begin_step([(None, 3)])
    assert manager.index is None  # base rows only: no index at all
    manager._step.index = "the live step's index"  # what begin_step leaves while the loop thread forwards
    seen = []
    reader = threading.Thread(target=lambda: seen.append(manager.index))
    reader.start()
    reader.join()
    assert seen == [None] and manager.index == "the live step's index"
    manager.end_step()
    assert manager.index is None


def _cache_bytes_per_token(config: dict) -> int:
    """From the checkpoint's config.json alone (float32): a key and a value per KV head, or MLA's latent and
    RoPE key, per layer."""
    if "kv_lora_rank" in config:
        per_layer = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    else:
        per_layer = 2 * config["num_key_value_heads"] * config["head_dim"]
    return per_layer * config["num_hidden_layers"] * 4


def test_lab_models_share_their_width_and_differ_in_the_cache():
    configs = {name: json.loads((lab_model_folder(name) / "config.json").read_text()) for name in LAB_MODELS}
    assert {c["model_type"] for c in configs.values()} == {"llama", "deepseek_v2"}
    for config in configs.values():  # the same width: hidden size, query heads, layers, MLP
        assert {k: config[k] for k in WIDTH if k != "tie_word_embeddings"} == \
            {k: v for k, v in WIDTH.items() if k != "tie_word_embeddings"}
    assert configs["mha"]["num_key_value_heads"] == configs["mha"]["num_attention_heads"]
    assert configs["gqa"]["num_key_value_heads"] < configs["gqa"]["num_attention_heads"]
    folder = lab_model_folder("mla")
    before = (folder / "model.safetensors").stat().st_mtime_ns
    assert lab_model_folder("mla") == folder and (folder / "model.safetensors").stat().st_mtime_ns == before
    assert (folder / "tokenizer.json").is_file()
    with pytest.raises(ValueError, match="unknown lab model 'mqa'"):
        lab_model_folder("mqa")


@pytest.fixture(scope="module")
def attention_memory():
    """The comparison scenario after its first step (all eight requests arrived, the quiz due)."""
    run = ScenarioRun.start("attention_memory")
    return run, run.step()


def test_same_bytes_make_blocks_by_each_engines_bytes_per_token(attention_memory):
    run, snap = attention_memory
    scenario = SCENARIOS_BY_NAME["attention_memory"]
    lanes = {lane["model"]: lane for lane in snap["lanes"]}
    assert list(lanes) == ["mha", "gqa", "mla"] and snap["step"] == 1 and snap["quiz_due"]
    bs = scenario.config.block_size
    for model, lane in lanes.items():
        config = json.loads((lab_model_folder(model) / "config.json").read_text())
        per_token = _cache_bytes_per_token(config)
        assert lane["kv_bytes_per_token"] == per_token == run.lane(model).engine.runner.kv_bytes_per_token
        # The page's arithmetic multiplies out to the same figure.
        assert eval(re.sub(r"[^0-9+×()]", "", lane["kv_arithmetic"]).replace("×", "*")) == per_token
        # The engine made blocks of the same bytes: the pool holds the bytes' worth of tokens, less than one
        # block short of it, and never more bytes than it was given.
        assert lane["num_blocks"] == scenario.pool_bytes // (per_token * bs) == len(lane["snapshot"]["blocks"])
        assert scenario.pool_bytes / per_token - bs < lane["token_slots"] <= scenario.pool_bytes / per_token
        assert lane["pool_bytes"] <= scenario.pool_bytes
        # Tokens held are what the live sequences have in the cache.
        live = sum(s.num_computed_tokens for s in run.lane(model).engine.live_sequences())
        assert lane["tokens_held"] == live <= lane["token_slots"]
        assert [r["prompt_tokens"] for r in lane["snapshot"]["requests"]] == \
            [r["prompt_tokens"] for r in lanes["mha"]["snapshot"]["requests"]]  # the same requests
    # Token slots scale as bytes per token do, within a block's rounding.
    ratio = lanes["mla"]["token_slots"] / lanes["mha"]["token_slots"]
    assert math.isclose(ratio, lanes["mha"]["kv_bytes_per_token"] / lanes["mla"]["kv_bytes_per_token"],
                        abs_tol=bs / lanes["mha"]["token_slots"])
    # The quiz's answer is the engines' figure, not a written-down one.
    assert run.answer == lanes["mla"]["token_slots"] // lanes["mha"]["token_slots"] == 8
    assert run.check(run.answer) and not run.check(run.answer - 1)
    # A smaller cache per token admits more of the same requests at once.
    running = [lanes[m]["requests"]["running"] for m in ("mha", "gqa", "mla")]
    assert running[0] < running[1] <= running[2] == 8


def test_a_comparison_adds_to_every_pool_and_records_none(attention_memory):
    import kernels.reference

    run, _ = attention_memory
    other = ScenarioRun.start("attention_memory")
    for model, session in zip(other.scenario.models, other.sessions):  # weights loaded once, pools apart
        assert session.engine.runner.model is run.lane(model).engine.runner.model is \
            lab_model_engine(model).runner.model
        assert session.engine.runner.kv_caches[0][0].data_ptr() != run.lane(model).engine.runner.kv_caches[0][0].data_ptr()
        assert session.engine.runner.ops is kernels.reference  # no C++ build on a worker's loop for them
    assert other.add(LabRequest("One more, please.", max_tokens=2)) == "I"
    assert [len(s.requests) for s in other.sessions] == [9, 9, 9]
    other.abort("I")
    assert all(r["status"] == "finished" for s in other.sessions for r in s.snapshot_requests() if r["label"] == "I")
    with pytest.raises(ValueError, match="one pool per model"):
        other.recording()


@pytest.mark.slow
def test_the_comparison_runs_to_its_end_and_the_biggest_cache_preempts_most():
    run = ScenarioRun.start("attention_memory")
    peak = {m: 0 for m in run.scenario.models}
    snap = None
    for _ in range(400):
        snap = run.step()
        for model, lane in zip(run.scenario.models, snap["lanes"]):
            run.lane(model).engine.check_integrity()
            peak[model] = max(peak[model], lane["requests"]["running"])
        if run.finished:
            break
    assert run.finished and snap["finished"] and snap["idle"]
    lanes = {lane["model"]: lane for lane in snap["lanes"]}
    assert all(lane["requests"]["finished"] == 8 and lane["tokens_held"] == 0 for lane in lanes.values())
    preemptions = [lanes[m]["snapshot"]["counters"]["num_preemptions_total"] for m in ("mha", "gqa", "mla")]
    assert preemptions[0] > preemptions[1] > preemptions[2] == 0
    assert peak["mha"] < peak["gqa"] <= peak["mla"] == 8
