"""The worker runtime's lock and the event loop: an abort that arrives while another request is being
admitted slowly must not hold up the tokens of every other request on the worker (the loop carries them all).
The real runtime, engine service and in-memory channel layer around the scripted engine (fake_worker.py)."""
import asyncio
import time

import pytest
from django.conf import settings
from fake_worker import connect, generate, until_end, worker

pytestmark = pytest.mark.django_db(transaction=True)

ALLOWED_DELAY_S = 0.05  # beyond the coalescing window, a token frame may be this late


def test_abort_during_a_slow_submit_does_not_delay_other_streams(monkeypatch):
    async def scenario():
        async with worker(monkeypatch, delay=0.01) as (engine, _):
            streaming = await connect()
            await streaming.send_json_to(generate([{"role": "user", "content": "z" * 400}], max_tokens=400))
            await streaming.receive_json_from(timeout=5)  # started
            assert (await streaming.receive_json_from(timeout=5))["type"] == "token"

            slow = await connect()
            await slow.send_json_to(generate([{"role": "user", "content": "SLOW please"}], max_tokens=50))
            slow_started = await slow.receive_json_from(timeout=5)
            await asyncio.sleep(0.2)  # its task thread is now inside submit
            await slow.send_json_to({"type": "cancel", "request_id": slow_started["request_id"]})

            arrivals = []
            window_end = time.monotonic() + engine.slow_admission_s
            while time.monotonic() < window_end:
                frame = await streaming.receive_json_from(timeout=5)
                assert frame["type"] == "token"
                arrivals.append(time.monotonic())
            slow_frames = await until_end(slow)
            await streaming.send_json_to({"type": "cancel", "request_id": frame["request_id"]})
            await until_end(streaming)
            for ws in (streaming, slow):
                await ws.disconnect()
            return arrivals, slow_started, slow_frames, engine

    arrivals, slow_started, slow_frames, engine = asyncio.run(scenario())
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(arrivals) > 10
    assert max(gaps) < settings.PLAYGROUND_COALESCE_MS / 1000 + ALLOWED_DELAY_S, max(gaps)
    # The abort was not lost either: it came before the request was live, and was applied once it was.
    done = slow_frames[-1]
    assert done["type"] == "done" and done["outputs"][0]["finish_reason"] == "abort"
    assert slow_started["request_id"] in engine.aborted
