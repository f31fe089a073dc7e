"""Browser tests of Compare on the chat page (static/chat/compare.js), in Debian's chromium through playwright,
against the embedded playground with the scripted engine (fake_playground.py: the real server, chat socket,
Celery task and worker runtime; a reply is "echo<i>: <prompt>", or "<adapter><i>: <prompt>" under a LoRA adapter,
one character every 30 ms, cut at max_tokens): the words do not matter here, the two streams do. (docs/chat-compare.png
comes from the real model: chat_screenshots.py.)
"""
import re
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api")

from live_stack import FAKE_PLAYGROUND, EmbeddedServer  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ADAPTER = "sql-lora"


def embedded(workdir: Path, **env: str) -> EmbeddedServer:
    live = EmbeddedServer(workdir, {"PLAYGROUND_LORA_MODULES": f"{ADAPTER}=/adapters/sql", **env}, argv=FAKE_PLAYGROUND)
    try:
        live.wait_url()
        live.wait_ready(60)
    except BaseException:
        live.process.kill()
        raise
    return live


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = embedded(tmp_path_factory.mktemp("compare-browser"))
    yield live
    live.stop()


def side(page, name: str):
    return page.locator(f'.compare-side[data-side="{name}"]')


def open_compare(page, server: EmbeddedServer) -> None:
    """The chat page, connected, with Compare opened from the keyboard (b)."""
    page.goto(f"{server.base_url}/")
    page.wait_for_selector('#conn[data-status="open"]')
    page.evaluate("() => document.activeElement.blur()")  # shortcuts act outside text fields
    page.keyboard.press("b")
    assert page.locator("#compare").is_visible() and page.locator("#transcript").is_hidden()
    assert page.get_attribute("#compare-toggle", "aria-pressed") == "true"
    assert page.inner_text("#send") == "Compare"


def set_field(page, name: str, field: str, value: str) -> None:
    box = side(page, name).locator(f'[name="{field}"]')
    box.evaluate("(e) => { const more = e.closest('details.params-more'); if (more) more.open = true; }")
    box.fill(value)
    box.dispatch_event("input")


def pane_text(page, name: str) -> str:
    return side(page, name).locator(".msg-body").inner_text()


def both_stream(page, chars: int = 10) -> None:
    """Until both panes have streamed more than `chars` characters."""
    page.wait_for_function("""(chars) => {
      const bodies = [...document.querySelectorAll('.compare-pane .msg-body')];
      return bodies.length === 2 && bodies.every((b) => b.innerText.length > chars);
    }""", arg=chars, timeout=10_000)


def both_done(page) -> None:
    page.wait_for_function("() => document.querySelectorAll('.compare-pane .msg-assistant[data-state=\"done\"]')"
                           ".length === 2", timeout=20_000)


def stats(page, name: str) -> dict[str, str]:
    pane = side(page, name)
    return {item.get_attribute("data-stat"): item.locator(".stat-value").inner_text()
            for item in pane.locator(".reply-meta > .stat").all()}


