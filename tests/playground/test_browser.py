"""Browser tests of the chat page (and its safety rules) and the admin memory view against the real embedded
playground.

One `python manage.py playground` subprocess serves the whole module (daphne, in-process Celery worker, the
real model on the CPU), driven through Debian's chromium by playwright. No browser is downloaded.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.request import urlopen

import pytest

pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STAFF = {"username": "ada", "password": "analytical-engine-1843"}
# A stored reply that would run code if the page ever rendered model text as HTML.
HOSTILE_REPLY = 'Sure: <script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> **done**'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(base_url: str) -> dict | None:
    try:
        with urlopen(f"{base_url}/healthz", timeout=5) as response:
            return json.load(response)
    except OSError:
        return None


SEED_SCRIPT = """
import json, uuid
from django.contrib.auth import get_user_model
from playground.chat.store import open_conversation, save_reply
user = get_user_model().objects.create_superuser({username!r}, "ada@example.com", {password!r})
conv = open_conversation(user, "", None, [{{"role": "user", "content": "Say something dangerous"}}])
save_reply(conv.id, "seeded", {{"outputs": [{{"index": 0, "text": {reply!r}, "finish_reason": "stop"}}],
           "usage": {{"prompt_tokens": 12, "completion_tokens": 20, "cached_tokens": 0}},
           "timing": {{"ttft_ms": 10.0, "tokens_per_s": 50.0}}}}, "seed")
