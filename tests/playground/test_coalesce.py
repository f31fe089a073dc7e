"""The worker's token publisher: first text at once, then few events per request, nothing lost, `seq`
contiguous, the future resolved only after the last text went out, one message per web process for the
requests due together (the task threads' own events with them), and a failure confined to its web process's
requests."""
import queue
import threading
import time
from dataclasses import dataclass

import pytest

from playground.serving.worker.bridge import LoopBridge
from playground.serving.shared.naming import BATCH
from playground.serving.worker.coalesce import TokenPublisher

WEB = "specific.web-a!inbox"  # a web process's inbox, where every request here replies unless told otherwise


@dataclass
class D:
    index: int
    text: str
    token_ids: tuple[int, ...] = (0,)  # one token per delta


class TimedSource:
    """Yields scripted deltas at given offsets (seconds from its creation), then ends."""

    def __init__(self, script: list[tuple[float, D]]) -> None:
        self.q: queue.Queue = queue.Queue()
        self.on_put = None
        self.num_prompt_tokens = 7
        self.put_at: list[float] = []
        start = time.monotonic()

        def feed() -> None:
            for at, delta in script + [(script[-1][0] if script else 0.0, None)]:
                time.sleep(max(0.0, start + at - time.monotonic()))
                self.q.put(delta)
                self.put_at.append(time.monotonic())
                if self.on_put is not None:
                    self.on_put()

        threading.Thread(target=feed, daemon=True).start()

    def get(self, timeout=None):
        return self.q.get(timeout=timeout)


class Recorder:
    """A channel layer's send that keeps (time, channel, message); fails for the channels in `failing`."""

    def __init__(self, failing: tuple[str, ...] = ()) -> None:
        self.sent: list[tuple[float, str, dict]] = []
        self.failing = failing

    async def __call__(self, channel: str, message: dict) -> None:
        if channel in self.failing:
            raise ConnectionError("layer down")
        assert message["type"] == BATCH
        self.sent.append((time.monotonic(), channel, message))

    def messages(self, request_id: str) -> list[tuple[float, dict]]:
        """The request's events, each with the time its message was sent."""
        return [(at, event) for at, _, message in self.sent for event in message["events"]
                if event["request_id"] == request_id]


@pytest.fixture
def bridge():
    bridge = LoopBridge()
    bridge.start()
    yield bridge
    bridge.stop()


def publish(bridge, scripts: dict[str, list], interval: float, send: Recorder | None = None):
    """Publish one scripted stream per request id; returns the recorder and each request's future."""
    send = send or Recorder()
    publisher = TokenPublisher(bridge, interval, send)
    futures = {request_id: publisher.publish(request_id, TimedSource(script), WEB)
               for request_id, script in scripts.items()}
    for future in futures.values():
        future.exception(timeout=5)  # wait for the end, whatever it is
    return send, futures


def chunks(messages) -> list[dict]:
    return [chunk for _, message in messages for chunk in message["chunks"]]


def test_burst_is_coalesced_and_text_is_complete(bridge):
    script = [(0.0, D(0, "a"))] + [(0.001 * i, D(0, str(i % 10))) for i in range(1, 200)]
    start = time.monotonic()
    send, futures = publish(bridge, {"r": script}, interval=0.05)
    messages = send.messages("r")
    assert "".join(c["text"] for c in chunks(messages)) == "a" + "".join(str(i % 10) for i in range(1, 200))
    assert len(messages) < 20  # 200 deltas in ~0.2 s at one send per 50 ms
    assert chunks(messages)[0]["text"].startswith("a") and messages[0][0] - start < 0.04  # the first at once
    assert all(m["type"] == "gen.tokens" and m["request_id"] == "r" for _, m in messages)
    seqs = [c["seq"] for c in chunks(messages)]
    assert seqs == list(range(len(seqs))) and futures["r"].result() == len(seqs)


def test_sends_are_spaced_and_buffered_text_waits_at_most_one_interval(bridge):
    start = time.monotonic()
    send, _ = publish(bridge, {"r": [(0.0, D(0, "x")), (0.01, D(0, "y")), (0.5, D(0, "z"))]}, interval=0.1)
    messages = send.messages("r")
    assert [c["text"] for c in chunks(messages)] == ["x", "y", "z"]
    # "y" arrived 10 ms after "x" was sent: it waits for the interval, not for the next delta at 0.5 s.
    assert 0.08 <= messages[1][0] - start <= 0.3