def test_compare_streams_a_and_b_at_once_each_with_its_settings_and_receipt_and_saves_nothing(server, page):
    open_compare(page, server)
    # A and B start as copies of the settings panel; the headers name what differs.
    assert side(page, "A").locator('[name="temperature"]').input_value() == page.input_value('#params [name="temperature"]')
    assert side(page, "A").locator(".compare-summary").inner_text() == "same settings as the other side"
    set_field(page, "A", "temperature", "0")
    set_field(page, "A", "max_tokens", "20")
    set_field(page, "B", "temperature", "1.2")
    set_field(page, "B", "seed", "7")
    set_field(page, "B", "max_tokens", "62")
    assert side(page, "A").locator(".compare-summary").inner_text() == "temperature 0 · max_tokens 20 · seed unset"
    assert side(page, "B").locator(".compare-summary").inner_text() == "temperature 1.2 · max_tokens 62 · seed 7"

    prompt = "Which of these settings reads better, A or B? Say it in a long sentence."
    page.fill("#prompt", prompt)
    page.press("#prompt", "Enter")
    # Both panes stream at the same time: each has text while both are still streaming.
    page.wait_for_function("""() => {
      const panes = [...document.querySelectorAll('.compare-pane .msg-assistant')];
      return panes.length === 2 && panes.every((p) => p.dataset.state === 'streaming'
        && p.querySelector('.msg-body').innerText.startsWith('echo0'));
    }""", timeout=10_000)
    assert page.locator("#stop").is_visible() and page.locator("#send").is_hidden()
    both_done(page)
    assert pane_text(page, "A") == f"echo0: {prompt}"[:20]
    assert pane_text(page, "B") == f"echo0: {prompt}"[:62]
    for name, completion in (("A", "20"), ("B", "62")):
        figures = stats(page, name)
        assert figures["completion_tokens"] == completion and figures["finish_reason"] == "length"
        assert re.fullmatch(r"\d+ ms|\d+\.\d\d s", figures["ttft"]) and figures["tokens_per_s"].endswith("tok/s")
        receipt = side(page, name).locator(".receipt")
        receipt.locator("summary").click()
        assert re.fullmatch(r"\d+ tokens \(\d+ blocks\)",
                            receipt.locator('[data-stat="receipt_cached"] .stat-value').inner_text())
    assert side(page, "A").locator(".regenerate").count() == 0  # a pane is not a turn of the conversation

    # Nothing was saved: no conversation, the address unchanged, the prompt still in the box.
    page.wait_for_timeout(300)
    assert page.locator("#conv-list li").count() == 0 and page.url == f"{server.base_url}/"
    assert page.input_value("#prompt") == prompt

    # "Use B's settings" (from the keyboard) fills the settings panel and closes Compare; Send then sends the
    # prompt as a turn of the conversation, with B's settings.
    side(page, "B").locator(".compare-use").focus()
    page.keyboard.press("Enter")
    assert page.locator("#compare").is_hidden() and page.inner_text("#send") == "Send"
    assert [page.input_value(f'#params [name="{f}"]') for f in ("temperature", "seed", "max_tokens")] == ["1.2", "7", "62"]
    assert page.evaluate("() => document.activeElement.id") == "prompt"
    page.press("#prompt", "Enter")
    page.wait_for_function("() => document.querySelector('#messages .msg-assistant')?.dataset.state === 'done'")
    assert page.locator("#messages .msg-assistant .msg-body").inner_text() == f"echo0: {prompt}"[:62]
    page.wait_for_function("() => document.querySelectorAll('#conv-list li').length === 1")


def test_stop_ends_both_panes_with_their_text_and_receipts_and_a_pane_stops_alone(server, page):
    open_compare(page, server)
    for name in "AB":
        set_field(page, name, "max_tokens", "600")
    page.fill("#prompt", "z" * 500)
    page.press("#prompt", "Enter")
    both_stream(page)
    page.keyboard.press("Escape")  # Stop, from the keyboard (also while typing): both sides
    both_done(page)
    for name in "AB":
        assert stats(page, name)["finish_reason"] == "abort"
        assert side(page, name).locator(".receipt").count() == 1
        assert 10 < len(pane_text(page, name)) < 500
        assert side(page, name).locator(".compare-stop").is_hidden()
    assert page.locator("#send").is_visible()

    # A pane's own Stop stops that side alone.
    page.click("#send")
    both_stream(page)
    side(page, "A").locator(".compare-stop").click()
    page.wait_for_function("() => document.querySelector('.compare-side[data-side=\"A\"] .msg-assistant')"
                           ".dataset.state === 'done'")
    assert side(page, "B").locator(".msg-assistant").get_attribute("data-state") == "streaming"
    assert page.locator("#stop").is_visible()
    page.click("#stop")
    both_done(page)
    assert stats(page, "A")["finish_reason"] == stats(page, "B")["finish_reason"] == "abort"


