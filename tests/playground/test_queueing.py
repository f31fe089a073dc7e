"""playground/serving/shared/queueing.py: a generation goes to this process's worker when it takes it (the
embedded mode), to Celery otherwise."""
import json

import pytest
import redis
from celery import Celery
from kombu import Producer
from live_stack import REDIS_HOST, REDIS_PORT, empty_redis_db

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
    ((args, kwargs),) = sent
    assert isinstance(kwargs.pop("producer"), Producer)
    assert (args, kwargs) == ((TASK_NAME,), {"kwargs": {"request_id": "r1", "job": {"kind": "generate"}},
                                             "queue": "gpu", "task_id": "r1", "ignore_result": True, "argsrepr": "()",
                                             "kwargsrepr": "request r1: generate, a prompt of 0 characters"})


def test_a_burst_goes_to_redis_in_one_pipeline_each_task_on_its_queue(monkeypatch):
    """Through the distributed settings' broker transport (playground/broker.py, kombu's Redis transport): the tasks
    land on their queues in order, under their ids; the pushes went in one pipeline (no LPUSH of its own; the
    queues are declared on first use), and a second burst builds no new Redis client."""
    db = empty_redis_db()
    client = redis.Redis(REDIS_HOST, REDIS_PORT, db=db)
    app = Celery("queueing-test", broker=f"redis://{REDIS_HOST}:{REDIS_PORT}/{db}")
    app.conf.broker_transport = "playground.broker:Transport"
    monkeypatch.setattr(queueing, "celery_app", app)
    commands, pipelines, clients = [], [], []
    execute_command, execute, init = redis.Redis.execute_command, redis.client.Pipeline.execute, redis.Redis.__init__
    monkeypatch.setattr(redis.Redis, "execute_command",
                        lambda self, *args, **kw: commands.append(args[0]) or execute_command(self, *args, **kw))
    monkeypatch.setattr(redis.client.Pipeline, "execute",
                        lambda self, *args, **kw: pipelines.append([c[0][0] for c in self.command_stack])
                        or execute(self, *args, **kw))
    monkeypatch.setattr(redis.Redis, "__init__", lambda self, *args, **kw: clients.append(1) or init(self, *args, **kw))
    try:
        def burst(first):
            queueing.send_generations([(f"r{i}", {"kind": "generate", "prompt": [i]}, queue) for i, queue in
                                       enumerate(["gpu", "gpu.w1@h", "gpu", "gpu"], start=first)])

        burst(0)
        queued = {queue: [json.loads(raw) for raw in reversed(client.lrange(queue, 0, -1))]
                  for queue in ("gpu", "gpu.w1@h")}
        assert {queue: [m["headers"]["id"] for m in messages] for queue, messages in queued.items()} == {
            "gpu": ["r0", "r2", "r3"], "gpu.w1@h": ["r1"]}
        assert "LPUSH" not in commands and [p for p in pipelines if "LPUSH" in p] == [["LPUSH"] * 4]
        clients.clear()
        burst(4)
        assert client.llen("gpu") == 6 and clients == []
    finally:
        # The app's connections to this database go before another test claims it (Celery's close leaves kombu's
        # Redis connections open).
        for other in client.client_list():
            if int(other["db"]) == db and other["cmd"] != "client|list":
                client.client_kill_filter(_id=other["id"])
        client.flushdb()


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
