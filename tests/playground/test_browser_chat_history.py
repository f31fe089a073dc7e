"""Browser test of the chat page's conversation list: rename in place, search, pin, paging by scrolling, export
and import, all from the keyboard or real buttons, against Django's live test server (the page's JSON endpoints
and static files; no model and no socket are needed for the list, so the chat socket stays unconnected)."""
import json

import pytest
from django.test import Client

from playground.chat import store
from playground.chat.listing import PAGE_SIZE
from playground.chat.models import Conversation

pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.usefixtures("orm_beside_playwright")]

FILLERS = PAGE_SIZE + 2


def titles(page) -> list[str]:
    return page.locator("#conv-list .conv-title").all_inner_texts()


def item(page, title: str):
    return page.locator("#conv-list li", has=page.locator(".conv-title", has_text=title))


@pytest.fixture
def signed_in(live_server, page, django_user_model):
    """Ada, with FILLERS conversations and, newest, "Birds" (two branches, one of them about the kiwi)."""
    ada = django_user_model.objects.create_user("ada", password="x" * 12)
    for i in range(FILLERS):
        store.open_conversation(ada, "", None, [{"role": "user", "content": f"filler {i:02d}"}])
    birds = store.open_conversation(ada, "", None, [{"role": "user", "content": "Birds"}])
    store.save_reply(birds.id, "r1", {"outputs": [{"index": 0, "text": "The kiwi cannot fly.",
                                                   "finish_reason": "stop"}]}, "w1")
    store.open_conversation(ada, "", birds.id, [{"role": "user", "content": "Birds"}])
    store.save_reply(birds.id, "r2", {"outputs": [{"index": 0, "text": "Penguins swim.", "finish_reason": "stop"}]},
                     "w1")
    client = Client()
    client.force_login(ada)
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                               "url": live_server.url}])
    page.goto(f"{live_server.url}/")
    page.wait_for_function(f"() => document.querySelectorAll('#conv-list li').length === {PAGE_SIZE}")
    return ada, birds


def test_rename_search_pin_scroll_export_and_import_from_the_sidebar(signed_in, page, tmp_path):
    ada, birds = signed_in
    assert titles(page)[0] == "Birds"

    # Infinite scroll: bringing "Load more" into view loads the rest, and it goes away.
    page.locator("#conv-more").scroll_into_view_if_needed()
    page.wait_for_function(f"() => document.querySelectorAll('#conv-list li').length === {FILLERS + 1}")
    assert page.locator("#conv-more").is_hidden()

    # Rename from the keyboard: the link, Tab to the pin button, Tab to rename, Enter.
    item(page, "Birds").locator("a").focus()
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.getAttribute('aria-label')") == "Rename “Birds”"
    page.keyboard.press("Enter")
    field = page.locator(".conv-rename-form input")
    assert field.evaluate("el => el === document.activeElement")
    field.fill("   ")
    field.press("Enter")
    page.wait_for_function("() => document.querySelector('.conv-rename-error').innerText === "
                           "'title: must not be empty'")
    field.fill("x" * 201)
    field.press("Enter")
    page.wait_for_function("() => document.querySelector('.conv-rename-error').innerText.includes('at most 200')")
    field.fill("Flightless birds")
    field.press("Enter")
    item(page, "Flightless birds").wait_for()
    assert page.evaluate("() => document.activeElement.getAttribute('aria-label')") == "Rename “Flightless birds”"
    birds.refresh_from_db()
    assert birds.title == "Flightless birds"

    # Search over message text, on a branch that is not shown: only that conversation is listed.
    page.fill("#conv-search", "KIWI")
    page.wait_for_function("() => document.querySelectorAll('#conv-list li').length === 1")
    assert titles(page) == ["Flightless birds"]
    page.fill("#conv-search", "no such words")
    page.wait_for_function("() => document.querySelectorAll('#conv-list li').length === 0")
    assert page.locator("#conv-empty").inner_text() == "No conversation matches."
    page.fill("#conv-search", "")
    page.wait_for_function(f"() => document.querySelectorAll('#conv-list li').length === {PAGE_SIZE}")

    # Pin the oldest one (on the second page): it comes first, its button pressed and still focused.
    page.locator("#conv-more").scroll_into_view_if_needed()
    page.wait_for_function(f"() => document.querySelectorAll('#conv-list li').length === {FILLERS + 1}")
    assert titles(page)[-1] == "filler 00"
    item(page, "filler 00").locator(".conv-pin").focus()
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('#conv-list .conv-title').innerText === 'filler 00'")
    pin = item(page, "filler 00").locator(".conv-pin")
    assert pin.get_attribute("aria-pressed") == "true"
    assert pin.evaluate("el => el === document.activeElement")
    assert titles(page)[:2] == ["filler 00", "Flightless birds"]

    # Export the open conversation as JSON from the toolbar, import it back with the Import button.
    item(page, "Flightless birds").locator("a").click()
    page.wait_for_function("() => document.querySelector('#chat-title').innerText === 'Flightless birds'")
    with page.expect_download() as download:
        page.click("#export-json")
    exported = tmp_path / "birds.json"
    download.value.save_as(exported)
    document = json.loads(exported.read_text())
    assert [m["content"] for m in document["conversations"][0]["messages"]] == [
        "Birds", "The kiwi cannot fly.", "Penguins swim."]
    with page.expect_download() as download:
        page.click("#export-markdown")
    markdown = tmp_path / "birds.md"
    download.value.save_as(markdown)
    assert "Penguins swim." in markdown.read_text() and "kiwi" not in markdown.read_text()

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**document, "version": 9}))
    with page.expect_file_chooser() as chooser:
        page.click("#import-button")
    chooser.value.set_files(bad)
    page.wait_for_function("() => !document.querySelector('#conv-status').hidden")
    assert page.locator("#conv-status").inner_text().startswith("Nothing was imported: version: 9 is not supported")
    assert Conversation.objects.filter(user=ada).count() == FILLERS + 1

    with page.expect_file_chooser() as chooser:
        page.click("#import-button")
    chooser.value.set_files(exported)
    page.wait_for_function("() => document.querySelector('#conv-status').innerText === 'Imported 1 conversation.'")
    page.wait_for_function("() => document.querySelectorAll('#conv-list li .conv-title').length > 1 && "
                           "[...document.querySelectorAll('#conv-list .conv-title')]"
                           ".filter((t) => t.innerText === 'Flightless birds').length === 2")
    copies = Conversation.objects.filter(user=ada, title="Flightless birds")
    assert copies.count() == 2
    assert {tuple(m.content for m in store.active_path(c)) for c in copies} == {("Birds", "Penguins swim.")}
    assert {c.messages.count() for c in copies} == {3}