def test_base_model_against_a_lora_adapter(server, page):
    open_compare(page, server)
    models = side(page, "B").locator(".compare-model select")
    assert models.locator("option").all_inner_texts()[1:] == [ADAPTER]
    models.select_option(ADAPTER)
    assert side(page, "B").locator(".compare-summary").inner_text() == f"model {ADAPTER}"
    page.fill("#prompt", "SELECT 1")
    page.press("#prompt", "Enter")
    both_done(page)
    assert pane_text(page, "A") == "echo0: SELECT 1"
    assert pane_text(page, "B") == f"{ADAPTER}0: SELECT 1"
    # Using B's side puts the adapter into the settings panel's model picker.
    side(page, "B").locator(".compare-use").click()
    assert page.input_value("#model") == ADAPTER


def test_a_bad_setting_is_named_before_anything_is_sent(server, page):
    open_compare(page, server)
    set_field(page, "B", "top_p", "0")
    page.fill("#prompt", "Hi")
    page.press("#prompt", "Enter")
    error = side(page, "B").locator(".compare-error")
    assert error.inner_text().startswith("Fix settings B first: top_p must be above 0")
    assert side(page, "B").locator('[name="top_p"]').get_attribute("aria-invalid") is not None
    assert page.locator(".compare-pane .msg").count() == 0 and page.locator("#send").is_visible()


HOSTILE = "\n".join([
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 2">',
    "[click](javascript:window.__pwned=3) [ok](https://example.com)",
    "| a |", "| - |", "| <svg onload=window.__pwned=4> |", "",
    "$\\href{javascript:window.__pwned=5}{x}$",
])


def test_hostile_markdown_in_a_compare_pane_is_rendered_inert(server, page):
    open_compare(page, server)
    for name in "AB":
        set_field(page, name, "max_tokens", "400")
    page.fill("#prompt", HOSTILE)
    page.press("#prompt", "Enter")
    both_done(page)
    page.wait_for_timeout(200)  # let an onerror or onload fire, if one had been let through
    assert page.evaluate("window.__pwned") is None
    panes = page.locator(".compare-pane")
    assert panes.locator("script, img, iframe, svg, object, embed").count() == 0
    found = page.evaluate("""() => {
      const all = [...document.querySelectorAll('#compare *')];
      return { handlers: all.flatMap((e) => [...e.attributes].map((a) => a.name)).filter((n) => n.startsWith('on')),
               hrefs: [...document.querySelectorAll('.compare-pane [href]')].map((e) => e.getAttribute('href')) };
    }""")
    assert found == {"handlers": [], "hrefs": ["https://example.com", "https://example.com"]}
    assert "<script>window.__pwned = 1</script>" in pane_text(page, "A")
    assert page.inner_text(".compare-prompt") == HOSTILE  # the prompt above the panes is plain text


@pytest.fixture(scope="module")
def one_stream_server(tmp_path_factory):
    """A server that lets an anonymous address run one request at a time."""
    live = embedded(tmp_path_factory.mktemp("compare-limit"), PLAYGROUND_ANON_MAX_CONCURRENT_PER_ADDRESS="1")
    yield live
    live.stop()


def test_a_limit_of_one_stream_refuses_compare_clearly_and_the_chat_still_works(one_stream_server, page):
    open_compare(page, one_stream_server)
    page.fill("#prompt", "Two at once?")
    page.press("#prompt", "Enter")
    message = ("compare streams two replies at once and needs two request slots: too many concurrent requests: at "
               "most 1 at once; wait for one to finish")
    for name in "AB":
        pane = side(page, name).locator(".msg-assistant")
        pane.locator(".reply-notice").wait_for()
        assert pane.get_attribute("data-state") == "error"
        assert pane.locator(".reply-notice").inner_text() == message
    assert page.locator("#send").is_visible()
    # Nothing was kept: closing Compare, the same prompt is answered as a chat turn.
    page.click(".compare-close")
    page.press("#prompt", "Enter")
    page.wait_for_function("() => document.querySelector('#messages .msg-assistant')?.dataset.state === 'done'")
    assert page.locator("#messages .msg-assistant .msg-body").inner_text().startswith("echo0: Two at once?")