def test_samples_are_kept_apart_by_index(bridge):
    script = [(0.0, D(0, "a")), (0.0, D(1, "b")), (0.001, D(1, "c")), (0.002, D(0, "d")), (0.003, D(2, ""))]
    send, _ = publish(bridge, {"r": script}, interval=0.05)
    by_index: dict[int, str] = {}
    for chunk in chunks(send.messages("r")):
        by_index[chunk["index"]] = by_index.get(chunk["index"], "") + chunk["text"]
    assert by_index == {0: "ad", 1: "bc", 2: ""}  # sample 2's first token has no text, and still goes out


def test_a_first_token_without_text_goes_out_at_once_later_ones_wait_for_text(bridge):
    """The stream opens with the first token, text or not (a special token, half a UTF-8 character): a client
    times its first token by it. Later tokens without text are counted with the next text, not sent alone."""
    start = time.monotonic()
    script = [(0.0, D(0, "")), (0.2, D(0, "")), (0.3, D(0, "hi"))]
    send, futures = publish(bridge, {"r": script}, interval=0.05)
    messages = send.messages("r")
    assert [(c["text"], c["tokens"]) for c in chunks(messages)] == [("", 1), ("hi", 2)]
    assert messages[0][0] - start < 0.15 and messages[1][0] - start >= 0.3


def test_empty_stream_sends_nothing(bridge):
    send, futures = publish(bridge, {"r": []}, interval=0.01)
    assert send.sent == [] and futures["r"].result() == 0


def test_many_streams_share_the_publisher_each_complete_in_its_own_group(bridge):
    scripts = {f"r{n}": [(0.002 * i + 0.001 * n, D(0, f"{n}:{i};")) for i in range(100)] for n in range(16)}
    send, futures = publish(bridge, scripts, interval=0.03)
    for n in range(16):
        messages = send.messages(f"r{n}")
        assert "".join(c["text"] for c in chunks(messages)) == "".join(f"{n}:{i};" for i in range(100))
        assert [c["seq"] for c in chunks(messages)] == list(range(len(messages)))
        assert len(messages) < 20 and futures[f"r{n}"].result() == len(messages)


def test_requests_due_together_share_one_message_per_web_process(bridge):
    """An engine step fills every stream at once: its text leaves as one message per web process (the
    request's `reply_to`), not one per request."""

    class Filled:  # every delta already queued, then the end
        on_put = None
        num_prompt_tokens = 3

        def __init__(self, text: str) -> None:
            self.q: queue.Queue = queue.Queue()
            for character in text:
                self.q.put(D(0, character))
            self.q.put(None)

        def get(self, timeout=None):
            return self.q.get(timeout=timeout) if timeout else self.q.get_nowait()

    send = Recorder()
    publisher = TokenPublisher(bridge, 0.05, send)
    channels = {f"r{n}": ("specific.web-a!inbox", "specific.web-b!inbox")[n % 2] for n in range(16)}
    futures: dict[str, object] = {}

    def publish_all() -> None:  # in one turn of the loop: the publisher's first pass sees all sixteen
        for request_id, channel in channels.items():
            futures[request_id] = publisher.publish(request_id, Filled(f"{request_id}!"), channel)

    bridge.loop.call_soon_threadsafe(publish_all)
    time.sleep(0.2)
    assert all(future.result(timeout=5) == 1 for future in futures.values())
    assert sorted(channel for _, channel, _ in send.sent) == ["specific.web-a!inbox", "specific.web-b!inbox"]
    for _, channel, message in send.sent:
        assert sorted(e["request_id"] for e in message["events"]) == sorted(r for r, c in channels.items()
                                                                            if c == channel)
        assert all(e["type"] == "gen.tokens" and e["prompt_tokens"] == 3 and
                   e["chunks"] == [{"index": 0, "seq": 0, "text": f"{e['request_id']}!", "tokens": len(e["request_id"]) + 1}]
                   for e in message["events"])


def test_the_future_resolves_only_after_the_last_text_was_sent(bridge):
    send = Recorder()
    publisher = TokenPublisher(bridge, 0.05, send)
    future = publisher.publish("r", TimedSource([(0.0, D(0, "a")), (0.01, D(0, "b")), (0.02, D(0, "c"))]), WEB)
    seen_at_end: list[str] = []
    future.add_done_callback(lambda _: seen_at_end.append("".join(c["text"] for c in chunks(send.messages("r")))))
    future.result(timeout=5)
    assert seen_at_end == ["abc"]


