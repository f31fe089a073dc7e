"""The websocket benchmark's arithmetic (the benchmark itself runs with `manage.py bench_ws`)."""
from types import SimpleNamespace

import pytest

from playground.serving.tools import bench


class CharTokenizer:
    """Token id i decodes to VOCAB[i]; 0 is an end-of-sequence marker with no text."""

    VOCAB = {0: "", 1: "ab", 2: "c", 3: "de"}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.VOCAB[i] for i in ids)


def finished(token_ids, token_times):
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=token_ids)],
                           metrics=SimpleNamespace(token_times=token_times))  # fmt: skip


def test_each_token_is_timed_to_the_frame_that_completes_its_text():
    finals = {"r": finished([1, 2, 3, 0], [1.0, 2.0, 3.0, 3.5])}
    # Frames: "ab" at 1.25 (2 chars), "cde" at 3.5 (5 chars): token 2 waited for coalescing.
    results = [bench.Delivery("ws", "r", [(1.25, 2), (3.5, 5)], 4, "abcde")]
    assert bench.delivery_delays(results, finals, CharTokenizer()) == pytest.approx([0.25, 1.5, 0.5])


def test_report_row():
    delays = {"ws": [0.01, 0.02, 0.03], "api": [0.04]}
    row = bench.report(2, 1, 8, bench.Run(100, 2.0), bench.Run(95, 2.0), delays, 30).splitlines()[-1]
    assert "| 2 | 1 | 8 | 50.0 (100 tok / 2.0 s) | 47.5 (95 tok / 2.0 s) | 95.0% |" in row
    assert "| 20.0 ms / 29.8 ms | 40.0 ms / 40.0 ms | 39.7 ms |" in row and row.endswith("| 30 ms |")


def test_delivered_texts_are_checked_against_the_engines():
    finals = {"a": SimpleNamespace(outputs=[SimpleNamespace(text="hello")]),
              "b": SimpleNamespace(outputs=[SimpleNamespace(text="world")])}  # fmt: skip
    results = [bench.Delivery("ws", "a", [], 1, "hello"), bench.Delivery("api", "b", [], 1, "worl")]
    assert bench.mismatched_texts(results, finals) == ["b"]


def test_workload_prompts_are_distinct():
    chats = bench.workload(40)
    assert len({chat[0]["content"] for chat in chats}) == 40
