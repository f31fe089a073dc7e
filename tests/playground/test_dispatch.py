"""playground/serving/web/dispatch.py: a burst's tasks go to the broker together (serving.web.batching), each
routed on its own, and a broker failure fails the requests of its batch, not later ones."""
import asyncio
import threading

from playground import logs
from playground.serving.shared.envelope import Job
from playground.serving.web import dispatch


class Broker:
    """Stands in for `dispatch.submit_many`: records each batch's request ids and the log id it ran under; the first
    batch waits for `go`, so the requests sent meanwhile queue behind it; a batch holding `fail_on` raises."""

    def __init__(self, fail_on=None):
        self.batches, self.log_ids = [], []
        self.started, self.go = threading.Event(), threading.Event()
        self.fail_on = fail_on

    def __call__(self, jobs):
        if not self.batches:
            self.started.set()
            self.go.wait(10)
        self.batches.append([request_id for request_id, _ in jobs])
        self.log_ids.append(logs.request_id.get())
        if self.fail_on in self.batches[-1]:
            raise ConnectionError("broker down")
        return [f"gpu.{job.preferred_worker}" for _, job in jobs]


async def burst(broker, ids):
    """Submit ids[0], and the rest while its batch is being sent; the outcomes in order."""

    async def submit(request_id):
        logs.request_id.set(request_id)  # as Generation.start does
        return await dispatch.submit(request_id, Job({}, prompt="hi", preferred_worker=f"w-{request_id}"))

    first = asyncio.ensure_future(submit(ids[0]))
    await asyncio.to_thread(broker.started.wait, 10)
    rest = [asyncio.ensure_future(submit(request_id)) for request_id in ids[1:]]
    await asyncio.sleep(0.05)
    broker.go.set()
    return await asyncio.gather(first, *rest, return_exceptions=True)


def test_tasks_sent_while_a_batch_goes_out_go_together_in_the_next_each_to_its_own_queue(monkeypatch):
    broker = Broker()
    monkeypatch.setattr(dispatch, "submit_many", broker)
    ids = [f"r{i}" for i in range(5)]
    assert asyncio.run(burst(broker, ids)) == [f"gpu.w-{request_id}" for request_id in ids]
    assert broker.batches == [["r0"], ["r1", "r2", "r3", "r4"]]
    assert broker.log_ids == ["", ""]  # a batch serves many requests: it logs under none of their ids


def test_a_broker_failure_fails_its_batch_and_the_next_batch_still_goes(monkeypatch):
    broker = Broker(fail_on="r1")
    monkeypatch.setattr(dispatch, "submit_many", broker)

    async def scenario():
        outcomes = await burst(broker, ["r0", "r1", "r2"])
        return outcomes, await dispatch.submit("r3", Job({}, prompt="hi"))

    outcomes, later = asyncio.run(scenario())
    assert outcomes[0] == "gpu.w-r0"
    assert [str(outcome) for outcome in outcomes[1:]] == ["broker down"] * 2
    assert later == "gpu." and broker.batches == [["r0"], ["r1", "r2"], ["r3"]]
