"""The chat page's context, the conversation endpoints' ownership rules, /healthz and routing choices."""
import json
import uuid

import pytest

from playground.chat import store
from playground.chat.models import Conversation
from playground.serving.web import dispatch
from playground.serving.shared import registry

pytestmark = pytest.mark.django_db

HELLO = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello   there\nfriend"}]


def anonymous_conversation(client) -> Conversation:
    client.get("/")
    return store.open_conversation(None, client.session.session_key, None, HELLO)


def test_chat_page_context(client):
    conversation = anonymous_conversation(client)
    response = client.get("/")
    assert response.status_code == 200
    assert [t.name for t in response.templates][0] == "chat/index.html"
    ctx = response.context
    assert list(ctx["conversations"]) == [conversation]
    assert ctx["active_conversation"] is None
    assert ctx["ws_path"] == "/ws/chat/"
    config = ctx["chat_config"]
    specs = {spec["name"]: spec for spec in config["sampling"]}
    assert specs["max_tokens"]["max"] == ctx["limits"]["max_tokens"] >= specs["max_tokens"]["value"]
    assert config["conversation"] is None and config["user"]["is_authenticated"] is False
    assert config["urls"]["conversations"] == "/api/conversations/"
    assert "chat-config" in response.content.decode()


def test_conversation_page_and_json(client):
    conversation = anonymous_conversation(client)
    page = client.get(f"/c/{conversation.id}/")
    assert page.context["active_conversation"] == conversation
    detail = page.context["chat_config"]["conversation"]
    assert detail["system_prompt"] == "be brief"
    assert detail["title"] == "Hello there friend"
    assert [m["role"] for m in detail["messages"]] == ["system", "user"]
    assert client.get(f"/api/conversations/{conversation.id}/").json() == json.loads(json.dumps(detail))
    assert client.get("/api/conversations/").json()["conversations"][0]["id"] == str(conversation.id)


def test_other_people_cannot_see_or_delete_a_conversation(client, django_user_model):
    conversation = anonymous_conversation(client)
    stranger = type(client)()
    stranger.force_login(django_user_model.objects.create_user("mallory", password="x" * 12))
    assert stranger.get(f"/c/{conversation.id}/").status_code == 404
    assert stranger.get(f"/api/conversations/{conversation.id}/").status_code == 404
    assert stranger.delete(f"/api/conversations/{conversation.id}/").status_code == 404
    assert stranger.get("/api/conversations/").json() == {"conversations": [], "next": None}
    assert client.delete(f"/api/conversations/{conversation.id}/").status_code == 204
    assert not Conversation.objects.filter(id=conversation.id).exists()


def test_logged_in_users_own_their_conversations(client, django_user_model):
    user = django_user_model.objects.create_user("ada", password="x" * 12)
    client.force_login(user)
    conversation = store.open_conversation(user, "", None, HELLO)
    assert conversation.user == user
    assert client.get("/").context["chat_config"]["user"]["username"] == "ada"
    assert [c["id"] for c in client.get("/api/conversations/").json()["conversations"]] == [str(conversation.id)]


def test_anonymous_use_can_be_switched_off(client, settings):
    settings.PLAYGROUND_ALLOW_ANONYMOUS = False
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert client.get("/api/conversations/").status_code == 401


def test_login_page_renders(client):
    assert client.get("/accounts/login/").status_code == 200


