"""The conversation list's endpoints (playground/chat/views.py, listing.py, transfer.py): rename, pin, search,
pages past 100, export (JSON tree, Markdown) and import, each for its owner only."""
import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from playground.chat import store, transfer
from playground.chat.listing import PAGE_SIZE
from playground.chat.models import Conversation, Message

pytestmark = pytest.mark.django_db

SYSTEM = {"role": "system", "content": "be brief"}
LIST = "/api/conversations/"


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def reply(conversation, text, n=1):
    done = {"outputs": [{"index": i, "text": f"{text}{'' if i == 0 else i}", "finish_reason": "stop"}
                        for i in range(n)],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "cached_tokens": 0},
            "timing": {"ttft_ms": 1.5, "tokens_per_s": 9.0}}
    return store.save_reply(conversation.id, f"r-{text}", done, "w1")


@pytest.fixture
def branched(ada):
    """Ada's conversation with two branches: q1 a1 q2 a2 (n=2 samples), and q1 a1 "q2 edited" a2' shown."""
    owner = ada.account
    conversation = store.open_conversation(owner, "", None, [SYSTEM, user("q1")])
    reply(conversation, "a1")
    store.open_conversation(owner, "", conversation.id, [SYSTEM, user("q1"), assistant("a1"), user("q2")])
    reply(conversation, "a2", n=2)
    store.open_conversation(owner, "", conversation.id, [SYSTEM, user("q1"), assistant("a1"), user("q2 edited")])
    reply(conversation, "a2'")
    conversation.refresh_from_db()
    return conversation


def make(owner, count, title="chat"):
    """`count` conversations of `owner` (one message each), all with the same updated_at: the cursor's tie-break
    on the id is what orders them."""
    now = timezone.now()
    made = Conversation.objects.bulk_create([Conversation(user=owner, title=f"{title} {i}") for i in range(count)])
    Conversation.objects.filter(id__in=[c.id for c in made]).update(updated_at=now)
    Message.objects.bulk_create([Message(conversation=c, position=0, role="user", content=f"text {i}")
                                 for i, c in enumerate(made)])
    return made


def walk(client, query=""):
    """Every page of the list, following `next`; the ids in order and the number of pages."""
    ids, cursor, pages = [], None, 0
    while True:
        params = {"q": query} if query else {}
        if cursor:
            params["cursor"] = cursor
        body = client.get(LIST, params).json()
        pages += 1
        ids += [c["id"] for c in body["conversations"]]
        cursor = body["next"]
        if cursor is None:
            return ids, pages


def tree(conversation):
    """The message tree as plain data, database ids left out: each message with its children (oldest first),
    and the path of contents down to the leaf."""
    messages = list(conversation.messages.order_by("id"))
    children = {}
    for m in messages:
        children.setdefault(m.parent_id, []).append(m)

    def node(m):
        return {"role": m.role, "content": m.content, "position": m.position, "samples": m.samples,
                "finish_reason": m.finish_reason, "usage": m.usage, "timing": m.timing,
                "children": [node(c) for c in children.get(m.id, [])]}

    return {"roots": [node(m) for m in children.get(None, [])],
            "shown": [m.content for m in store.active_path(conversation)]}


# ---------------------------------------------------------------- rename and pin

def test_rename_keeps_the_list_order_and_refuses_empty_or_long_titles(ada, branched):
    url = f"{LIST}{branched.id}/"
    before = branched.updated_at
    response = ada.patch(url, {"title": "  Colours\nof the rainbow "}, content_type="application/json")
    assert response.status_code == 200 and response.json()["title"] == "Colours of the rainbow"
    branched.refresh_from_db()
    assert branched.title == "Colours of the rainbow" and branched.updated_at == before
    for body, field, why in [({"title": "   "}, "title", "must not be empty"),
                             ({"title": "x" * 201}, "title", "at most 200 characters"),
                             ({"title": 7}, "title", "must be a string"),
                             ({"pinned": "yes"}, "pinned", "true or false"),
                             ({"colour": "red"}, "colour", "unknown field"),
                             ({}, "title or pinned", "nothing to change")]:
        response = ada.patch(url, body, content_type="application/json")
        assert response.status_code == 400, body
        assert response.json()["error"].startswith(f"{field}:") and why in response.json()["error"]
    assert ada.patch(url, "not json", content_type="application/json").status_code == 400
    branched.refresh_from_db()
    assert branched.title == "Colours of the rainbow" and not branched.pinned


