"""The embedded mode's Celery broker (playground/serving/shared/memory_broker.py): a consumer with nothing queued
takes a task as soon as it is put, not at its next look; with nothing put it still times out when asked."""
import socket
import threading
import time
import uuid

import pytest
from kombu import Connection, Exchange, Queue

TRANSPORT = "playground.serving.shared.memory_broker:Transport"
LOOK_EVERY_S = 1.0  # far longer than any wake-up below may take


def connection() -> Connection:
    return Connection("memory://", transport=TRANSPORT, transport_options={"polling_interval": LOOK_EVERY_S})


def publish_later(name: str, body: dict, delay_s: float, published: list[float]) -> threading.Timer:
    """Put `body` on queue `name` from another thread after `delay_s`; appends when it was put to `published`."""
    def publish() -> None:
        with connection() as producer_side:
            producer_side.Producer().publish(body, exchange=Exchange(name), routing_key=name, declare=[queue(name)])
        published.append(time.monotonic())

    timer = threading.Timer(delay_s, publish)
    timer.start()
    return timer


def queue(name: str) -> Queue:
    return Queue(name, Exchange(name), name)


def drain_one(name: str, timeout_s: float) -> tuple[dict, float]:
    """The first message on queue `name` and when it was delivered."""
    received: list[tuple[dict, float]] = []

    def on_message(body, message) -> None:
        received.append((body, time.monotonic()))
        message.ack()

    with connection() as consumer_side, consumer_side.Consumer(queue(name), callbacks=[on_message]):
        consumer_side.drain_events(timeout=timeout_s)
    return received[0]


def test_a_waiting_consumer_takes_a_task_as_soon_as_it_is_put():
    name, published = f"test-{uuid.uuid4().hex}", []
    timer = publish_later(name, {"n": 1}, 0.2, published)
    body, delivered = drain_one(name, timeout_s=5)
    timer.join()
    assert body == {"n": 1}
    assert delivered - published[0] < LOOK_EVERY_S / 2  # kombu's own memory transport: a whole look later


def test_two_consumers_of_different_queues_are_each_woken_by_their_own_task():
    names = [f"test-{uuid.uuid4().hex}" for _ in range(2)]
    results: dict[str, tuple[dict, float]] = {}
    consumers = [threading.Thread(target=lambda n=n: results.update({n: drain_one(n, timeout_s=5)})) for n in names]
    for consumer in consumers:
        consumer.start()
    time.sleep(0.1)  # both are waiting
    published = {name: [] for name in names}
    timers = [publish_later(name, {"to": name}, 0.05 * i, published[name]) for i, name in enumerate(names)]
    for thread in [*timers, *consumers]:
        thread.join(timeout=10)
    for name in names:
        body, delivered = results[name]
        assert body == {"to": name} and delivered - published[name][0] < LOOK_EVERY_S / 2


def test_with_nothing_put_draining_times_out_when_asked():
    started = time.monotonic()
    with pytest.raises(socket.timeout):
        drain_one(f"test-{uuid.uuid4().hex}", timeout_s=0.3)
    assert 0.3 <= time.monotonic() - started < LOOK_EVERY_S
