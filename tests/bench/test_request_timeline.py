"""bench.request_timeline: its phase arithmetic, and the whole run on a small load (slow)."""
import json
import os
import subprocess
import sys

import pytest

from bench import request_timeline
from tests.playground.live_stack import ENGINE_ENV, REPO, free_port


def test_only_events_with_text_count_as_the_first_token():
    role = b'data: {"id": "chatcmpl-abc", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}'
    text = b'data: {"id": "chatcmpl-abc", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}'
    assert request_timeline.first_text(role) is None
    assert request_timeline.first_text(b"data: [DONE]") is None
    assert request_timeline.first_text(text) == "abc"


def test_each_phase_is_the_time_since_the_one_before_and_the_engine_s_share_is_taken_out():
    phases = request_timeline.PHASES
    timelines = [{phase: k * 0.010 for k, phase in enumerate(phases)},
                 {phase: k * 0.020 for k, phase in enumerate(phases)}]
    rows = request_timeline.summary(timelines)
    assert [(r["from"], r["to"]) for r in rows] == list(zip(phases, phases[1:]))
    assert all(r["mean_ms"] == pytest.approx(15.0) and r["requests"] == 2 for r in rows)
    outside = request_timeline.outside_engine_ms(timelines)
    engine_steps = phases.index("first_token") - phases.index("arrival")
    assert outside["engine_ttft_ms"] == pytest.approx(15.0 * engine_steps)
    assert outside["client_ttft_ms"] == pytest.approx(15.0 * (len(phases) - 1))
    assert outside["outside_engine_ms"] == pytest.approx(15.0 * (len(phases) - 1 - engine_steps))


@pytest.mark.slow
def test_the_timeline_follows_every_request_from_client_to_client(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
    env.update(ENGINE_ENV, PLAYGROUND_VAR_DIR=str(tmp_path))
    out = tmp_path / "timeline.json"
    out.write_text(json.dumps({"runs": {"before": {"kept": True}}}))
    done = subprocess.run([sys.executable, "-m", "bench.request_timeline", "--requests", "6", "--concurrency", "3",
                           "--prompt-words", "20", "--max-tokens", "4", "--port", str(free_port()), "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert runs["before"] == {"kept": True}  # another build's run in the same file is kept beside this one
    record = runs["run"]
    assert len(record["requests"]) == 6
    # Every phase passed, in order; only the Celery worker may start the task before the submitting thread has
    # marked it queued.
    chain = [p for p in request_timeline.PHASES if p != "queued"]
    for marks in record["requests"]:
        assert [marks[p] for p in chain] == sorted(marks[p] for p in chain)
        assert marks["admitted"] <= marks["queued"]
    assert [r["to"] for r in record["phases"]] == list(request_timeline.PHASES[1:])
    assert "outside the engine" in done.stdout