def test_pinned_conversations_come_first_and_unpinning_puts_them_back(ada):
    old, middle, new = make(ada.account, 3)
    for age, conversation in enumerate([new, middle, old]):
        Conversation.objects.filter(id=conversation.id).update(updated_at=timezone.now() - timedelta(hours=age))
    order = [str(c.id) for c in (new, middle, old)]
    assert [c["id"] for c in ada.get(LIST).json()["conversations"]] == order
    response = ada.patch(f"{LIST}{old.id}/", {"pinned": True}, content_type="application/json")
    assert response.json()["pinned"] is True
    listed = ada.get(LIST).json()["conversations"]
    assert [c["id"] for c in listed] == [str(old.id), str(new.id), str(middle.id)]
    assert [c["pinned"] for c in listed] == [True, False, False]
    ada.patch(f"{LIST}{old.id}/", {"pinned": False}, content_type="application/json")
    assert [c["id"] for c in ada.get(LIST).json()["conversations"]] == order


# ---------------------------------------------------------------- pages and search

def test_the_list_pages_past_100_each_conversation_once_in_order(ada, mallory):
    made = make(ada.account, 130)
    Conversation.objects.filter(id=made[77].id).update(pinned=True)
    first = ada.get(LIST).json()
    assert len(first["conversations"]) == PAGE_SIZE and first["next"]
    ids, pages = walk(ada)
    expected = [str(made[77].id)] + sorted((str(c.id) for c in made if c != made[77]), reverse=True)
    assert ids == expected and pages == 3  # 50 + 50 + 30, the pinned one first, ties broken by id
    assert walk(mallory) == ([], 1)


def test_a_conversation_updated_while_paging_is_neither_repeated_nor_skipped(ada):
    made = make(ada.account, PAGE_SIZE + 10)
    first = ada.get(LIST).json()
    shown = [c["id"] for c in first["conversations"]]
    # one not yet shown becomes the newest (a reply came in): it moves to the top, out of the pages still to come
    moved = next(c for c in made if str(c.id) not in shown)
    store.save_reply(moved.id, "r", {"outputs": [{"index": 0, "text": "hi", "finish_reason": "stop"}]}, "w1")
    rest = [c["id"] for c in ada.get(LIST, {"cursor": first["next"]}).json()["conversations"]]
    assert not set(shown) & set(rest) and str(moved.id) not in rest
    assert len(shown) + len(rest) == len(made) - 1


def test_search_matches_titles_and_message_text_on_every_branch_once_each(ada, branched, mallory,
                                                                        django_assert_num_queries):
    make(ada.account, 3, title="unrelated")
    titled = store.open_conversation(ada.account, "", None, [user("hello")])
    ada.patch(f"{LIST}{titled.id}/", {"title": "About Q2 things"}, content_type="application/json")
    # "q2" is in the old branch's question, the edited one and the title of another conversation
    with django_assert_num_queries(3):  # session, user, then one query for the page, however many match
        found = ada.get(LIST, {"q": "Q2"}).json()
    assert [c["id"] for c in found["conversations"]] == [str(titled.id), str(branched.id)]
    assert found["next"] is None
    assert [c["id"] for c in ada.get(LIST, {"q": "a2'"}).json()["conversations"]] == [str(branched.id)]
    assert ada.get(LIST, {"q": "nowhere"}).json() == {"conversations": [], "next": None}
    assert mallory.get(LIST, {"q": "q2"}).json() == {"conversations": [], "next": None}


def test_search_results_are_paged_like_the_list(ada):
    make(ada.account, PAGE_SIZE + 5, title="needle")
    make(ada.account, 20, title="hay")
    ids, pages = walk(ada, "NEEDLE")
    assert len(ids) == len(set(ids)) == PAGE_SIZE + 5 and pages == 2
    assert set(Conversation.objects.filter(id__in=ids).values_list("title", flat=True)) == {
        f"needle {i}" for i in range(PAGE_SIZE + 5)}


