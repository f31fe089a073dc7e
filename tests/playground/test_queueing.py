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
                                    "task_id": "r1", "ignore_result": True, "argsrepr": "()",
                                    "kwargsrepr": "request r1: generate, a prompt of 0 characters"})]


def test_the_task_headers_summarise_the_job_without_its_text(monkeypatch):
    """Through Celery's own message building: its logs and monitors read the headers' reprs, which must not carry
    the user's text (nor cost a walk over the whole transcript)."""
    published = []
    monkeypatch.setattr(queueing.celery_app.amqp, "send_task_message",
                        lambda producer, name, message, **options: published.append(message))
    job = {"kind": "generate", "messages": [{"role": "user", "content": "my secret question"}] * 3}
    queueing.send_generation("r9", job, "gpu")
    (message,) = published
    assert message.headers["kwargsrepr"] == "request r9: generate, 3 messages"
    assert message.headers["argsrepr"] == "()" and message.headers["id"] == "r9"
    assert "secret" not in repr(message.headers) and message.body[1] == {"request_id": "r9", "job": job}


@pytest.mark.parametrize("prompt, size", [([1, 2, 3], "a prompt of 3 token ids"), ("hello", "a prompt of 5 characters")])
def test_a_plain_prompt_is_summarised_by_its_length(prompt, size):
    assert queueing.task_summary("r3", {"kind": "tokenize", "prompt": prompt}) == f"request r3: tokenize, {size}"


def test_a_task_the_local_worker_takes_never_reaches_celery(sent):
    offered = []
    queueing.take_locally(lambda request_id, task: offered.append((request_id, task)) or True)
    queueing.send_generation("r1", {"kind": "generate"}, "gpu")
    assert offered == [("r1", {"kind": "generate"})] and sent == []


def test_a_task_the_local_worker_declines_goes_to_celery(sent):
    queueing.take_locally(lambda request_id, task: False)
    queueing.send_generation("r2", {"kind": "generate"}, "gpu.other")
    assert [kwargs["queue"] for _, kwargs in sent] == ["gpu.other"]
