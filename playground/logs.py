"""Logs an operator can search: with PLAYGROUND_LOG_FORMAT=json every line is one JSON object that names the
request it belongs to, so one id follows a chat turn or an API call from the web process (the lifecycle binds
it when the generation starts) through Celery (the task's id is the request id) to the worker's task thread
and the engine call it makes (`WorkerRuntime.serve` binds it). Lines outside any request carry null.

The id lives in a context variable: asyncio tasks and threads each see their own.
"""
import contextvars
import json
import logging
import time
from typing import Any

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
FORMATS = ("text", "json")


class RequestIdFilter(logging.Filter):
    """Stamps each record with the current request id (a record that already names one keeps it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", ""):
            record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "") or None,
            "process": record.process,
            "thread": record.threadName,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def logging_config(log_format: str, level: str) -> dict[str, Any]:
    """Django's LOGGING for `log_format` ("text" or "json"); another value is refused by name."""
    if log_format not in FORMATS:
        raise ValueError(f"PLAYGROUND_LOG_FORMAT must be one of {', '.join(FORMATS)}, not {log_format!r}")
    handler: dict[str, Any] = {"class": "logging.StreamHandler", "filters": ["request_id"]}
    if log_format == "json":
        handler["formatter"] = "json"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}},
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"console": handler},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {"django.channels.server": {"level": "WARNING"}},
    }