@pytest.mark.parametrize("params, field", [({"cursor": "garbage!"}, "cursor"), ({"cursor": "WzEsMiwzXQ"}, "cursor"),
                                           ({"q": "x" * 201}, "q"), ({"limit": "5"}, "limit")])
def test_bad_list_parameters_are_refused_by_name(ada, params, field):
    response = ada.get(LIST, params)
    assert response.status_code == 400 and response.json()["error"].startswith(f"{field}:")


# ---------------------------------------------------------------- export and import

def test_json_export_then_import_gives_the_same_tree_owned_by_the_importer(ada, branched, mallory):
    exported = ada.get(f"{LIST}{branched.id}/export/")
    assert exported["Content-Type"] == "application/json"
    assert exported["Content-Disposition"] == f'attachment; filename="conversation-{branched.id}.json"'
    document = json.loads(exported.content)
    assert document["format"] == transfer.FORMAT and document["version"] == 1
    assert len(document["conversations"][0]["messages"]) == 7  # both branches

    response = mallory.post(f"{LIST}import/", exported.content, content_type="application/json")
    assert response.status_code == 201
    (summary,) = response.json()["conversations"]
    imported = Conversation.objects.get(id=summary["id"])
    assert imported.user.username == "mallory" and imported.id != branched.id
    assert tree(imported) == tree(branched)
    assert (imported.title, imported.pinned, imported.updated_at) == (branched.title, False, branched.updated_at)
    assert [c["id"] for c in mallory.get(LIST).json()["conversations"]] == [summary["id"]]
    assert ada.get(f"{LIST}{imported.id}/").status_code == 404  # the importer's only
    assert [c["id"] for c in ada.get(LIST).json()["conversations"]] == [str(branched.id)]


def test_exporting_everything_exports_only_the_callers_conversations(ada, branched, mallory):
    mallory.post(f"{LIST}import/", ada.get(f"{LIST}{branched.id}/export/").content, content_type="application/json")
    other = store.open_conversation(ada.account, "", None, [user("second chat")])
    ada.patch(f"{LIST}{other.id}/", {"pinned": True}, content_type="application/json")
    document = json.loads(ada.get(f"{LIST}export/").content)
    assert [c["title"] for c in document["conversations"]] == ["second chat", "q1"]
    assert document["conversations"][0]["pinned"] is True
    markdown = ada.get(f"{LIST}export/", {"format": "markdown"}).content.decode()
    assert markdown.index("# second chat\n") < markdown.index("\n---\n") < markdown.index("# q1\n")
    assert markdown.count("# q1\n") == 1  # not mallory's copy
    # a round trip of the whole file into an anonymous session
    anonymous = Client()
    anonymous.get("/")
    response = anonymous.post(f"{LIST}import/", json.dumps(document), content_type="application/json")
    assert response.status_code == 201
    imported = Conversation.objects.filter(session_key=anonymous.session.session_key, user=None)
    assert sorted(tree(c)["shown"] == tree(branched)["shown"] for c in imported) == [False, True]
    assert [c["id"] for c in anonymous.get(LIST).json()["conversations"]] == [
        c["id"] for c in response.json()["conversations"]]


def test_markdown_export_is_the_branch_shown(ada, branched):
    response = ada.get(f"{LIST}{branched.id}/export/", {"format": "markdown"})
    assert response["Content-Type"].startswith("text/markdown")
    assert response["Content-Disposition"].endswith('.md"')
    text = response.content.decode()
    assert text.startswith("# q1\n")
    assert "## System\n\nbe brief" in text and "## User\n\nq2 edited" in text and "## Assistant\n\na2'" in text
    assert "\n\nq2\n" not in text and "a21" not in text  # the other branch is the JSON export's
    assert text.index("q1") < text.index("a1") < text.index("q2 edited") < text.index("a2'")
    assert ada.get(f"{LIST}{branched.id}/export/", {"format": "pdf"}).json()["error"].startswith("format:")


