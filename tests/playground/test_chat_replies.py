"""Replies stored together (playground/chat/store.py `save_replies`, playground/chat/transcripts.py): a burst of
finished chats is one transaction of a fixed number of queries, each reply under its parent, and the socket's
writer batches the replies that arrive while a write runs without losing or mixing any."""
import asyncio
import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from playground.chat import store, transcripts
from playground.chat.models import Conversation, Message


def done(text, n=1):
    return {"outputs": [{"index": i, "text": f"{text}{'' if i == 0 else i}", "finish_reason": "length"}
                        for i in range(n)],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "cached_tokens": 0},
            "timing": {"ttft_ms": 1.5, "tokens_per_s": 9.0}}


def chat(text, session="s1"):
    return store.open_conversation(None, session, None, [{"role": "user", "content": text}])


@pytest.mark.django_db
def test_a_burst_of_replies_is_stored_in_a_fixed_number_of_queries_each_under_its_parent():
    conversations = [chat(f"q{i}") for i in range(6)]
    with CaptureQueriesContext(connection) as one:
        store.save_replies([store.Reply(conversations[0].id, "r0", done("a0"), "w1", conversations[0].leaf_id)])
    burst = [store.Reply(c.id, f"r{i}", done(f"a{i}", n=2 if i == 3 else 1), f"w{i}", c.leaf_id)
             for i, c in enumerate(conversations[1:], start=1)]
    written_after = timezone.now()
    with CaptureQueriesContext(connection) as five:
        saved = store.save_replies(burst)
    assert len(five) == len(one)

    for i, (conversation, message) in enumerate(zip(conversations[1:], saved), start=1):
        conversation.refresh_from_db()
        assert message.pk is not None and conversation.leaf_id == message.pk
        assert conversation.last_worker == f"w{i}" and conversation.updated_at >= written_after
        question = Message.objects.get(conversation=conversation, role="user")
        assert (message.parent_id, message.position, message.role) == (question.pk, question.position + 1, "assistant")
        assert (message.content, message.request_id, message.finish_reason) == (f"a{i}", f"r{i}", "length")
        assert message.samples == (["a3", "a31"] if i == 3 else None)
        assert message.usage["completion_tokens"] == 2 and message.timing["ttft_ms"] == 1.5


@pytest.mark.django_db
def test_a_reply_whose_conversation_is_gone_is_none_and_the_others_are_stored():
    kept, gone = chat("kept"), chat("gone")
    gone_id = gone.id
    gone.delete()
    saved = store.save_replies([store.Reply(gone_id, "r1", done("lost"), "w1"),
                                store.Reply(kept.id, "r2", done("kept"), "w1")])
    assert saved[0] is None and saved[1].content == "kept"
    assert list(Message.objects.filter(request_id="r1")) == []
    with pytest.raises(Conversation.DoesNotExist):
        store.save_reply(gone_id, "r3", done("lost"), "w1")


@pytest.mark.django_db
def test_replies_to_one_conversation_in_one_batch_follow_each_other_and_the_last_is_the_leaf():
    conversation = chat("q")
    first, second = store.save_replies([store.Reply(conversation.id, "r1", done("one"), "w1"),
                                        store.Reply(conversation.id, "r2", done("two"), "w2")])
    conversation.refresh_from_db()
    assert second.parent_id == first.pk and second.position == first.position + 1
    assert conversation.leaf_id == second.pk and conversation.last_worker == "w2"


@pytest.mark.django_db
def test_a_parent_of_another_conversation_is_not_taken():
    mine, other = chat("mine"), chat("other", session="s2")
    (message,) = store.save_replies([store.Reply(mine.id, "r1", done("a"), "w1", parent_id=other.leaf_id)])
    assert message.parent_id is None and message.position == 0


class Recorder:
    """Stands in for `store.save_replies`: records each batch's request ids; the first write waits for `go`, so
    the replies sent meanwhile queue behind it; a batch holding `fail_on` raises."""

    def __init__(self, fail_on=None):
        self.batches = []
        self.started = threading.Event()  # the first write has begun (on the database thread)
        self.go = threading.Event()
        self.fail_on = fail_on

    def __call__(self, batch):
        if not self.batches:
            self.started.set()
            self.go.wait(10)
        self.batches.append([reply.request_id for reply in batch])
        if self.fail_on in self.batches[-1]:
            raise RuntimeError("database is locked")
        return [f"message of {reply.request_id}" for reply in batch]


def reply(request_id):
    return store.Reply(None, request_id, done("x"), "w1")


@pytest.mark.django_db  # no query, but database_sync_to_async checks the thread's kept connection
def test_replies_that_arrive_while_a_write_runs_go_together_in_the_next(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(store, "save_replies", recorder)

    async def burst():
        first = asyncio.ensure_future(transcripts.save(reply("r0")))
        await asyncio.to_thread(recorder.started.wait, 10)  # r0's write has started and waits on `go`
        rest = [asyncio.ensure_future(transcripts.save(reply(f"r{i}"))) for i in range(1, 6)]
        await asyncio.sleep(0.05)
        recorder.go.set()
        return await asyncio.gather(first, *rest)

    assert asyncio.run(burst()) == [f"message of r{i}" for i in range(6)]
    assert recorder.batches == [["r0"], ["r1", "r2", "r3", "r4", "r5"]]


@pytest.mark.django_db  # no query, but database_sync_to_async checks the thread's kept connection
def test_a_failed_batch_raises_to_its_callers_and_the_next_batch_is_still_written(monkeypatch):
    recorder = Recorder(fail_on="r1")
    monkeypatch.setattr(store, "save_replies", recorder)

    async def burst():
        first = asyncio.ensure_future(transcripts.save(reply("r0")))
        await asyncio.to_thread(recorder.started.wait, 10)
        failing = [asyncio.ensure_future(transcripts.save(reply(f"r{i}"))) for i in (1, 2)]
        recorder.go.set()
        outcomes = await asyncio.gather(first, *failing, return_exceptions=True)
        later = await transcripts.save(reply("r3"))
        return outcomes, later

    outcomes, later = asyncio.run(burst())
    assert outcomes[0] == "message of r0"
    assert [str(o) for o in outcomes[1:]] == ["database is locked"] * 2
    assert later == "message of r3"
    assert recorder.batches == [["r0"], ["r1", "r2"], ["r3"]]


@pytest.mark.django_db  # no query, but database_sync_to_async checks the thread's kept connection
def test_a_caller_that_goes_away_still_has_its_reply_written(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(store, "save_replies", recorder)

    async def leave():
        first = asyncio.ensure_future(transcripts.save(reply("r0")))
        await asyncio.to_thread(recorder.started.wait, 10)
        first.cancel()  # the socket closed while its reply was being stored
        recorder.go.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await transcripts.save(reply("r1"))

    assert asyncio.run(leave()) == "message of r1"
    assert recorder.batches == [["r0"], ["r1"]]