print(json.dumps({{"conversation": str(conv.id)}}))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The embedded playground on a free port, with a staff user owning one seeded conversation."""
    workdir = tmp_path_factory.mktemp("browser")
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
        "DATABASE_URL": f"sqlite:///{workdir / 'db.sqlite3'}",
        "PLAYGROUND_VAR_DIR": str(workdir / "var"),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SETTINGS_MODULE": "playground.settings",
        "ENGINE_DEVICE": "cpu",
        "ENGINE_MAX_MODEL_LEN": "512",
        "ENGINE_NUM_KV_BLOCKS": "256",
        "PYTHONUNBUFFERED": "1",
    }
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=REPO, env=env, check=True, timeout=300)
    seeded = subprocess.run(
        [*manage, "shell", "-c", SEED_SCRIPT.format(reply=HOSTILE_REPLY, **STAFF)],
        cwd=REPO, env=env, check=True, timeout=120, capture_output=True, text=True,
    )
    conversation_id = json.loads(seeded.stdout.strip().splitlines()[-1])["conversation"]
    log = open(workdir / "server.log", "wb")
    process = subprocess.Popen([*manage, "playground", "--port", str(port), "--skip-migrate"], cwd=REPO, env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while not any(w.get("state") == "ready" for w in (_health(base_url) or {}).get("workers", [])):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the playground did not get a ready worker; log: {workdir / 'server.log'}")
        time.sleep(0.5)
    yield {"base_url": base_url, "conversation_id": conversation_id}
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()


def set_param(page, name: str, value: str) -> None:
    """Fill one sampling control (opening "More options" when it lives there)."""
    field = page.locator(f'#params [name="{name}"]')
    if not field.is_visible():
        page.click("#params .params-more summary")
    field.fill(value)


def login(page, base_url: str, next_path: str = "/") -> None:
    page.goto(f"{base_url}/accounts/login/?next={next_path}")
    page.fill("#id_username", STAFF["username"])
    page.fill("#id_password", STAFF["password"])
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}{next_path}")


def reply_text(page) -> str:
    return page.locator(".msg-assistant .msg-body").last.inner_text()


def test_prompt_streams_and_stop_cancels(server, page):
    page.goto(server["base_url"] + "/")
    page.wait_for_selector('#conn[data-status="open"]')
    set_param(page, "temperature", "0")
    set_param(page, "max_tokens", "400")
    page.fill("#prompt", "Write a long story about a dragon who learns to bake bread.")
    page.keyboard.press("Enter")

    reply = page.locator(".msg-assistant").last
    assert page.locator(".msg-user .msg-body").last.inner_text() == "Write a long story about a dragon who learns to bake bread."
    assert page.locator("#stop").is_visible() and not page.locator("#send").is_visible()
    # Tokens stream: the reply shows text while still streaming, and that text then grows.
    page.wait_for_function(
        "() => { const b = [...document.querySelectorAll('.msg-assistant .msg-body')].pop();"
        " return b && !b.querySelector('.typing') && b.innerText.trim().length > 0; }",
        timeout=120_000,
    )
    first = reply_text(page)
    assert reply.get_attribute("data-state") == "streaming"
    page.wait_for_function(
        "(n) => [...document.querySelectorAll('.msg-assistant .msg-body')].pop().innerText.length > n",
        arg=len(first), timeout=60_000,
    )
    assert reply.get_attribute("data-state") == "streaming"

    page.click("#stop")
    page.wait_for_function("() => [...document.querySelectorAll('.msg-assistant')].pop().dataset.state === 'done'",
                           timeout=15_000)
    assert reply.locator('[data-stat="finish_reason"] .stat-value').inner_text() == "abort"
    completion = int(reply.locator('[data-stat="completion_tokens"] .stat-value').inner_text())
    assert 0 < completion < 400
    assert page.locator("#send").is_visible() and not page.locator("#stop").is_visible()
    stopped = reply_text(page)
    page.wait_for_timeout(1500)
    assert reply_text(page) == stopped, "text kept arriving after stop"


def test_enter_sends_shift_enter_adds_a_line_and_reply_shows_stats(server, page):
    page.goto(server["base_url"] + "/")
    page.wait_for_selector('#conn[data-status="open"]')
    set_param(page, "temperature", "0")
    set_param(page, "max_tokens", "12")
    page.click("#prompt")
    page.keyboard.type("Name a colour.")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("One word.")
    assert page.input_value("#prompt") == "Name a colour.\nOne word."
    assert page.locator(".msg-user").count() == 0

    page.keyboard.press("Enter")
    assert page.input_value("#prompt") == ""
    assert page.locator(".msg-user .msg-body").last.inner_text() == "Name a colour.\nOne word."
    reply = page.locator(".msg-assistant").last
    page.wait_for_function("() => [...document.querySelectorAll('.msg-assistant')].pop().dataset.state === 'done'",
                           timeout=120_000)
    assert reply_text(page).strip() != ""
    stats = {name: reply.locator(f'[data-stat="{name}"] .stat-value').inner_text()
             for name in ("prompt_tokens", "completion_tokens", "cached_tokens", "ttft", "tokens_per_s", "finish_reason")}
    assert int(stats["prompt_tokens"]) > 10
    assert 1 <= int(stats["completion_tokens"]) <= 12
    assert int(stats["cached_tokens"]) >= 0
    assert stats["ttft"].endswith(("ms", " s")) and stats["tokens_per_s"].endswith("tok/s")
    assert stats["finish_reason"] in {"stop", "length"}
    # The new conversation is in the history list, titled by its first message, and the URL points at it.
    page.wait_for_selector("#conv-list li.active")
    assert page.locator("#conv-list li.active .conv-title").inner_text().startswith("Name a colour.")
    assert "/c/" in page.url

    # Regenerate replaces the reply (greedy, so with the same text) instead of adding a turn.
    first_text = reply_text(page)
    page.click(".msg-assistant .regenerate")
    page.wait_for_function("() => [...document.querySelectorAll('.msg-assistant')].pop().dataset.state === 'done'",
                           timeout=120_000)
    assert page.locator(".msg-assistant").count() == 1 and page.locator(".msg-user").count() == 1
    assert reply_text(page) == first_text


def test_rejected_prompt_shows_the_error_and_the_page_recovers(server, page):
    page.goto(server["base_url"] + "/")
    page.wait_for_selector('#conn[data-status="open"]')
    page.fill("#prompt", "lorem ipsum " * 600)  # far beyond the test engine's 512-token context
    page.keyboard.press("Enter")
    page.wait_for_selector('.msg-assistant[data-state="error"]', timeout=60_000)
    assert page.locator(".msg-assistant .reply-notice.error").inner_text().strip() != ""
    assert page.locator("#send").is_visible() and not page.locator("#stop").is_visible()
    assert page.locator("#conn").get_attribute("data-status") == "open"
    assert page.locator(".msg-assistant .regenerate").is_visible()


def test_history_opens_a_saved_conversation_and_new_chat_clears_it(server, page):
    base_url, conversation_id = server["base_url"], server["conversation_id"]
    login(page, base_url, "/")
    page.locator(f'#conv-list li[data-id="{conversation_id}"] a').click()
    page.wait_for_url(f"{base_url}/c/{conversation_id}/")
    assert page.locator(".msg-user .msg-body").inner_text() == "Say something dangerous"
    assert page.locator("#chat-title").inner_text() == "Say something dangerous"
    reply = page.locator(".msg-assistant")
    assert reply.locator('[data-stat="prompt_tokens"] .stat-value').inner_text() == "12"
    assert reply.locator('[data-stat="finish_reason"] .stat-value').inner_text() == "stop"
    assert page.locator(f'#conv-list li[data-id="{conversation_id}"]').get_attribute("class") == "active"

    page.click("#new-chat")
    assert page.url == f"{base_url}/"
    assert page.locator(".msg").count() == 0 and page.locator("#empty-state").is_visible()
    assert page.locator("#chat-title").inner_text() == "New chat"
    page.go_back()
    page.wait_for_selector(".msg-assistant")
    assert page.locator(".msg-user .msg-body").inner_text() == "Say something dangerous"


def test_script_in_a_reply_renders_as_text(server, page):
    login(page, server["base_url"], f"/c/{server['conversation_id']}/")
    body = page.locator(".msg-assistant .msg-body").first
    body.wait_for()
    for markdown in (True, False):
        if not markdown:
            page.uncheck("#markdown-toggle")
        text = body.inner_text()
        assert "<script>window.__pwned = 1</script>" in text
        assert '<img src=x onerror="window.__pwned = 2">' in text
        assert body.locator("script, img").count() == 0
        assert page.evaluate("window.__pwned") is None
    # Markdown formatting still works around the hostile text.
    page.check("#markdown-toggle")
    assert body.locator("strong").inner_text() == "done"


def test_markdown_renderer_builds_only_safe_nodes(server, page):
    page.goto(server["base_url"] + "/")
    result = page.evaluate(
        """async () => {
          const { renderMarkdown } = await import('/static/common/markdown.js');
          const box = document.createElement('div');
          box.append(renderMarkdown([
            '# Title <b>x</b>',
            '<iframe src="javascript:alert(1)"></iframe>',
            '[click](javascript:alert(1)) and [site](https://example.com)',
            '- **bold** item', '- `<svg onload=alert(1)>`',
            '```html', '<script>window.__pwned = 3</script>', '```',
          ].join('\\n')));
          return {
            tags: [...box.querySelectorAll('*')].map((e) => e.tagName.toLowerCase()),
            hrefs: [...box.querySelectorAll('a')].map((a) => a.getAttribute('href')),
            code: box.querySelector('pre code').textContent.trimEnd(),  // markdown-it ends a fence with a newline
            text: box.textContent,
          };
        }"""
    )
    # The code block's frame (language, copy button) and highlight.js's spans, nothing else
    assert set(result["tags"]) <= {"h1", "p", "br", "a", "ul", "li", "strong", "code", "pre", "div", "span", "button"}
    assert result["hrefs"] == ["https://example.com"]
    assert result["code"] == "<script>window.__pwned = 3</script>"
    assert "[click](javascript:alert(1))" in result["text"]
    assert page.evaluate("window.__pwned") is None


def test_narrow_screen_keeps_the_composer_and_opens_panels(server, browser):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    try:
        page.goto(server["base_url"] + "/")
        assert page.locator("#prompt").is_visible()
        assert page.locator("#send").is_visible()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the page scrolls sideways ({width}px wide)"

        def on_screen(selector: str) -> bool:
            box = page.locator(selector).bounding_box()
            return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 391

        page.wait_for_timeout(300)
        assert not on_screen("#settings-panel") and not on_screen("#history-panel")
        page.click(".toggle-settings")
        page.wait_for_timeout(400)  # slide-in transition
        assert on_screen("#settings-panel")
        page.click("#scrim", position={"x": 10, "y": 200})
        page.click(".toggle-history")
        page.wait_for_timeout(400)
        assert on_screen("#history-panel") and not on_screen("#settings-panel")
    finally:
        context.close()


def test_memory_view_is_staff_only_and_follows_a_generation(server, browser, page):
    base_url = server["base_url"]
    anonymous = browser.new_context()
    try:
        stranger = anonymous.new_page()
        stranger.goto(f"{base_url}/memory/")
        assert stranger.url.startswith(f"{base_url}/accounts/login/")
    finally:
        anonymous.close()

    login(page, base_url, "/memory/")
    worker = page.locator(".worker").first
    worker.wait_for(timeout=30_000)  # a new viewer gets every worker's snapshot at once, even an idle one
    canvas = worker.locator("canvas.blockmap")
    total = sum(int(canvas.get_attribute(f"data-{s}")) for s in ("free", "used", "shared", "cached"))
    assert total == 256  # ENGINE_NUM_KV_BLOCKS of the test server
    assert canvas.get_attribute("data-used") == "0"
    points = int(worker.locator('.chart[data-chart="memory"]').get_attribute("data-points"))

    chat = page.context.new_page()
    chat.goto(base_url + "/")
    chat.wait_for_selector('#conn[data-status="open"]')
    set_param(chat, "temperature", "0")
    set_param(chat, "max_tokens", "300")
    chat.fill("#prompt", "Write a long poem about memory pages and the blocks that hold them.")
    chat.keyboard.press("Enter")

    # While it runs: its blocks are in use on the map, it is listed with its block table, the charts move.
    row = worker.locator(".requests tbody tr").first
    row.wait_for(timeout=120_000)
    page.wait_for_function(
        "(n) => document.querySelector('.worker .chart[data-chart=\"memory\"]').dataset.points > n + 1",
        arg=points, timeout=60_000,
    )
    assert row.locator(".chip").count() >= 1
    page.wait_for_function(  # the block map follows once the first engine step (the prefill) is done
        "() => { const c = document.querySelector('.worker canvas.blockmap');"
        " return Number(c.dataset.used) + Number(c.dataset.shared) > 0; }",
        timeout=60_000,
    )

    # The row stays the same element while its cells follow the block map, so the button a user presses does
    # not leave the page under the pointer (rebuilt rows lost clicks).
    abort = row.locator("button", has_text="Abort").element_handle()
    shown = row.locator(".req-size span").first.inner_text()
    page.wait_for_function(
        "(shown) => document.querySelector('.worker .requests tbody tr .req-size span').textContent !== shown",
        arg=shown, timeout=30_000,
    )
    assert abort.evaluate("button => button.isConnected")

    # Abort from the memory view: the chat's reply ends as cancelled and the blocks are freed.
    abort.click()
    chat.wait_for_function("() => [...document.querySelectorAll('.msg-assistant')].pop().dataset.state === 'done'",
                           timeout=15_000)
    assert chat.locator('.msg-assistant [data-stat="finish_reason"] .stat-value').inner_text() == "abort"
    page.wait_for_function(
        "() => { const c = document.querySelector('.worker canvas.blockmap');"
        " return c.dataset.used === '0' && c.dataset.shared === '0'; }",
        timeout=15_000,
    )
    assert worker.locator(".requests tbody tr").count() == 0


def test_json_schema_reply_is_formatted_and_shows_the_grammar_mask(server, page):
    import jsonschema

    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                               "count": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["colour", "count"]}
    page.goto(server["base_url"] + "/")
    page.wait_for_selector('#conn[data-status="open"]')
    set_param(page, "temperature", "0")
    set_param(page, "max_tokens", "40")
    page.select_option('#response-format select', "json_schema")
    page.fill("#response-format .schema-editor", "{not json")
    page.fill("#prompt", "Pick a colour and a count.")
    page.keyboard.press("Enter")
    assert "Fix the response format first" in page.locator("#composer-error").inner_text()
    assert page.locator(".msg-user").count() == 0

    page.fill("#response-format .schema-editor", json.dumps(schema))
    page.check("#response-format input[type=checkbox]")
    page.click("#send")  # the refused prompt is still in the box
    page.wait_for_function("() => [...document.querySelectorAll('.msg-assistant')].pop()?.dataset.state === 'done'",
                           timeout=120_000)
    reply = page.locator(".msg-assistant").last
    shown = reply.locator(".json-reply").inner_text()
    assert "\n  " in shown  # indented
    jsonschema.validate(json.loads(shown), schema)
    completion = int(reply.locator('[data-stat="completion_tokens"] .stat-value').inner_text())
    assert reply.locator(".mask-view .mask-bar").count() == completion
    assert "Grammar mask: removed" in reply.locator(".mask-view summary").inner_text()
