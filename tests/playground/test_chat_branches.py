"""Conversations as trees (playground/chat/store.py): an edit or a regeneration adds a branch beside what it
replaces, the page steps between branches and deletes messages through the message endpoint."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from playground.chat import store
from playground.chat.models import Conversation, Message

pytestmark = pytest.mark.django_db

SYSTEM = {"role": "system", "content": "be brief"}


def user(text):
    return {"role": "user", "content": text}


def reply(conversation, text):
    done = {"outputs": [{"index": 0, "text": text, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0}, "timing": None}
    return store.save_reply(conversation.id, f"r-{text}", done, "w1")


def shown(conversation):
    conversation.refresh_from_db()
    return [(m["role"], m["content"], len(m["siblings"])) for m in store.conversation_detail(conversation)["messages"]]


@pytest.fixture
def chat(client):
    """A conversation of two turns: system, q1, a1, q2, a2 (owned by the client's session)."""
    client.get("/")
    key = client.session.session_key
    conversation = store.open_conversation(None, key, None, [SYSTEM, user("q1")])
    reply(conversation, "a1")
    store.open_conversation(None, key, conversation.id, [SYSTEM, user("q1"), {"role": "assistant", "content": "a1"},
                                                         user("q2")])
    reply(conversation, "a2")
    return conversation, key


def test_editing_the_second_message_keeps_the_old_branch(chat):
    conversation, key = chat
    transcript = [SYSTEM, user("q1"), {"role": "assistant", "content": "a1"}, user("q2 edited")]
    store.open_conversation(None, key, conversation.id, transcript)
    reply(conversation, "a2'")
    assert shown(conversation) == [("system", "be brief", 1), ("user", "q1", 1), ("assistant", "a1", 1),
                                   ("user", "q2 edited", 2), ("assistant", "a2'", 1)]
    assert Message.objects.filter(conversation=conversation).count() == 7  # the old q2 and a2 are kept
    # the shared messages were reused, not copied
    assert Message.objects.filter(conversation=conversation, content="q1").count() == 1


def test_regenerating_a_reply_adds_a_sibling_and_the_arrows_switch_branches(chat, client):
    conversation, key = chat
    store.open_conversation(None, key, conversation.id, [SYSTEM, user("q1")])
    reply(conversation, "a1 again")
    assert shown(conversation) == [("system", "be brief", 1), ("user", "q1", 1), ("assistant", "a1 again", 2)]
    old = Message.objects.get(conversation=conversation, content="a1")
    detail = client.post(f"/api/conversations/{conversation.id}/messages/{old.id}/").json()
    # back on the old reply's branch, down to its latest follow-up
    assert [m["content"] for m in detail["messages"]] == ["be brief", "q1", "a1", "q2", "a2"]
    assert detail["messages"][2]["siblings"] == [old.id, Message.objects.get(content="a1 again").id]


def test_deleting_a_message_removes_what_follows_and_shows_a_sibling_or_the_parent(chat, client):
    conversation, key = chat
    store.open_conversation(None, key, conversation.id, [SYSTEM, user("q1"), {"role": "assistant", "content": "a1"},
                                                         user("q2 edited")])
    edited = Message.objects.get(content="q2 edited")
    url = f"/api/conversations/{conversation.id}/messages/{edited.id}/"
    detail = client.delete(url).json()
    assert [m["content"] for m in detail["messages"]] == ["be brief", "q1", "a1", "q2", "a2"]
    a1 = Message.objects.get(content="a1")
    detail = client.delete(f"/api/conversations/{conversation.id}/messages/{a1.id}/").json()
    assert [m["content"] for m in detail["messages"]] == ["be brief", "q1"]
    assert set(Message.objects.values_list("content", flat=True)) == {"be brief", "q1"}
    assert client.delete(url).status_code == 404  # gone already


def test_strangers_cannot_switch_or_delete_messages(chat, django_user_model):
    conversation, _ = chat
    from django.test import Client

    stranger = Client()
    stranger.force_login(django_user_model.objects.create_user("mallory", password="x" * 12))
    message = Message.objects.get(content="a1")
    url = f"/api/conversations/{conversation.id}/messages/{message.id}/"
    assert stranger.post(url).status_code == 404 and stranger.delete(url).status_code == 404
    assert Message.objects.filter(id=message.id).exists()


def test_a_message_of_another_conversation_is_not_found(chat, client):
    conversation, key = chat
    other = store.open_conversation(None, key, None, [user("elsewhere")])
    foreign = Message.objects.get(conversation=other)
    assert client.delete(f"/api/conversations/{conversation.id}/messages/{foreign.id}/").status_code == 404
    assert Conversation.objects.get(id=other.id).messages.count() == 1


def test_a_new_conversation_is_written_without_reading_anything_back():
    """Nothing is stored yet to match against: the transcript is inserted and the leaf set, no SELECT (a burst
    of new chats runs this on the one database thread while their requests travel to the engine)."""
    with CaptureQueriesContext(connection) as queries:
        conversation = store.open_conversation(None, "s1", None, [SYSTEM, user("q1")])
    assert not [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")]
    conversation.refresh_from_db()
    assert conversation.title == "q1" and conversation.session_key == "s1"
    assert shown(conversation) == [("system", "be brief", 1), ("user", "q1", 1)]


def test_new_conversations_created_together_are_each_one_branch_in_a_fixed_number_of_queries():
    def burst(count):
        new = [store.NewConversation(None, f"s{i}", [SYSTEM, user(f"  q{i}\n one")] if i % 2 else [user(f"q{i}")])
               for i in range(count)]
        with CaptureQueriesContext(connection) as queries:
            conversations = store.create_conversations(new)
        return conversations, len(queries)

    few, few_queries = burst(2)
    many, many_queries = burst(9)
    assert many_queries == few_queries  # per batch: conversations, one INSERT per position, the leaves' UPDATE
    for i, conversation in enumerate(many):
        stored = Conversation.objects.get(id=conversation.id)
        path = [(m.role, m.content, m.position) for m in store.active_path(stored)]
        expected = [SYSTEM, user(f"  q{i}\n one")] if i % 2 else [user(f"q{i}")]
        assert path == [(m["role"], m["content"], p) for p, m in enumerate(expected)]
        assert stored.session_key == f"s{i}" and stored.title == (f"q{i} one" if i % 2 else f"q{i}")
        assert stored.messages.count() == len(expected)