def test_every_action_on_someone_elses_conversation_is_not_found(branched, mallory):
    base = f"{LIST}{branched.id}/"
    assert mallory.get(base).status_code == 404
    assert mallory.patch(base, {"title": "mine"}, content_type="application/json").status_code == 404
    assert mallory.patch(base, {"pinned": True}, content_type="application/json").status_code == 404
    assert mallory.get(f"{base}export/").status_code == 404
    assert mallory.get(f"{base}export/", {"format": "markdown"}).status_code == 404
    assert mallory.delete(base).status_code == 404
    assert json.loads(mallory.get(f"{LIST}export/").content)["conversations"] == []
    branched.refresh_from_db()
    assert branched.title == "q1" and not branched.pinned


def valid_document():
    return {"format": transfer.FORMAT, "version": 1, "exported_at": "2026-12-01T10:00:00+00:00",
            "conversations": [{"title": "ok", "messages": [{"id": 0, "role": "user", "content": "hi"},
                                                          {"id": 1, "parent": 0, "role": "assistant",
                                                           "content": "hello"}], "leaf": 1}]}


def broken(change):
    document = valid_document()
    change(document)
    return document


BAD_DOCUMENTS = [
    (lambda d: d.update(format="other"), "format:"),
    (lambda d: d.update(version=2), "version:"),
    (lambda d: d.update(version="1"), "version:"),
    (lambda d: d.update(version=True), "version:"),
    (lambda d: d.update(extra=1), "the file.extra: unknown field"),
    (lambda d: d.update(conversations={}), "conversations: must be a list"),
    (lambda d: d["conversations"].append("chat"), "conversations[1]: must be a JSON object"),
    (lambda d: d["conversations"][0].pop("messages"), "conversations[0].messages: missing"),
    (lambda d: d["conversations"][0].update(title="x" * 201), "conversations[0].title: at most 200"),
    (lambda d: d["conversations"][0].update(pinned=1), "conversations[0].pinned:"),
    (lambda d: d["conversations"][0].update(updated_at="yesterday"), "conversations[0].updated_at:"),
    (lambda d: d["conversations"][0].update(leaf=5), "conversations[0].leaf:"),
    (lambda d: d["conversations"][0]["messages"][1].update(parent=1), "conversations[0].messages[1].parent:"),
    (lambda d: d["conversations"][0]["messages"].reverse(), "conversations[0].messages[0].parent:"),
    (lambda d: d["conversations"][0]["messages"][1].update(id=0), "conversations[0].messages[1].id:"),
    (lambda d: d["conversations"][0]["messages"][1].update(id="1"), "conversations[0].messages[1].id:"),
    (lambda d: d["conversations"][0]["messages"][1].update(role="tool"), "conversations[0].messages[1].role:"),
    (lambda d: d["conversations"][0]["messages"][1].update(content=None), "conversations[0].messages[1].content:"),
    (lambda d: d["conversations"][0]["messages"][1].update(content="x" * (transfer.MAX_CONTENT_CHARS + 1)),
     "conversations[0].messages[1].content: at most"),
    (lambda d: d["conversations"][0]["messages"][1].update(samples=["a", 2]),
     "conversations[0].messages[1].samples[1]:"),
    (lambda d: d["conversations"][0]["messages"][1].update(samples=[]), "conversations[0].messages[1].samples:"),
    (lambda d: d["conversations"][0]["messages"][1].update(usage=[1]), "conversations[0].messages[1].usage:"),
    (lambda d: d["conversations"][0]["messages"][1].update(worker="w1"),
     "conversations[0].messages[1].worker: unknown field"),
    (lambda d: d["conversations"][0]["messages"][1].update(content="nul\x00"), "contains a NUL character"),
    # the first conversation is valid: all or nothing
    (lambda d: d["conversations"].append({"title": "bad", "messages": [{"id": 0, "role": "x", "content": ""}]}),
     "conversations[1].messages[0].role:"),
]


