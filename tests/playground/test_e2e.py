"""End to end over real sockets: daphne, two real Celery GPU workers, the real Redis and the real model.

Tests run in file order against one stack; the last one kills a worker.
"""
import asyncio
import json
import time

import pytest
import requests
from live_stack import ENGINE_ENV, running_stack
from websockets.asyncio.client import connect as aconnect
from websockets.sync.client import connect

pytestmark = pytest.mark.slow

WORKERS = ("w1@e2e", "w2@e2e")
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack(tmp_path_factory.mktemp("e2e"), WORKERS) as live:
        yield live


@pytest.fixture(scope="module")
def reference():
    """The engine itself, in this process, for the greedy texts the stack must reproduce."""
    from inference import LLM, SamplingParams

    llm = LLM(
        model="smollm2-135m-instruct",
        device="cpu",
        max_model_len=int(ENGINE_ENV["ENGINE_MAX_MODEL_LEN"]),
        num_kv_blocks=int(ENGINE_ENV["ENGINE_NUM_KV_BLOCKS"]),
    )

    def greedy(conversations: list[list[dict]], max_tokens: int) -> list[str]:
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        return [o.outputs[0].text for o in llm.chat(conversations, params, use_tqdm=False)]

    return greedy


def open_socket(stack, cookies: str = ""):
    headers = {"Cookie": cookies} if cookies else None
    return connect(stack.ws_url, origin=stack.base_url, additional_headers=headers, proxy=None, open_timeout=10)


def generate_frame(messages, conversation_id=None, **params):
    frame = {"type": "generate", "messages": messages, "params": {"temperature": 0, **params}}
    if conversation_id:
        frame["conversation_id"] = conversation_id
    return json.dumps(frame)


def receive(ws, timeout: float = 120) -> dict:
    return json.loads(ws.recv(timeout=timeout))


def run_turn(ws, messages, conversation_id=None, **params) -> tuple[dict, list[dict], dict]:
    ws.send(generate_frame(messages, conversation_id, **params))
    started = receive(ws)
    assert started["type"] == "started", started
    tokens = []
    while (frame := receive(ws))["type"] == "token":
        tokens.append(frame)
    assert frame["type"] == "done", frame
    return started, tokens, frame


def test_streamed_text_equals_saved_text_and_engine_greedy(stack, reference):
    browser = requests.Session()
    assert browser.get(stack.base_url + "/", timeout=30).status_code == 200
    cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())
    chat = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
    with open_socket(stack, cookie) as ws:
        _, tokens, done = run_turn(ws, chat, max_tokens=12)
    streamed = "".join(t["text"] for t in tokens)
    assert [t["seq"] for t in tokens] == list(range(len(tokens)))
    assert streamed == done["outputs"][0]["text"] == reference([chat], 12)[0]
    assert done["usage"]["completion_tokens"] >= 1 and done["usage"]["prompt_tokens"] > 10
    saved = browser.get(f"{stack.base_url}/api/conversations/{done['conversation_id']}/", timeout=30).json()
    assert [m["role"] for m in saved["messages"]] == ["system", "user", "assistant"]
    assert saved["messages"][-1]["content"] == streamed
    assert saved["messages"][-1]["usage"] == done["usage"]


def test_malformed_frames_and_bad_params_get_errors_and_the_socket_survives(stack):
    with open_socket(stack) as ws:
        for bad, needle in [
            ("{oops", "not valid JSON"),
            (json.dumps({"type": "generate", "messages": [{"role": "user", "content": "x"}],
                         "params": {"temperature": -1}}), "temperature"),
            (json.dumps({"type": "generate", "messages": [{"role": "assistant", "content": "x"}]}), "last message"),
            (json.dumps({"type": "cancel"}), "request_id"),
        ]:
            ws.send(bad)
            error = receive(ws, 10)
            assert error["type"] == "error" and needle in error["message"]
        _, _, done = run_turn(ws, [{"role": "user", "content": "Say hi."}], max_tokens=2)
        assert done["usage"]["completion_tokens"] >= 1


def test_cancel_stops_the_stream_and_frees_the_blocks(stack):
    chat = [{"role": "user", "content": "Write a long story about a dragon who learns to paint."}]
    with open_socket(stack) as ws:
        ws.send(generate_frame(chat, max_tokens=400))
        started = receive(ws)
        first = receive(ws)
        assert first["type"] == "token"
        cancelled_at = time.monotonic()
        ws.send(json.dumps({"type": "cancel", "request_id": started["request_id"]}))
        while (frame := receive(ws, 10))["type"] == "token":
            pass
        latency = time.monotonic() - cancelled_at
    assert frame["type"] == "done" and frame["outputs"][0]["finish_reason"] == "abort"
    assert latency < 1.0
    assert frame["usage"]["completion_tokens"] < 400
    worker = frame["worker"]
    stack.wait(lambda: stack.worker_metrics(worker)["num_blocks_used"] == 0, 3, "the aborted request's blocks")
    assert stack.worker_metrics(worker)["num_requests_running"] == 0


def test_sixteen_concurrent_clients_get_correct_texts(stack, reference):
    chats = [[{"role": "user", "content": f"Give me one word that rhymes with number {i}."}] for i in range(16)]
    expected = reference(chats, 8)

    async def client(chat):
        async with aconnect(stack.ws_url, origin=stack.base_url, proxy=None, open_timeout=30) as ws:
            await ws.send(generate_frame(chat, max_tokens=8))
            streamed = ""
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 300))
                if frame["type"] == "token":
                    streamed += frame["text"]
                elif frame["type"] in ("done", "error"):
                    return streamed, frame

    async def everyone():
        return await asyncio.gather(*(client(chat) for chat in chats))

    results = asyncio.run(everyone())
    for (streamed, done), want in zip(results, expected):
        assert done["type"] == "done", done
        assert streamed == done["outputs"][0]["text"] == want


def test_follow_up_turn_lands_on_the_same_worker_and_hits_its_prefix_cache(stack):
    for topic in ("the moon", "volcanoes"):
        chat = [SYSTEM, {"role": "user", "content": f"Tell me one fact about {topic}."}]
        with open_socket(stack) as ws:
            _, _, first = run_turn(ws, chat, max_tokens=10)
            history = chat + [{"role": "assistant", "content": first["outputs"][0]["text"]},
                              {"role": "user", "content": "And another one?"}]
            _, _, second = run_turn(ws, history, first["conversation_id"], max_tokens=4)
        assert second["worker"] == first["worker"]
        assert second["usage"]["cached_tokens"] > 0


def test_killed_worker_gives_the_client_an_error_within_ten_seconds(stack):
    chat = [{"role": "user", "content": "Count slowly from one to one hundred, one number per line."}]
    with open_socket(stack) as ws:
        # A long greedy reply (counting to one hundred), so the stream is surely still running when the
        # workers die. Any worker may serve it, so every worker is killed.
        ws.send(generate_frame(chat, max_tokens=400))
        assert receive(ws)["type"] == "started"
        assert receive(ws)["type"] == "token"
        for name in WORKERS:
            stack.kill_worker(name)
        killed_at = time.monotonic()
        while (frame := receive(ws, 15))["type"] == "token":
            pass
        waited = time.monotonic() - killed_at
    assert frame["type"] == "error" and any(name in frame["message"] for name in WORKERS)
    assert waited < 10
