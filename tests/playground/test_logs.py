"""Structured logs (playground/logs.py): with PLAYGROUND_LOG_FORMAT=json each line is a JSON object naming its
request; the id is bound in the web's relaying task and in the worker's task thread around the engine call."""
import asyncio
import io
import json
import logging
import logging.config

import pytest
from fake_worker import connect, generate, until_end, worker

from playground import logs
from playground.serving.worker.engine_service import EngineService


def json_lines(run) -> list[dict]:
    """Log lines of `run()` through the json configuration, parsed."""
    stream = io.StringIO()
    config = logs.logging_config("json", "INFO")
    config["handlers"]["console"]["stream"] = stream
    config["root"]["handlers"] = ["console"]
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    logging.config.dictConfig({**config, "loggers": {}})
    try:
        run()
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_each_asyncio_task_logs_its_own_request_id():
    async def turn(rid: str) -> None:
        logs.request_id.set(rid)
        await asyncio.sleep(0.01)
        logging.getLogger("t").info("serving")

    async def both():
        await asyncio.gather(turn("a1"), turn("b2"))
        logging.getLogger("t").warning("between requests")

    lines = json_lines(lambda: asyncio.run(both()))
    assert sorted((line["message"], line["request_id"]) for line in lines) == [
        ("between requests", None), ("serving", "a1"), ("serving", "b2")]
    assert {line["level"] for line in lines} == {"INFO", "WARNING"} and all(line["time"].endswith("Z") for line in lines)


def test_an_unknown_format_is_refused_by_name():
    with pytest.raises(ValueError, match="PLAYGROUND_LOG_FORMAT must be one of text, json, not 'xml'"):
        logs.logging_config("xml", "INFO")


@pytest.mark.django_db(transaction=True)
def test_the_request_id_reaches_the_engine_call_on_the_worker(monkeypatch):
    seen: list[str] = []
    submit = EngineService.submit

    def recording_submit(self, request_id, *args, **kwargs):
        seen.append(logs.request_id.get())
        return submit(self, request_id, *args, **kwargs)

    monkeypatch.setattr(EngineService, "submit", recording_submit)

    async def scenario():
        async with worker(monkeypatch) as _:
            ws = await connect()
            await ws.send_json_to(generate(max_tokens=4))
            frames = await until_end(ws)
            await ws.disconnect()
            return frames

    frames = asyncio.run(scenario())
    assert frames[-1]["type"] == "done"
    assert seen == [frames[0]["request_id"]]