@pytest.mark.parametrize("change, error", BAD_DOCUMENTS)
def test_a_bad_import_is_refused_by_field_and_changes_nothing(ada, branched, change, error):
    before = (Conversation.objects.count(), Message.objects.count())
    response = ada.post(f"{LIST}import/", json.dumps(broken(change)), content_type="application/json")
    assert response.status_code == 400
    assert error in response.json()["error"]
    assert (Conversation.objects.count(), Message.objects.count()) == before


def test_import_refuses_what_is_not_a_json_object_and_files_over_the_cap(ada, monkeypatch):
    for body, error in [(b"{", "file is not valid JSON"), (b"[]", "file must be a JSON object"),
                        (b"\xff", "file is not valid UTF-8")]:
        response = ada.post(f"{LIST}import/", body, content_type="application/json")
        assert response.status_code == 400 and response.json()["error"] == error
    monkeypatch.setattr(transfer, "MAX_IMPORT_BYTES", 100)
    response = ada.post(f"{LIST}import/", json.dumps(valid_document()), content_type="application/json")
    assert response.status_code == 413 and response.json()["error"] == "file larger than 100 bytes"
    assert Conversation.objects.count() == 0


def test_import_fails_as_a_whole_when_a_write_fails(ada, monkeypatch):
    """The conversations are written in one transaction: a failure in the second undoes the first."""
    document = valid_document()
    document["conversations"].append({**document["conversations"][0], "title": "second"})
    real = Message.objects.bulk_create
    calls = []

    def failing_second(objs, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return real(objs, *args, **kwargs)

    monkeypatch.setattr(Message.objects, "bulk_create", failing_second)
    with pytest.raises(RuntimeError):
        transfer.import_conversations(document, ada.account, "")
    assert Conversation.objects.count() == 0 and Message.objects.count() == 0


def test_an_imported_conversation_keeps_its_tree_and_shows_its_leaf(ada):
    document = valid_document()
    messages = document["conversations"][0]["messages"]
    messages.append({"id": 7, "parent": 0, "role": "assistant", "content": "a branch", "samples": ["a branch", "b"],
                     "finish_reason": "length", "usage": {"completion_tokens": 2}, "timing": None})
    document["conversations"][0]["leaf"] = 7
    (summary,) = ada.post(f"{LIST}import/", json.dumps(document), content_type="application/json").json()[
        "conversations"]
    detail = ada.get(f"{LIST}{summary['id']}/").json()
    assert [m["content"] for m in detail["messages"]] == ["hi", "a branch"]
    assert len(detail["messages"][1]["siblings"]) == 2
    assert detail["messages"][1]["samples"] == ["a branch", "b"]
    assert detail["messages"][1]["finish_reason"] == "length"


def test_imported_times_are_kept_and_a_time_without_zone_is_utc(ada):
    document = valid_document()
    document["conversations"][0].update(created_at="2026-01-02T03:04:05", updated_at="2026-02-03T04:05:06+02:00")
    (summary,) = ada.post(f"{LIST}import/", json.dumps(document), content_type="application/json").json()[
        "conversations"]
    imported = Conversation.objects.get(id=summary["id"])
    assert imported.created_at.isoformat() == "2026-01-02T03:04:05+00:00"
    assert imported.updated_at.isoformat() == "2026-02-03T02:05:06+00:00"


def test_a_file_larger_than_the_api_body_cap_imports(ada, settings):
    """An export is often larger than the 1 MiB that other request bodies may be; the import has its own cap."""
    document = valid_document()
    long_text = "y" * (transfer.MAX_CONTENT_CHARS - 1)
    document["conversations"][0]["messages"] += [
        {"id": i, "parent": i - 1, "role": "user" if i % 2 == 0 else "assistant", "content": long_text}
        for i in range(2, 10)]
    document["conversations"][0]["leaf"] = 9
    body = json.dumps(document)
    assert len(body) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    response = ada.post(f"{LIST}import/", body, content_type="application/json")
    assert response.status_code == 201
    imported = Conversation.objects.get(id=response.json()["conversations"][0]["id"])
    assert [len(m.content) for m in store.active_path(imported)][2:] == [len(long_text)] * 8
    assert [m.position for m in store.active_path(imported)] == list(range(10))
