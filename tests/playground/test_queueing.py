"""playground/serving/shared/queueing.py: a generation goes to this process's worker when it takes it (the
embedded mode), to Celery otherwise."""
import pytest

from playground.serving.shared import queueing
from playground.serving.shared.naming import TASK_NAME


@pytest.fixture
def sent(monkeypatch) -> list[tuple]:
    sent: list[tuple] = []
    monkeypatch.setattr(queueing.celery_app, "send_task", lambda *args, **kwargs: sent.append((args, kwargs)))
    yield sent
    queueing.take_locally(None)


def test_with_no_local_worker_the_task_goes_to_celery(sent):
    queueing.send_generation("r1", {"kind": "generate"}, "gpu")
    assert sent == [((TASK_NAME,), {"kwargs": {"request_id": "r1", "job": {"kind": "generate"}}, "queue": "gpu",
                                    "task_id": "r1"})]


def test_a_task_the_local_worker_takes_never_reaches_celery(sent):
    offered = []
    queueing.take_locally(lambda request_id, task: offered.append((request_id, task)) or True)
    queueing.send_generation("r1", {"kind": "generate"}, "gpu")
    assert offered == [("r1", {"kind": "generate"})] and sent == []


def test_a_task_the_local_worker_declines_goes_to_celery(sent):
    queueing.take_locally(lambda request_id, task: False)
    queueing.send_generation("r2", {"kind": "generate"}, "gpu.other")
    assert [kwargs["queue"] for _, kwargs in sent] == ["gpu.other"]