def test_task_threads_events_ride_in_one_message_after_each_request_s_last_text(bridge):
    """`post` (a task thread's `gen.done`): events posted while the loop was busy leave together, as one
    message to their web process, each after its request's text; each future resolves once its event went."""
    send = Recorder()
    publisher = TokenPublisher(bridge, 0.05, send)
    streams = {f"r{n}": publisher.publish(f"r{n}", TimedSource([(0.0, D(0, "x")), (0.01, D(0, "y"))]), WEB)
               for n in range(8)}
    assert all(future.result(timeout=5) >= 1 for future in streams.values())
    release = threading.Event()
    bridge.loop.call_soon_threadsafe(release.wait, 5)  # the loop busy while every event is posted
    sent = [publisher.post(WEB, {"type": "gen.done", "request_id": r}) for r in streams]
    release.set()
    assert [future.result(timeout=5) for future in sent] == [None] * len(streams)
    dones = [message for _, _, message in send.sent if any(e["type"] == "gen.done" for e in message["events"])]
    assert len(dones) == 1 and sorted(e["request_id"] for e in dones[0]["events"]) == sorted(streams)
    for request_id in streams:
        events = [event for _, event in send.messages(request_id)]
        assert [e["type"] for e in events][-1] == "gen.done"
        assert "".join(c["text"] for e in events[:-1] for c in e["chunks"]) == "xy"


def test_a_posted_event_leaves_at_once_and_a_failed_send_reaches_its_poster(bridge):
    send = Recorder(failing=("specific.web-down!inbox",))
    publisher = TokenPublisher(bridge, 1.0, send)  # a long interval: the event must not wait for it
    began = time.monotonic()
    publisher.deliver(WEB, {"type": "gen.accepted", "request_id": "a", "worker": "w"})
    assert time.monotonic() - began < 0.5
    assert [event for _, event in send.messages("a")] == [{"type": "gen.accepted", "request_id": "a", "worker": "w"}]
    with pytest.raises(ConnectionError):
        publisher.deliver("specific.web-down!inbox", {"type": "gen.done", "request_id": "b"})
    publisher.deliver(WEB, {"type": "gen.done", "request_id": "a"})  # the publisher goes on for other channels
    assert [event["type"] for _, event in send.messages("a")] == ["gen.accepted", "gen.done"]


def test_held_events_lead_the_next_message_or_leave_after_one_interval(bridge):
    """`post(hold=True)` (a task thread's `gen.accepted`): a burst's held events share messages instead of one
    each; one alone leaves within an interval; one held when its request's first text is due leads that
    message; a held event never delays text, nor an event posted without `hold`."""
    send = Recorder()
    publisher = TokenPublisher(bridge, 0.2, send)
    began = time.monotonic()
    held = [publisher.post(WEB, {"type": "gen.accepted", "request_id": f"h{n}"}, hold=True) for n in range(10)]
    assert [future.result(timeout=5) for future in held] == [None] * 10
    assert len(send.sent) == 1 and [e["request_id"] for e in send.sent[0][2]["events"]] == [f"h{n}" for n in range(10)]
    assert 0.15 <= send.sent[0][0] - began < 1.0  # it waited for the interval: nothing else went to WEB meanwhile

    accepted = publisher.post(WEB, {"type": "gen.accepted", "request_id": "r"}, hold=True)
    stream = publisher.publish("r", TimedSource([(0.02, D(0, "x"))]), WEB)
    assert stream.result(timeout=5) == 1 and accepted.result(timeout=5) is None
    (first_at, first), *_ = send.messages("r")
    assert first["type"] == "gen.accepted"
    assert send.messages("r")[1][1]["chunks"][0]["text"] == "x" and send.messages("r")[1][0] == first_at

    publisher.post(WEB, {"type": "gen.accepted", "request_id": "q"}, hold=True)
    began = time.monotonic()
    publisher.deliver(WEB, {"type": "gen.done", "request_id": "q"})  # not held: at once, the held one before it
    assert time.monotonic() - began < 0.15
    assert [event["type"] for _, event in send.messages("q")] == ["gen.accepted", "gen.done"]


