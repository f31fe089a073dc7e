"""Coalescing engine deltas: first text at once, then batches at most every interval, nothing lost."""
import queue
import threading
import time
from dataclasses import dataclass

from playground.serving.coalesce import pump


@dataclass
class D:
    index: int
    text: str


class TimedSource:
    """Yields scripted deltas at given offsets (seconds from the first get), then ends."""

    def __init__(self, script: list[tuple[float, D]]) -> None:
        self.q: queue.Queue = queue.Queue()
        start = time.monotonic()

        def feed() -> None:
            for at, delta in script:
                time.sleep(max(0.0, start + at - time.monotonic()))
                self.q.put(delta)
            self.q.put(None)

        threading.Thread(target=feed, daemon=True).start()

    def get(self, timeout=None):
        return self.q.get(timeout=timeout)


def run(script, interval):
    sent = []
    count = pump(TimedSource(script), lambda chunks: sent.append((time.monotonic(), chunks)), interval)
    return sent, count


def test_burst_is_coalesced_and_text_is_complete():
    script = [(0.0, D(0, "a"))] + [(0.001 * i, D(0, str(i % 10))) for i in range(1, 200)]
    sent, count = run(script, interval=0.05)
    texts = "".join(c["text"] for _, chunks in sent for c in chunks)
    assert texts == "a" + "".join(str(i % 10) for i in range(1, 200))
    assert len(sent) < 20  # 200 deltas in ~0.2 s at one send per 50 ms
    assert sent[0][1][0]["text"].startswith("a")
    seqs = [c["seq"] for _, chunks in sent for c in chunks]
    assert seqs == list(range(len(seqs))) and count == len(seqs)


def test_sends_are_spaced_and_buffered_text_waits_at_most_one_interval():
    script = [(0.0, D(0, "x")), (0.01, D(0, "y")), (0.5, D(0, "z"))]
    start = time.monotonic()
    sent, _ = run(script, interval=0.1)
    assert [c["text"] for _, chunks in sent for c in chunks] == ["x", "y", "z"]
    # "y" arrived 10 ms after "x" was sent: it waits for the interval, not for the next delta at 0.5 s.
    assert 0.08 <= sent[1][0] - start <= 0.3


def test_samples_are_kept_apart_by_index():
    script = [(0.0, D(0, "a")), (0.0, D(1, "b")), (0.001, D(1, "c")), (0.002, D(0, "d")), (0.003, D(2, ""))]
    sent, _ = run(script, interval=0.05)
    by_index: dict[int, str] = {}
    for _, chunks in sent:
        for c in chunks:
            by_index[c["index"]] = by_index.get(c["index"], "") + c["text"]
    assert by_index == {0: "ad", 1: "bc"}


def test_empty_stream_sends_nothing():
    sent, count = run([], interval=0.01)
    assert sent == [] and count == 0
