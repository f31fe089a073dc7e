"""The one pool view: the block manager's `PoolView` equals the event replay's after every step of a run
under memory pressure (prefix hits, n-sample forks with copy-on-write, beam forks, preemption, eviction,
an abort), and every invariant holds after each step. A tiny random model keeps it fast."""

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from inference import LLM, SamplingParams
from inference.beam_search import BeamSearchParams
from inference.events import BlockMapReplay, Recording
from inference.pool_view import PoolView
from tests.inference.tiny_models import SHAPE, save_tiny


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny(folder, LlamaForCausalLM, LlamaConfig(**SHAPE, tie_word_embeddings=False))
    llm = LLM(model=str(folder), device="cpu", dtype="float32", num_kv_blocks=12, block_size=8,
              max_model_len=64, max_num_seqs=8, max_num_batched_tokens=32)
    yield llm.llm_engine
    llm.close()


def tokens(*runs: range) -> dict:
    return {"prompt_token_ids": [t for run in runs for t in run]}


def test_the_pool_view_equals_the_replay_after_every_step(tiny_engine):
    engine = tiny_engine
    engine.start_recording(limit=100_000)
    replay = BlockMapReplay.starting_from(engine.runner.num_blocks, engine.events.recording.initial)
    greedy = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    shared = range(100, 124)  # three full blocks that every request but "c" starts with
    engine.add_request("a", tokens(shared, range(200, 203)), greedy)
    engine.add_request("b", tokens(shared, range(300, 305)), greedy)
    engine.add_request("c", tokens(range(400, 406)), SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=10,
                                                                   ignore_eos=True))
    engine.add_beam_search("d", tokens(shared, range(500, 502)), BeamSearchParams(beam_width=3, max_tokens=6,
                                                                                   ignore_eos=True))
    applied, step = 0, 0
    while engine.has_unfinished_requests():
        engine.step()
        step += 1
        if step == 2:
            engine.add_request("e", tokens(shared, range(200, 203)), greedy)  # a's prompt: prefix hits
        if step == 5:
            engine.abort_request("b")
        recorded = engine.events.recording.events
        for event in recorded[applied:]:
            replay.apply(event)
        applied = len(recorded)
        view = engine.pool_view()
        assert view == replay.view, f"step {step}"
        assert engine.metrics()["block_map"] == view.block_map()
        engine.check_integrity()
    recording: Recording = engine.stop_recording()
    assert not recording.truncated
    kinds = {e.kind for e in recording.events}
    assert {"touched", "forked", "copy_on_write", "preempted", "evicted", "freed", "cached"} <= kinds, kinds
    assert replay.view == engine.pool_view() and not any(replay.view.ref_counts)


def test_a_view_names_each_blocks_state_and_owners_once():
    view = PoolView([3, 1, 0, 0], ["h0", None, "h2", None], tables={7: [0, 1], 8: [0], 9: [0]},
                    owners={7: "x", 8: "x", 9: "y"})
    assert [view.state(b) for b in range(4)] == ["used", "used", "cached", "free"]
    assert view.block_owners() == {0: ["x", "y"], 1: ["x"]}
    assert view.block_map()[0] == {"state": "used", "ref_count": 3, "owners": ["x", "y"]}
    assert PoolView.from_initial(view.to_initial()) == view
    assert view != PoolView([3, 1, 0, 0], ["h0", None, None, None], view.tables, view.owners)
