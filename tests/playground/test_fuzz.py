"""Hypothesis fuzzing of the API and websocket inputs against the running embedded playground (real model):
no 500s, every answer well-formed, the chat socket survives everything, and afterwards no request is stuck
and no KV block is still held. Bounded: few examples, tiny generations (server caps max_tokens at 8)."""
import json

import pytest
from api_server import MODEL, start
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

pytestmark = pytest.mark.slow

FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
API_STATUSES = {200, 400, 401, 404, 405, 413, 429}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
words = st.text(min_size=1, max_size=40).filter(str.strip)
SAMPLING = {
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.05, 1),
    "top_k": st.integers(-1, 50),
    "min_p": st.floats(0, 0.5),
    "repetition_penalty": st.floats(0.5, 2),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "seed": st.integers(0, 2**32),
    "stop": st.one_of(words.map(lambda w: w[:4]), st.lists(words.map(lambda w: w[:4]), max_size=2)),
    "max_tokens": st.integers(1, 8),
    "n": st.integers(1, 2),
}
messages = st.builds(
    lambda system, turns, last: system + turns + [{"role": "user", "content": last}],
    st.lists(words.map(lambda w: {"role": "system", "content": w}), max_size=1),
    st.lists(st.tuples(words, words), max_size=2).map(
        lambda pairs: [m for q, a in pairs for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]
    ),
    words,
)
# Token ids mostly inside SmolLM2's vocabulary (49,152), some past it (the worker's 400), biases beyond the clamp.
logit_biases = st.dictionaries(st.integers(0, 50_000).map(str), st.floats(-150, 150), max_size=3)
API_COMMON = {**SAMPLING, "stream": st.booleans(),
              "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans(),
                                                                    "continuous_usage_stats": st.booleans()}),
              "logit_bias": logit_biases, "prompt_logprobs": st.integers(-1, 21)}
chat_bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": messages},
    optional={**API_COMMON, "logprobs": st.booleans(), "max_completion_tokens": st.integers(1, 8)},
)
completion_bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL), "prompt": words}, optional={**API_COMMON, "logprobs": st.integers(0, 5)}
)
tokenize_bodies = st.one_of(
    st.fixed_dictionaries({"prompt": words}, optional={"model": st.just(MODEL), "add_special_tokens": st.booleans(),
                                                       "return_token_strs": st.booleans()}),
    st.fixed_dictionaries({"messages": messages}, optional={"model": st.just(MODEL), "return_token_strs": st.booleans(),
                                                            "add_generation_prompt": st.booleans()}),
)
detokenize_bodies = st.fixed_dictionaries({"tokens": st.lists(st.integers(0, 60_000), max_size=8)},
                                          optional={"model": st.just(MODEL)})
generate_frames = st.fixed_dictionaries(
    {"type": st.just("generate"), "messages": messages},
    optional={"params": st.fixed_dictionaries({}, optional=SAMPLING), "conversation_id": st.none()},
)


def spoiled(valid, fields: list[str]):
    """A valid object with one field (known or not) set to anything at all."""
    return st.tuples(valid, st.sampled_from([*fields, "junk"]), json_values).map(lambda t: {**t[0], t[1]: t[2]})


def api_bodies(valid, extra_fields: list[str]):
    fields = ["model", "stream", "stream_options", *SAMPLING, *extra_fields]
    as_json = st.one_of(valid, valid, spoiled(valid, fields)).map(lambda body: json.dumps(body).encode())
    return st.one_of(as_json, st.binary(max_size=40))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = start(tmp_path_factory.mktemp("fuzz"), {"PLAYGROUND_MAX_TOKENS": "8", "PLAYGROUND_MAX_N": "2"})
    live.key = live.api_key("fuzzer")
    yield live
    live.stop()


