"""Browser test of the chat page's presets (static/chat/presets.js): save the system prompt and sampling settings
under a name, apply them back into the controls (the conversation's messages untouched), overwrite and delete,
from the keyboard and real buttons, against Django's live test server (no model and no socket are needed)."""
import pytest
from django.test import Client

from playground.chat import store
from playground.chat.models import Preset

pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.usefixtures("orm_beside_playwright")]

TEMPERATURE = '#params input[name="temperature"]'
TOP_K = '#params input[name="top_k"]'
ADAPTER = "sql-lora"


def status_is(page, text: str) -> None:
    page.wait_for_function("(text) => document.querySelector('#preset-status').innerText === text", arg=text)


def transcript(page) -> list[str]:
    return page.locator("#messages .msg-body").all_inner_texts()


@pytest.fixture
def birds(live_server, page, django_user_model, settings):
    """Ada, signed in, on her conversation "Birds" (a question and its answer); the server has an adapter, so the
    page has a model picker."""
    settings.PLAYGROUND_LORA_MODULES = {ADAPTER: "/adapters/sql"}
    ada = django_user_model.objects.create_user("ada", password="x" * 12)
    conversation = store.open_conversation(ada, "", None, [{"role": "user", "content": "Birds"}])
    store.save_reply(conversation.id, "r1", {"outputs": [{"index": 0, "text": "The kiwi cannot fly.",
                                                          "finish_reason": "stop"}]}, "w1")
    client = Client()
    client.force_login(ada)
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                               "url": live_server.url}])
    page.goto(f"{live_server.url}/c/{conversation.id}/")
    page.wait_for_function("() => document.querySelectorAll('#messages .msg').length === 2")
    return ada, conversation


def test_save_apply_overwrite_and_delete_a_preset(birds, page):
    ada, conversation = birds
    shown = transcript(page)
    stored = [(m.role, m.content) for m in conversation.messages.order_by("id")]

    # Save the current settings under a name, from the keyboard.
    page.click("#system-box summary")
    page.fill("#system-prompt", "Answer in haiku.")
    page.fill(TEMPERATURE, "0.3")
    page.fill(TOP_K, "7")
    page.select_option("#model", ADAPTER)
    page.focus("#preset-save")
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement.id") == "preset-name"
    page.keyboard.type("Haiku")
    page.keyboard.press("Enter")
    status_is(page, "Saved “Haiku”.")
    assert page.eval_on_selector("#preset-select", "s => s.selectedOptions[0].text") == "Haiku"
    preset = Preset.objects.get(user=ada)
    assert (preset.name, preset.system_prompt, preset.model) == ("Haiku", "Answer in haiku.", ADAPTER)
    assert (preset.params["temperature"], preset.params["top_k"]) == (0.3, 7)

    # The same name again is refused by the server, which names the field.
    page.click("#preset-save")
    page.fill("#preset-name", "Haiku")
    page.press("#preset-name", "Enter")
    status_is(page, "name: you already have a preset named 'Haiku'")
    page.press("#preset-name", "Escape")
    assert page.locator("#preset-name-form").is_hidden()

    # Change the controls, then apply the preset: they take its values back; the conversation is untouched.
    page.fill("#system-prompt", "")
    page.fill(TEMPERATURE, "1.5")
    page.fill(TOP_K, "0")
    page.select_option("#model", index=0)  # the base model
    page.select_option("#preset-select", label="Haiku")
    page.focus("#preset-apply")
    page.keyboard.press("Enter")
    status_is(page, "Applied “Haiku”.")
    assert page.input_value("#system-prompt") == "Answer in haiku."
    assert (page.input_value(TEMPERATURE), page.input_value(TOP_K), page.input_value("#model")) == ("0.3", "7", ADAPTER)
    assert page.locator("#system-summary").inner_text() == "· Answer in haiku."
    assert transcript(page) == shown
    assert [(m.role, m.content) for m in conversation.messages.order_by("id")] == stored

    # Overwrite it with new settings (after a confirmation).
    page.fill(TEMPERATURE, "0.9")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#preset-overwrite")
    status_is(page, "Saved the current settings as “Haiku”.")
    preset.refresh_from_db()
    assert (preset.params["temperature"], preset.params["top_k"]) == (0.9, 7)

    # Delete: dismissing the confirmation keeps it, accepting deletes it.
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("#preset-delete")
    assert Preset.objects.filter(user=ada).count() == 1
    assert page.locator("#preset-status").inner_text() == "Saved the current settings as “Haiku”."
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#preset-delete")
    status_is(page, "Deleted “Haiku”.")
    assert page.locator("#preset-select option").all_text_contents() == ["No preset chosen"]
    assert page.locator("#preset-apply").is_disabled()
    assert not Preset.objects.filter(user=ada).exists()
