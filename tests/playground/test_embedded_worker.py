"""playground/serving/embedded.py's run_on_pool (EmbeddedWorker.take): a generation runs on the worker's pool
threads, the task body itself, unless the pool or the runtime is not there yet, the pool has stopped, or the
worker passes new work on."""
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from playground.serving.embedded import run_on_pool
from playground.serving.worker import runtime, tasks


@pytest.fixture
def ran(monkeypatch) -> list[tuple]:
    """The task body's calls: (request id, task, thread name)."""
    calls: list[tuple] = []
    monkeypatch.setattr(tasks.generate, "run", lambda request_id, job: calls.append(
        (request_id, job, threading.current_thread().name)))
    return calls


def with_runtime(monkeypatch, passes_on: bool) -> None:
    monkeypatch.setattr(runtime, "_runtime", SimpleNamespace(passes_on_new_work=lambda: passes_on))


def test_the_task_body_runs_on_the_pool_s_threads(ran, monkeypatch):
    with_runtime(monkeypatch, passes_on=False)
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as executor:
        assert run_on_pool(SimpleNamespace(run_now=executor.submit), "r1", {"kind": "generate"}) is True
    assert ran == [("r1", {"kind": "generate"}, "pool_0")]


def test_before_the_pool_or_the_runtime_exists_celery_takes_it(ran, monkeypatch):
    monkeypatch.setattr(runtime, "_runtime", None)
    with ThreadPoolExecutor(1) as executor:
        assert run_on_pool(SimpleNamespace(run_now=executor.submit), "r1", {}) is False  # no runtime yet
    with_runtime(monkeypatch, passes_on=False)
    assert run_on_pool(None, "r1", {}) is False  # no pool yet
    assert ran == []


def test_a_worker_passing_new_work_on_or_stopped_leaves_it_to_celery(ran, monkeypatch):
    """Draining beside another ready worker: the task body would hand the task back, and back here."""
    executor = ThreadPoolExecutor(1)
    with_runtime(monkeypatch, passes_on=True)
    assert run_on_pool(SimpleNamespace(run_now=executor.submit), "r1", {}) is False
    with_runtime(monkeypatch, passes_on=False)
    executor.shutdown()
    assert run_on_pool(SimpleNamespace(run_now=executor.submit), "r2", {}) is False  # the pool stopped
    assert ran == []


def test_a_task_body_that_raises_is_logged_with_its_request(monkeypatch, caplog):
    def fails(request_id, job):
        raise ValueError("names no channel to reply to")

    monkeypatch.setattr(tasks.generate, "run", fails)
    with_runtime(monkeypatch, passes_on=False)
    with caplog.at_level(logging.ERROR, logger="playground.serving.embedded"):
        with ThreadPoolExecutor(1) as executor:
            assert run_on_pool(SimpleNamespace(run_now=executor.submit), "r1", {}) is True
    assert "generation r1 failed" in caplog.text and "names no channel to reply to" in caplog.text