def test_transcript_sync_keeps_matching_prefix_and_branches_the_rest():
    conversation = store.open_conversation(None, "s1", None, HELLO)
    reply = {"outputs": [{"index": 0, "text": "Hi!", "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 9, "completion_tokens": 2, "cached_tokens": 0},
             "timing": {"ttft_ms": 5.0, "tokens_per_s": 10.0}}
    store.save_reply(conversation.id, "r1", reply, "w1@h")
    kept = list(conversation.messages.order_by("position"))
    # Regenerate: the same transcript without the reply shows the earlier turns, their rows kept; the old reply
    # stays as a branch (tests/playground/test_chat_branches.py).
    conversation = store.open_conversation(None, "s1", conversation.id, HELLO)
    assert store.active_path(conversation) == kept[:2]
    assert conversation.messages.count() == 3
    # Edit the user turn: a new branch beside it.
    edited = HELLO[:1] + [{"role": "user", "content": "changed"}]
    conversation = store.open_conversation(None, "s1", conversation.id, edited)
    assert [m.content for m in store.active_path(conversation)] == ["be brief", "changed"]
    with pytest.raises(store.ConversationNotFound):
        store.open_conversation(None, "other-session", conversation.id, HELLO)
    with pytest.raises(store.ConversationNotFound):
        store.open_conversation(None, "s1", uuid.uuid4(), HELLO)


def test_admin_lists_conversations(admin_client):
    store.open_conversation(None, "s1", None, HELLO)
    assert b"Hello there friend" in admin_client.get("/admin/chat/conversation/").content
    assert admin_client.get("/admin/chat/message/").status_code == 200


def test_healthz_without_workers_is_degraded(client):
    body = client.get("/healthz").json()
    assert body["status"] == "degraded"
    assert body["database"] == {"ok": True} and body["broker"]["ok"] is True and body["workers"] == []


def test_healthz_reports_live_workers(client):
    registry.beat({"name": "w1@h", "queue": "gpu.w1@h", "state": "ready", "metrics": {"num_blocks_used": 3}})
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert [(w["name"], w["state"], w["metrics"]) for w in body["workers"]] == [
        ("w1@h", "ready", {"num_blocks_used": 3})
    ]


def test_healthz_is_503_when_the_database_is_down(client, monkeypatch):
    from playground.serving.web import views

    monkeypatch.setattr(views, "_database_ok", lambda: False)
    response = client.get("/healthz")
    assert response.status_code == 503 and response.json()["status"] == "down"


def test_routing_prefers_the_last_worker_only_when_alive_ready_and_idle():
    def queue(worker):
        (chosen,) = dispatch.choose_queues([worker])
        return chosen

    assert queue("") == "gpu"
    assert queue("gone@h") == "gpu"
    registry.beat({"name": "w1@h", "queue": "gpu.w1@h", "state": "loading", "metrics": {}})
    assert queue("w1@h") == "gpu"
    registry.beat({"name": "w1@h", "queue": "gpu.w1@h", "state": "ready", "metrics": {"num_requests_waiting": 0}})
    assert queue("w1@h") == "gpu.w1@h"
    registry.beat({"name": "w1@h", "queue": "gpu.w1@h", "state": "ready", "metrics": {"num_requests_waiting": 2}})
    assert queue("w1@h") == "gpu"


def test_a_burst_is_routed_request_by_request_from_one_registry_read(monkeypatch):
    registry.beat({"name": "idle@h", "queue": "gpu.idle@h", "state": "ready", "metrics": {"num_requests_waiting": 0}})
    registry.beat({"name": "busy@h", "queue": "gpu.busy@h", "state": "ready", "metrics": {"num_requests_waiting": 3}})
    reads = []
    get_many = registry.get_many
    monkeypatch.setattr(registry, "get_many", lambda names: reads.append(names) or get_many(names))
    assert dispatch.choose_queues(["idle@h", "", "busy@h", "gone@h", "idle@h"]) == [
        "gpu.idle@h", "gpu", "gpu", "gpu", "gpu.idle@h"]
    assert len(reads) == 1


def test_registry_forgets_dead_workers():
    registry.beat({"name": "a@h", "queue": "gpu.a@h", "state": "ready"})
    registry.beat({"name": "b@h", "queue": "gpu.b@h", "state": "ready"})
    registry.forget("a@h")
    assert [w["name"] for w in registry.live_workers()] == ["b@h"]
    assert registry.get("a@h") is None


def test_web_process_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import django, os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'playground.settings'; django.setup();"
        "import playground.asgi, playground.urls, playground.serving.worker.tasks, playground.serving.worker.runtime;"
        "import playground.serving.management.commands.playground;"
        "print(sorted(m for m in ('torch', 'inference', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"

