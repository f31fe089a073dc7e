"""StreamingEngine: many callers, one loop thread; deltas add up to the final text; aborts free blocks."""

import asyncio
import threading
import time

import pytest

from inference import SamplingParams, StreamingEngine
from tests.inference.engines import get_llm
from tests.inference.oracle_prompts import ORACLE_PROMPTS
from tests.inference.test_openmp import native_thread_counts


@pytest.fixture(scope="module")
def engine():
    engine = StreamingEngine(num_kv_blocks=256, dtype="float32")
    engine.start()
    yield engine
    engine.shutdown()


def idle(engine):
    engine.engine.check_integrity()
    return engine.engine.metrics()["num_blocks_used"] == 0


def collect(stream):
    texts, ids = {}, {}
    for delta in stream:
        texts[delta.index] = texts.get(delta.index, "") + delta.text
        ids.setdefault(delta.index, []).extend(delta.token_ids)
    return texts, ids


def test_deltas_concatenate_to_the_offline_greedy_output(engine):
    params = SamplingParams(temperature=0, max_tokens=20)
    offline = get_llm().generate(ORACLE_PROMPTS[:4], params)
    streams = [engine.add_request(p, params) for p in ORACLE_PROMPTS[:4]]
    for stream, want in zip(streams, offline):
        texts, ids = collect(stream)
        assert texts[0] == stream.final.outputs[0].text == want.outputs[0].text
        assert ids[0] == want.outputs[0].token_ids
    assert idle(engine)


def test_concurrent_threads_share_one_batch(engine):
    params = SamplingParams(temperature=0, max_tokens=12)
    results = {}

    def client(i):
        stream = engine.add_request(ORACLE_PROMPTS[i % 8], params)
        results[i] = collect(stream)[0][0]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    offline = get_llm().generate(ORACLE_PROMPTS, params)
    assert [results[i] for i in range(8)] == [o.outputs[0].text for o in offline]
    assert idle(engine)


def test_a_reader_of_many_streams_is_woken_once_a_step(engine, monkeypatch):
    """One callback shared by several streams (the worker's token publisher) is called once per step, after all
    of the step's deltas are queued, not once per stream while the loop is still queuing them."""
    steps = [0]
    step = engine.engine.step

    def counted_step():
        steps[0] += 1
        return step()

    monkeypatch.setattr(engine.engine, "step", counted_step)
    woken_at: list[int] = []
    streams = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
               for p in ORACLE_PROMPTS[:4]]

    def wake():  # on the loop thread
        woken_at.append(steps[0])

    for stream in streams:
        stream.on_put = wake
    for stream in streams:
        collect(stream)
    assert len(woken_at) >= 5  # the streams shared most of their 10 steps
    assert len(woken_at) == len(set(woken_at))  # never twice in one step
    assert idle(engine)


def test_async_iteration_and_chat_messages(engine):
    async def run():
        stream = engine.add_request(None, SamplingParams(temperature=0, max_tokens=16),
                                    messages=[{"role": "user", "content": "Name a fruit."}])
        return "".join([d.text async for d in stream]), stream

    text, stream = asyncio.run(run())
    assert text == stream.final.outputs[0].text and text


def test_abort_frees_blocks_and_ends_the_stream(engine):
    stream = engine.add_request("Count to one thousand:", SamplingParams(temperature=0, max_tokens=500,
                                                                         ignore_eos=True))
    first = stream.get(timeout=60)
    assert first is not None
    engine.abort(stream.request_id)
    rest = list(stream)
    assert rest and rest[-1].finished and rest[-1].finish_reason == "abort"
    assert stream.final.outputs[0].finish_reason == "abort"
    assert len(stream.final.outputs[0].token_ids) < 500
    assert idle(engine)


def test_bad_request_fails_alone_while_others_run(engine):
    good = engine.add_request("Tell me about cats.", SamplingParams(temperature=0, max_tokens=16))
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("word " * 9000, SamplingParams(max_tokens=4))  # past the window (the pool's 4,096 tokens)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("", SamplingParams(max_tokens=4))
    texts, _ = collect(good)
    assert good.final.outputs[0].finish_reason in ("stop", "length") and texts[0] == good.final.outputs[0].text
    assert idle(engine)


def test_stream_holds_back_a_possible_stop_string(engine):
    params = SamplingParams(temperature=0, max_tokens=20, stop=" 7,")
    texts, _ = collect(engine.add_request("1, 2, 3, 4,", params))
    assert texts[0] == " 5, 6,"


def test_background_calls_run_on_the_loop_thread_when_idle(engine):
    loop_thread = engine.call(lambda _: threading.get_ident()).result(10)
    assert engine.call_in_background(lambda e: (threading.get_ident(), e is engine.engine)).result(10) == (
        loop_thread, True)
    with pytest.raises(ZeroDivisionError):
        engine.call_in_background(lambda _: 1 / 0).result(10)


def test_background_calls_take_a_small_share_of_a_busy_loop(engine):
    """While a live request decodes, 10 ms background calls queued all the while get no more than
    BACKGROUND_SHARE of the loop's time (plus the saved credit and one call's overrun), yet they do run."""
    cost_s, spent, done = 0.01, [], threading.Event()

    def work(_):
        began = time.perf_counter()
        while time.perf_counter() - began < cost_s:
            pass
        spent.append(cost_s)

    def feeder():
        while not done.is_set():
            engine.call_in_background(work).result(30)

    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    started = time.perf_counter()
    stream = engine.add_request(ORACLE_PROMPTS[0], params)
    thread = threading.Thread(target=feeder)
    thread.start()
    collect(stream)
    busy_s = time.perf_counter() - started
    during = sum(spent)
    done.set()
    thread.join(30)
    share = engine.BACKGROUND_SHARE
    assert 0 < during <= share * busy_s + engine.BACKGROUND_BURST_S + cost_s
    assert stream.final.outputs[0].finish_reason == "length"
    assert idle(engine)


def test_metrics_keep_the_block_map_with_its_tables_between_rebuilds(engine):
    """The map is rebuilt every ~100 ms while busy and carried over between; its block tables (`sequences`) must
    go with it, or a dashboard sampling a few times a second sees the map of a running batch only by luck."""
    params = SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=64, ignore_eos=True)
    prompt = " ".join(ORACLE_PROMPTS) * 2  # several full blocks, which the two samples share
    stream = engine.add_request(prompt, params)
    reader = threading.Thread(target=collect, args=(stream,))
    reader.start()
    samples = []
    while reader.is_alive():
        samples.append(engine.metrics())
        time.sleep(0.005)
    reader.join()
    busy = [m for m in samples if m["num_requests_running"]]
    assert busy and all("sequences" in m for m in busy)
    assert any(len(m["sequences"]) == 2 and m["num_blocks_shared"] for m in busy)
    assert idle(engine)



def test_building_a_streaming_engine_leaves_the_caller_without_an_openmp_team():
    """Loading runs OpenMP regions; a thread that ran one keeps a team of threads while it lives, and with the
    loop thread's team beside it libgomp throttles every idle thread's spin (each step ~15% slower on two
    vCPUs). StreamingEngine builds on a thread that ends; building on this thread, as before, keeps one more."""
    before, streaming, direct = native_thread_counts("""
from inference import StreamingEngine
from inference.config import EngineArgs
from inference.engine import LLMEngine

count()
StreamingEngine(num_kv_blocks=64, dtype="float32")
count()
LLMEngine(EngineArgs(num_kv_blocks=64, dtype="float32"))
count()
""")
    assert streaming == before
    assert direct == before + 1  # the caller's team: the count can see one