def test_a_failing_send_fails_its_web_process_and_a_failing_stream_its_request(bridge):
    class Broken:
        def get(self, timeout=None):
            raise RuntimeError("stream broke")

    send = Recorder(failing=("specific.web-down!inbox",))
    publisher = TokenPublisher(bridge, 0.02, send)
    good = publisher.publish("good", TimedSource([(0.01 * i, D(0, "g")) for i in range(20)]), WEB)
    bad = publisher.publish("bad", TimedSource([(0.0, D(0, "b"))]), "specific.web-down!inbox")
    broken = publisher.publish("broken", Broken(), WEB)
    with pytest.raises(ConnectionError):
        bad.result(timeout=5)
    with pytest.raises(RuntimeError, match="stream broke"):
        broken.result(timeout=5)
    assert good.result(timeout=5) == len(send.messages("good"))
    assert "".join(c["text"] for c in chunks(send.messages("good"))) == "g" * 20


def test_streams_are_polled_once_per_interval_after_their_first_text(bridge):
    class Counting(TimedSource):
        polls = 0

        def get(self, timeout=None):
            self.polls += 1
            return super().get(timeout)

    source = Counting([(0.0, D(0, "a")), (0.5, D(0, "b"))])
    send = Recorder()
    TokenPublisher(bridge, 0.05, send).publish("r", source, WEB).result(timeout=5)
    assert [c["text"] for c in chunks(send.messages("r"))] == ["a", "b"]
    assert source.polls < 0.5 / 0.05 + 8  # about one empty poll per interval while waiting for "b"


def test_text_after_a_quiet_spell_leaves_when_queued_not_at_the_next_tick(bridge):
    """The stream wakes the publisher: "b", queued 0.5 s after "a" (2.5 intervals), goes out within a few
    milliseconds, where polling once per interval would have held it until the tick at 0.6 s."""
    source = TimedSource([(0.0, D(0, "a")), (0.5, D(0, "b"))])
    send = Recorder()
    TokenPublisher(bridge, 0.2, send).publish("r", source, WEB).result(timeout=5)
    (_, first), (sent_b, second) = send.messages("r")
    assert [c["text"] for c in first["chunks"] + second["chunks"]] == ["a", "b"]
    assert sent_b - source.put_at[1] < 0.05


def test_a_waiting_task_gives_up_when_the_loop_stops():
    bridge = LoopBridge()
    bridge.start()
    publisher = TokenPublisher(bridge, 0.02, Recorder())
    endless = TimedSource([(0.0, D(0, "a")), (60.0, D(0, "b"))])
    outcome: list[BaseException] = []

    def task() -> None:
        try:
            publisher.stream("r", endless, WEB)
        except RuntimeError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=task)
    thread.start()
    time.sleep(0.1)
    bridge.stop()
    thread.join(timeout=5)
    assert not thread.is_alive() and "loop stopped" in str(outcome[0])


def test_paced_requests_share_the_event_budget_while_many_stream_and_their_ends_are_not_held(bridge):
    """16 live requests and 40 paced events a second: a paced request's events come live / 40 s apart (0.4 s
    while all 16 stream; its text merged meanwhile), after its first token at once; an unpaced one (the API's)
    keeps the 20 ms interval; each stream's last text leaves as soon as it ends. On a loaded machine some
    streams end early, so each gap is held to the live count when it closed."""
    send = Recorder()
    publisher = TokenPublisher(bridge, 0.02, send, paced_events_per_s=40)
    start = time.monotonic()
    sources = {f"{kind}{n}": TimedSource([(0.01 * i, D(0, f"{i};")) for i in range(120)])
               for kind in ("paced", "api") for n in range(8)}
    futures = {request_id: publisher.publish(request_id, source, WEB, paced=request_id.startswith("paced"))
               for request_id, source in sources.items()}
    for future in futures.values():
        future.result(timeout=10)
    ends = [send.messages(request_id)[-1][0] for request_id in sources]
    for request_id, source in sources.items():
        messages = send.messages(request_id)
        assert "".join(c["text"] for c in chunks(messages)) == "".join(f"{i};" for i in range(120))
        times = [at for at, _ in messages]
        assert times[0] - start < 0.1  # the first token at once
        assert times[-1] - source.put_at[-1] < 0.1  # the end is not held
        gaps = [b - a for a, b in zip(times, times[1:-1])]  # between events before the last
        if request_id.startswith("paced"):
            live = [sum(end >= at for end in ends) for at in times[1:-1]]
            assert live[0] == 16 and len(messages) <= 6, (live, gaps)
            assert all(gap >= n / 40 - 0.02 for gap, n in zip(gaps, live)), (live, gaps)
        else:
            assert len(messages) >= 30 and max(gaps) < 0.1, gaps