def check_api_answer(status: int, body: bytes, stream_asked: bool, answer_key: str = "choices") -> None:
    assert status in API_STATUSES, (status, body[:300])
    if status != 200:
        error = json.loads(body)["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str)
        return
    if stream_asked:
        events = [line for line in body.decode().split("\n\n") if line]
        assert events[-1] == "data: [DONE]"
        for event in events[:-1]:
            assert "error" not in json.loads(event.removeprefix("data: ")), event
    else:
        assert answer_key in json.loads(body)


@pytest.mark.parametrize(
    "path, bodies",
    [
        ("/v1/chat/completions", api_bodies(chat_bodies, ["messages", "logprobs", "top_logprobs", "max_completion_tokens",
                                                          "logit_bias", "prompt_logprobs"])),
        ("/v1/completions", api_bodies(completion_bodies, ["prompt", "logprobs", "echo", "logit_bias",
                                                           "prompt_logprobs"])),
        ("/tokenize", api_bodies(tokenize_bodies, ["prompt", "messages", "add_special_tokens", "return_token_strs"])),
        ("/detokenize", api_bodies(detokenize_bodies, ["tokens"])),
    ],
)
def test_api_inputs_never_cause_a_server_error(server, path, bodies):
    statuses = []

    @FUZZ
    @given(body=bodies)
    def fuzz(body: bytes) -> None:
        headers = {"Authorization": f"Bearer {server.key}", "Content-Type": "application/json"}
        status, answer = server.post(path, body, headers)
        statuses.append(status)
        try:
            asked = json.loads(body)
        except ValueError:
            asked = {}
        asked = asked if isinstance(asked, dict) else {}
        stream_asked = asked.get("stream") is True and "tokenize" not in path
        check_api_answer(status, answer, stream_asked,
                         {"/tokenize": "tokens", "/detokenize": "prompt"}.get(path, "choices"))
        generated = status == 200 and path.endswith("completions") and not stream_asked
        if generated and asked.get("prompt_logprobs") is not None:
            reply = json.loads(answer)  # vLLM's places: beside a chat's choices, in each completion choice
            entries = reply["prompt_logprobs"] if "messages" in asked else reply["choices"][0]["prompt_logprobs"]
            assert entries[0] is None and all(isinstance(e, dict) and e for e in entries[1:])

    fuzz()
    assert 200 in statuses and 400 in statuses  # both served and refused inputs were tried
    server.wait_idle()


ws_frames = st.one_of(
    generate_frames.map(json.dumps),
    spoiled(generate_frames, ["type", "messages", "params", "conversation_id"]).map(json.dumps),
    generate_frames.flatmap(
        lambda frame: spoiled(st.just(frame.get("params", {})), list(SAMPLING)).map(lambda p: {**frame, "params": p})
    ).map(json.dumps),
    st.fixed_dictionaries({"type": st.just("cancel"), "request_id": json_values}).map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=30),
)


def test_websocket_frames_never_break_the_socket(server):
    outcomes = []
    with connect(server.ws_url, origin=server.base_url, proxy=None, open_timeout=30) as ws:

        @FUZZ
        @given(frame=ws_frames)
        def fuzz(frame: str) -> None:
            ws.send(frame)
            answer = json.loads(ws.recv(timeout=60))
            outcomes.append(answer["type"])
            if answer["type"] == "error":  # refused: exactly one error, no request started
                assert "request_id" not in answer and answer["message"] != "internal server error", answer
                return
            assert answer["type"] == "started", answer
            while True:  # a generation: deltas until its done (or a reasoned error)
                frame_back = json.loads(ws.recv(timeout=120))
                assert frame_back["type"] in ("token", "done", "error"), frame_back
                if frame_back["type"] != "token":
                    assert frame_back["request_id"] == answer["request_id"]
                    assert frame_back.get("message") != "internal server error"
                    return

        fuzz()
        assert "started" in outcomes and "error" in outcomes
        ws.send(json.dumps({"type": "generate", "messages": [{"role": "user", "content": "Hi"}],
                            "params": {"max_tokens": 2}}))
        assert json.loads(ws.recv(timeout=60))["type"] == "started"  # the socket still serves
        while json.loads(ws.recv(timeout=120))["type"] == "token":
            pass
    metrics = server.wait_idle()
    assert metrics["num_blocks_free"] + metrics["num_blocks_cached"] == metrics["num_blocks_total"]
