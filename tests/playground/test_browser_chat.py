"""Browser tests of the chat page's long-conversation features against the embedded playground (real model on
the CPU, Debian's chromium through playwright), with a deliberately small context window
(ENGINE_MAX_MODEL_LEN=256) so that a short chat outgrows it."""
import re

import pytest

pytest.importorskip("playwright.sync_api")

from api_server import start  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WINDOW = 256
MAX_TOKENS = 24
TURNS = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = start(tmp_path_factory.mktemp("chat-browser"), {"ENGINE_MAX_MODEL_LEN": str(WINDOW)})
    yield live
    live.stop()


def meter_used(page) -> int:
    return int(page.get_attribute("#context-meter", "data-used"))


def test_a_ten_turn_chat_outgrows_the_window_and_every_turn_is_answered(server, page):
    page.goto(f"{server.base_url}/")
    page.wait_for_selector('#conn[data-status="open"]')
    page.fill('#params [name="temperature"]', "0")
    page.fill('#params [name="max_tokens"]', str(MAX_TOKENS))
    # The meter counts the reply's room and the draft as it is typed, against the server's window.
    assert f"/ {WINDOW} tokens" in page.inner_text("#context-meter")
    empty = meter_used(page)
    assert empty == MAX_TOKENS
    page.locator("#prompt").press_sequentially("Name a colour")
    assert meter_used(page) > empty
    page.fill("#prompt", "x " * 400)
    page.dispatch_event("#prompt", "input")
    assert page.get_attribute("#context-meter", "data-state") == "over"
    assert "the oldest turns will be dropped" in page.inner_text("#context-meter")
    page.fill("#prompt", "")

    for turn in range(TURNS):
        page.fill("#prompt", f"Turn {turn}: tell me one short fact about the number {turn + 1}, please.")
        page.press("#prompt", "Enter")
        page.wait_for_function(
            f"() => document.querySelectorAll('.msg-assistant[data-state=\"done\"]').length === {turn + 1}",
            timeout=120_000)
    replies = page.locator(".msg-assistant")
    assert replies.count() == TURNS
    assert page.locator('.msg-assistant[data-state="error"]').count() == 0
    assert all(t.strip() for t in page.locator(".msg-assistant .msg-body").all_inner_texts())

    # The later replies' prompts left the oldest turns out: said in the stats line and in the cache receipt.
    last = replies.last
    dropped = last.locator('[data-stat="context_dropped"]').inner_text()
    count = int(re.search(r"(\d+) oldest messages", dropped).group(1))
    assert count >= 2 and count % 2 == 0  # whole turns: a user message and its reply each
    last.locator(".receipt summary").click()
    receipt = last.locator(".receipt-context")
    assert int(receipt.get_attribute("data-dropped")) == count
    assert "computed again, not served from the prefix cache" in receipt.inner_text()
    window = receipt.locator('[data-stat="context_window"]').inner_text()
    prompt, room = map(int, re.search(r"(\d+) prompt \+ (\d+) reply room", window).groups())
    assert prompt + room <= WINDOW and room == MAX_TOKENS
    # The transcript greys out exactly the messages the model did not see.
    assert page.locator(".msg.out-of-window").count() == count
    assert page.locator(".msg").first.get_attribute("class").count("out-of-window") == 1
    # After the reply the meter counts the whole conversation exactly: more than the window holds.
    assert page.get_attribute("#context-meter", "data-state") == "over"
    assert meter_used(page) > WINDOW


def test_editing_the_second_message_reuses_the_shared_prefix_and_keeps_the_old_branch(server, page):
    page.goto(f"{server.base_url}/")
    page.wait_for_selector('#conn[data-status="open"]')
    page.fill('#params [name="temperature"]', "0")
    page.fill('#params [name="max_tokens"]', "16")
    for turn, text in enumerate(["Name three colours of the rainbow.", "Which one is the warmest?"]):
        page.fill("#prompt", text)
        page.press("#prompt", "Enter")
        page.wait_for_function(
            f"() => document.querySelectorAll('.msg-assistant[data-state=\"done\"]').length === {turn + 1}",
            timeout=120_000)
    second = page.locator(".msg-user").nth(1)
    second.locator(".edit").wait_for()  # the page has the saved ids by now
    second.locator(".edit").click()
    page.fill(".edit-form textarea", "Which one is the coldest?")
    page.press(".edit-form textarea", "Enter")
    page.wait_for_function(
        "() => document.querySelectorAll('.msg-assistant[data-state=\"done\"]').length === 2"
        " && document.querySelectorAll('.msg-user')[1].innerText.includes('coldest')",
        timeout=120_000)
    reply = page.locator(".msg-assistant").last
    reply.locator(".receipt summary").click()
    cached = reply.locator('[data-stat="receipt_cached"] .stat-value').inner_text()
    tokens, blocks = map(int, re.search(r"(\d+) tokens \((\d+) blocks\)", cached).groups())
    # The system prompt, the first question and its answer are unchanged: their full blocks came from the cache.
    assert blocks >= 2 and tokens == 16 * blocks
    prompt = int(reply.locator('[data-stat="prompt_tokens"] .stat-value').inner_text())
    assert tokens < prompt  # the edited message itself was computed
    assert reply.locator(".prov-cached").count() > 0
    # The old question is kept as a branch: the edited message is the second of two.
    page.locator(".msg-user").nth(1).locator(".branch-count").wait_for()
    assert page.locator(".msg-user").nth(1).locator(".branch-count").inner_text() == "2/2"
