"""Browser tests of the pages' own logic against scripted server frames: the KV views (admin memory view,
chat page panel) fed with worker snapshots, and the chat stream's protocol rules.

The real templates and static files are served by a tiny HTTP server; inside the page, `WebSocket` is
replaced by a test double (installed by the test, never shipped) that delivers the frames the test writes
and records the frames the page sends. This checks exactly what a live server cannot stage on demand: block
states and counts, tooltips, block tables, actions, charts, figures, the contiguous-vs-paged bars, a lost
token frame, a cancel before `started`, a refused generate.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import page_log
import pytest
from django.conf import settings
from django.template.loader import render_to_string

from playground.chat.window import meter_config
from playground.serving.web import sampling

pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

# In-page test double for WebSocket: the test pushes frames with __deliver(obj, path) to the page's latest
# socket on that path; frames the page sends land in __sent.
FAKE_SOCKET = """
window.__sent = [];
window.__sockets = [];
class ScriptedSocket extends EventTarget {
  static CONNECTING = 0; static OPEN = 1; static CLOSING = 2; static CLOSED = 3;
  constructor(url) {
    super();
    this.url = url;
    this.readyState = 0;
    window.__sockets.push(this);
    setTimeout(() => { this.readyState = 1; this.dispatchEvent(new Event('open')); }, 0);
  }
  send(data) { window.__sent.push(JSON.parse(data)); }
  close() { this.readyState = 3; this.dispatchEvent(new Event('close')); }
}
window.WebSocket = ScriptedSocket;
window.__deliver = (obj, path) => window.__sockets.filter((s) => s.url.endsWith(path)).at(-1).dispatchEvent(
  new MessageEvent('message', { data: JSON.stringify(obj) }));
"""

BLOCK_SIZE = 16
NUM_BLOCKS = 32
MAX_LEN = 512


def snapshot(worker: str, time: float, tables: dict[str, list[int]], cached: list[int], tokens_per_s: float) -> dict:
    """A snapshot in the documented shape, consistent with the given block tables and cached blocks."""
    refs = [0] * NUM_BLOCKS
    owners: dict[str, list[str]] = {}
    for request_id, table in tables.items():
        for block in table:
            refs[block] += 1
            owners.setdefault(str(block), []).append(request_id)
    states = "".join(
        ("s" if ref > 1 else "u") if ref else ("c" if block in cached else "f") for block, ref in enumerate(refs)
    )
    used = sum(1 for ref in refs if ref)
    shared_ref_counts = {str(block): ref for block, ref in enumerate(refs) if ref > 1}
    return {
        "type": "snapshot",
        "worker": worker,
        "time": time,
        "metrics": {
            "block_size": BLOCK_SIZE, "num_blocks_total": NUM_BLOCKS, "num_blocks_used": used,
            "num_blocks_cached": len(cached), "num_blocks_free": NUM_BLOCKS - used - len(cached),
            "kv_cache_usage": used / NUM_BLOCKS, "kv_slot_utilization": 0.75,
            "num_requests_running": len(tables), "num_requests_waiting": 1, "num_preemptions_total": 2,
            "prefix_cache_queries_total": 10, "prefix_cache_hits_total": 4, "generation_tokens_total": 100,
            "contiguous": {  # as the engine computes it (inference/counterfactual.py), for tables' requests
                "max_model_len": {"reserved_blocks": len(tables) * math.ceil(MAX_LEN / BLOCK_SIZE)},
                "prompt_plus_max_tokens": {"reserved_blocks": len(tables) * 8},
            },
        },
        "tokens_per_s": tokens_per_s,
        "block_map": {"states": states, "ref_counts": shared_ref_counts, "owners": owners},
        "requests": [
            {"request_id": rid, "index": 0, "block_table": table, "context_len": len(table) * BLOCK_SIZE - 3,
             "max_len": MAX_LEN, "outside_window": 1 if rid == "beta" else 0}  # as a windowed model's engine says
            for rid, table in tables.items()
        ],
    }


def summary(full: dict) -> dict:
    """What the chat page's `/ws/kv/` feed carries: the snapshot without anything naming requests."""
    return {k: v for k, v in full.items() if k not in ("block_map", "requests")}


# Request "alpha" and "beta" share their first two blocks (a common prompt prefix); 7 and 8 are cached.
TABLES = {"alpha": [0, 1, 2], "beta": [0, 1, 5, 6]}
CACHED = [7, 8]


class HarnessHandler(SimpleHTTPRequestHandler):
    """Serves the pages (the real templates, rendered) and /static/ (the real files); nothing else."""

    def __init__(self, *args, pages: dict[str, str], **kwargs) -> None:
        self.pages = pages
        super().__init__(*args, directory=str(REPO), **kwargs)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path in self.pages:
            body = self.pages[self.path].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Security-Policy", settings.PLAYGROUND_CSP)  # as the site sends it
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path.startswith("/static/") and ".." not in self.path:
            super().do_GET()
        else:
            self.send_error(404)

    def log_message(self, format: str, *args) -> None:
        pass


MODEL = "smollm2-135m-instruct"
LIMITS = {**settings.PLAYGROUND_LIMITS, "max_tokens": 512}
CHAT_CONFIG = {
    "ws_path": "/ws/chat/", "sampling": sampling.page_specs(LIMITS), "limits": LIMITS, "models": [MODEL],
    "user": {"username": "", "is_authenticated": False, "is_staff": False},
    "urls": {"conversations": "/api/conversations/"}, "conversation": None, "context": meter_config(),
}


@pytest.fixture(scope="module")
def harness_url():
    pages = {
        "/memory/": render_to_string("memory/index.html"),
        "/": render_to_string("chat/index.html", {"chat_config": CHAT_CONFIG}),
        # What the page reads after a reply is saved: ids, and the user message's two branches.
        "/api/conversations/c1/": json.dumps({"id": "c1", "title": "Hi", "system_prompt": "", "messages": [
            {"id": 7, "role": "user", "content": "Hi", "siblings": [3, 7]},
            {"id": 8, "role": "assistant", "content": "Hello, world", "siblings": [8]}]}),
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(HarnessHandler, pages=pages))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def open_page(browser, harness_url):
    """open_page(path) -> a page of the harness with the scripted socket connected."""
    contexts = []
    errors: list[str] = []

    def open_(path: str):
        context = browser.new_context(viewport={"width": 1500, "height": 1000})
        contexts.append(context)
        context.add_init_script(FAKE_SOCKET)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page_log.follow(page)
        page.goto(harness_url + path)
        page.wait_for_selector('#conn[data-status="open"]')
        return page

    yield open_
    for context in contexts:
        context.close()
    assert errors == [], f"uncaught errors in the page: {errors}"


@pytest.fixture
def page(open_page):
    """The memory view."""
    return open_page("/memory/")


def deliver(page, frame: dict, path: str = "/ws/memory/") -> None:
    page.evaluate("([frame, path]) => window.__deliver(frame, path)", [frame, path])


def card(page, worker: str):
    return page.locator(f'.worker[data-worker="{worker}"]')


def test_block_map_shows_each_block_state_and_hover_tells_ref_count_and_owners(page):
    deliver(page, snapshot("w1", 1000.0, TABLES, CACHED, 50.0))
    canvas = card(page, "w1").locator("canvas.blockmap")
    counts = {state: canvas.get_attribute(f"data-{state}") for state in ("used", "shared", "cached", "free")}
    # Blocks 2, 5, 6 used by one request; 0 and 1 shared; 7 and 8 cached; the other 25 free.
    assert counts == {"used": "3", "shared": "2", "cached": "2", "free": "25"}
    legend = {state: card(page, "w1").locator(f'[data-count="{state}"]').inner_text() for state in counts}
    assert legend == counts

    box = canvas.bounding_box()
    pitch = 12 + 2  # cell size for a small pool, plus the gap

    def hover_block(block: int) -> str:
        page.mouse.move(box["x"] + block * pitch + 6, box["y"] + 6)
        tip = page.locator("#block-tip")
        tip.wait_for(state="visible")
        return tip.inner_text()

    assert hover_block(0) == "Block 0 · shared\nref count 2\nowners: alpha, beta"
    assert hover_block(5) == "Block 5 · used\nref count 1\nowners: beta"
    assert hover_block(7) == "Block 7 · cached\nref count 0\nowners: none"
    assert hover_block(20) == "Block 20 · free\nref count 0\nowners: none"


def test_requests_show_block_tables_and_actions_send_frames(page):
    deliver(page, snapshot("w1", 1000.0, TABLES, CACHED, 50.0))
    rows = card(page, "w1").locator(".requests tbody tr")
    assert rows.count() == 2
    beta = card(page, "w1").locator('.requests tr[data-request-id="beta"]')
    chips = beta.locator(".chip")
    assert [c.replace("\n", "") for c in chips.all_inner_texts()] == ["0→0", "1→1", "2→5", "3→6"]
    assert [("shared" in (c.get_attribute("class") or "")) for c in chips.all()] == [True, True, False, False]
    # Its first block is behind every layer's sliding window: dimmed, and its title says why.
    assert [("outside-window" in (c.get_attribute("class") or "")) for c in chips.all()] == [True, False, False, False]
    assert "outside every layer's sliding window" in chips.first.get_attribute("title")
    assert "61 / 512 tokens" in beta.locator(".req-size").inner_text()
    assert "4 of 32 blocks" in beta.locator(".req-size").inner_text()

    beta.locator("button", has_text="Abort").click()
    card(page, "w1").locator(".reset-cache").click()
    assert page.evaluate("window.__sent") == [
        {"type": "abort", "worker": "w1", "request_id": "beta"},
        {"type": "reset_prefix_cache", "worker": "w1"},
    ]
    assert beta.locator("button").inner_text() == "Aborting…"
    # The next snapshot no longer lists beta: its row and its blocks are gone.
    deliver(page, snapshot("w1", 1001.0, {"alpha": [0, 1, 2]}, CACHED + [5, 6], 40.0))
    assert rows.count() == 1
    assert card(page, "w1").locator("canvas.blockmap").get_attribute("data-shared") == "0"


def test_charts_gain_points_and_contiguous_bar_shows_the_waste(page):
    deliver(page, snapshot("w1", 1000.0, TABLES, CACHED, 50.0))
    charts = card(page, "w1").locator(".chart")
    assert charts.count() == 4
    assert set(charts.evaluate_all("els => els.map(e => e.dataset.points)")) == {"1"}
    deliver(page, snapshot("w1", 1000.5, {"alpha": [0, 1, 2, 3]}, CACHED, 60.0))
    deliver(page, snapshot("w1", 1001.0, {"alpha": [0, 1, 2, 3, 4]}, CACHED, 70.0))
    assert set(charts.evaluate_all("els => els.map(e => e.dataset.points)")) == {"3"}
    figures = card(page, "w1").locator(".kv-figures")
    assert figures.locator('[data-figure="kv_usage"] dd').inner_text() == f"{100 * 5 / NUM_BLOCKS:.1f}%"
    assert figures.locator('[data-figure="requests"] dd').inner_text() == "1 / 1"
    assert figures.locator('[data-figure="tokens_per_s"] dd').inner_text() == "70.0"

    # One request of max length 512 would pin 32 blocks contiguously: the whole pool, against 5 paged.
    reservation = card(page, "w1").locator(".reservation")
    # Paged: 25% of its slots empty (the snapshot's slot utilisation is 0.75). Contiguous: 77 tokens held in
    # 32 × 16 reserved slots, so 85.0% of the reservation is empty.
    assert reservation.locator('[data-label="paged"]').inner_text() == (
        "5 blocks · 15.6% of the pool · 25.0% of its slots empty"
    )
    assert reservation.locator('[data-label="max_model_len"]').inner_text() == (
        "32 blocks · 100.0% of the pool · 85.0% of it empty"
    )
    # prompt + max_tokens: 8 blocks (128 slots) for the one request's 77 tokens, 39.8% of it empty.
    assert reservation.locator('[data-label="prompt_plus_max_tokens"]').inner_text() == (
        "8 blocks · 25.0% of the pool · 39.8% of it empty"
    )
    assert "1.6× less" in reservation.locator('[data-label="saving"]').inner_text()
    deliver(page, snapshot("w1", 1002.0, TABLES, CACHED, 70.0))  # two requests: 64 blocks, twice the pool
    assert "would not fit" in reservation.locator('[data-label="max_model_len"]').inner_text()
    assert "overflow" in reservation.get_attribute("class")


def test_several_workers_appear_side_by_side_and_errors_are_shown(page):
    deliver(page, snapshot("w2", 1000.0, {"gamma": [3]}, [], 10.0))
    deliver(page, snapshot("w1", 1000.0, TABLES, CACHED, 50.0))
    assert page.locator(".worker").evaluate_all("els => els.map(e => e.dataset.worker)") == ["w1", "w2"]
    one, two = card(page, "w1").bounding_box(), card(page, "w2").bounding_box()
    assert one["y"] == two["y"] and one["x"] + one["width"] <= two["x"]
    assert page.locator("#no-workers").is_hidden()

    deliver(page, {"type": "error", "message": "worker w9 is not alive"})
    assert page.locator("#toast").inner_text() == "worker w9 is not alive"


def test_chat_panel_charts_the_watched_worker_and_switches_between_workers(open_page):
    page = open_page("/")
    assert page.locator("#kv-idle").is_visible()
    deliver(page, summary(snapshot("w1", 1000.0, TABLES, CACHED, 50.0)), "/ws/kv/")
    deliver(page, summary(snapshot("w1", 1000.5, {"alpha": [0, 1, 2, 3]}, CACHED, 60.0)), "/ws/kv/")
    assert page.locator("#kv-idle").is_hidden()
    charts = page.locator("#kv-charts .chart")
    assert charts.evaluate_all("els => els.map(e => e.dataset.chart)") == ["memory", "requests", "throughput"]
    assert set(charts.evaluate_all("els => els.map(e => e.dataset.points)")) == {"2"}
    figures = page.locator("#kv-figures")
    assert figures.locator('[data-figure="kv_usage"] dd').inner_text() == f"{100 * 4 / NUM_BLOCKS:.1f}%"
    assert figures.locator('[data-figure="slot_util"] dd').inner_text() == "75.0%"
    assert figures.locator('[data-figure="hit_rate"] dd').inner_text() == "40.0%"
    assert figures.locator('[data-figure="requests"] dd').inner_text() == "1 / 1"
    assert figures.locator('[data-figure="tokens_per_s"] dd').inner_text() == "60.0"
    assert page.locator("#kv-worker").inner_text() == "w1"

    # A second worker: a picker appears; the panel keeps the first until the user switches.
    deliver(page, summary(snapshot("w2", 1000.7, {"gamma": [3]}, [], 10.0)), "/ws/kv/")
    picker = page.locator("#kv-worker select")
    assert picker.evaluate("s => [...s.options].map(o => o.value)") == ["w1", "w2"]
    assert figures.locator('[data-figure="tokens_per_s"] dd').inner_text() == "60.0"
    picker.select_option("w2")
    deliver(page, summary(snapshot("w2", 1001.0, {"gamma": [3, 4]}, [], 20.0)), "/ws/kv/")
    assert figures.locator('[data-figure="tokens_per_s"] dd').inner_text() == "20.0"
    assert set(charts.evaluate_all("els => els.map(e => e.dataset.points)")) == {"1"}


def send_prompt(page, text: str) -> dict:
    """Type a prompt, press Enter and return the generate frame the page sent."""
    page.fill("#prompt", text)
    page.keyboard.press("Enter")
    return page.evaluate("window.__sent").pop()


def chat_frame(page, frame: dict) -> None:
    deliver(page, frame, "/ws/chat/")


def test_chat_stream_flags_a_lost_delta_and_done_replaces_the_text(open_page):
    page = open_page("/")
    generate = send_prompt(page, "Hi")
    assert generate["type"] == "generate" and generate["conversation_id"] is None
    assert generate["messages"] == [{"role": "user", "content": "Hi"}]
    assert generate["params"]["temperature"] == 0.7 and generate["params"]["max_tokens"] == 256
    assert "seed" not in generate["params"] and "stop" not in generate["params"]  # unset fields are left out

    chat_frame(page, {"type": "started", "request_id": "r1", "conversation_id": "c1"})
    for seq, text in [(0, "Hel"), (1, "lo"), (1, "lo"), (3, " world")]:  # a repeat of seq 1; seq 2 is lost
        chat_frame(page, {"type": "token", "request_id": "r1", "index": 0, "seq": seq, "text": text})
    chat_frame(page, {"type": "token", "request_id": "other", "index": 0, "seq": 0, "text": "NOT OURS"})
    body = page.locator(".msg-assistant .msg-body")
    page.wait_for_function("() => document.querySelector('.msg-assistant .msg-body').innerText === 'Hello world'")
    assert page.url.endswith("/c/c1/")

    chat_frame(page, {
        "type": "done", "request_id": "r1", "conversation_id": "c1", "worker": "w1",
        "outputs": [{"index": 0, "text": "Hello, world", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 4, "cached_tokens": 0},
        "timing": {"ttft_ms": 1234.5, "tokens_per_s": 12.25},
    })
    assert body.inner_text() == "Hello, world"
    reply = page.locator(".msg-assistant")
    assert reply.get_attribute("data-state") == "done"
    assert "1 streamed update(s) were lost" in reply.locator(".reply-notice").inner_text()
    stats = reply.locator(".stat-value").all_inner_texts()
    assert stats == ["5", "4", "0", "1.23 s", "12.3 tok/s", "stop"]

    # The next turn carries the final text, not the streamed one, and names the conversation.
    follow_up = send_prompt(page, "And?")
    assert follow_up["conversation_id"] == "c1"
    assert follow_up["messages"] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello, world"},
        {"role": "user", "content": "And?"},
    ]


def test_chat_stop_before_started_cancels_and_a_refused_generate_fails_its_reply(open_page):
    page = open_page("/")
    send_prompt(page, "First")
    page.click("#stop")  # before the server has named the request
    chat_frame(page, {"type": "started", "request_id": "r1", "conversation_id": "c1"})
    assert page.evaluate("window.__sent").pop() == {"type": "cancel", "request_id": "r1"}
    chat_frame(page, {"type": "done", "request_id": "r1", "conversation_id": "c1",
                      "outputs": [{"index": 0, "text": "Fi", "finish_reason": "abort"}],
                      "usage": {"prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 0},
                      "timing": {"ttft_ms": 10.0, "tokens_per_s": 1.0}})
    reply = page.locator(".msg-assistant").last
    assert reply.locator('[data-stat="finish_reason"] .stat-value').inner_text() == "abort"
    assert page.locator("#send").is_visible()

    send_prompt(page, "Second")
    chat_frame(page, {"type": "error", "message": "params.temperature must be a number >= 0"})
    reply = page.locator(".msg-assistant").last
    assert reply.get_attribute("data-state") == "error"
    assert reply.locator(".reply-notice").inner_text() == "params.temperature must be a number >= 0"
    assert page.locator("#send").is_visible() and page.locator(".msg-assistant .regenerate").last.is_visible()


def finish_reply(page, text: str, request_id: str = "r1") -> None:
    """Answer the page's pending generate with one finished reply of `text`."""
    chat_frame(page, {"type": "started", "request_id": request_id, "conversation_id": "c1"})
    chat_frame(page, {"type": "done", "request_id": request_id, "conversation_id": "c1", "worker": "w1",
                      "outputs": [{"index": 0, "text": text, "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 5, "completion_tokens": 40, "cached_tokens": 0},
                      "timing": {"ttft_ms": 10.0, "tokens_per_s": 20.0}})


RICH_REPLY = "\n".join([
    "| token | logprob |", "| --- | ---: |", "| the | -0.1 |", "| a | -2.3 |", "",
    "```python", "def area(r):", "    return 3.14 * r ** 2", "```", "",
    "Inline $e^{i\\pi} + 1 = 0$ and a display:", "", "$$\\frac{a}{b} = \\sqrt{x}$$",
])


def test_chat_reply_renders_a_table_highlighted_code_with_copy_and_math(open_page):
    page = open_page("/")
    page.evaluate("() => { window.__copied = []; navigator.clipboard.writeText = async (t) => { window.__copied.push(t); }; }")
    send_prompt(page, "Show me everything")
    finish_reply(page, RICH_REPLY)
    body = page.locator(".msg-assistant .msg-body")
    # markdown-it: a real table, with the header row and alignment
    assert body.locator("table th").all_inner_texts() == ["token", "logprob"]
    assert body.locator("table tbody tr").count() == 2
    cell_align = "(e) => getComputedStyle(e).textAlign"
    assert body.locator("table td").nth(1).evaluate(cell_align) == "right"  # applied under the site's CSP
    # highlight.js: the fence's language named, keywords and numbers marked; the copy button copies the source
    block = body.locator(".code-block")
    assert block.locator(".code-lang").inner_text() == "python"
    assert block.locator("code .hljs-keyword").first.inner_text() == "def"
    assert block.locator("code .hljs-number").count() >= 2
    block.locator(".code-copy").click()
    page.wait_for_function("() => window.__copied.length === 1")
    assert page.evaluate("window.__copied[0]") == "def area(r):\n    return 3.14 * r ** 2\n"
    # KaTeX: one inline and one display formula, drawn in HTML and given to screen readers as MathML
    assert body.locator(".katex").count() == 2 and body.locator(".katex-display").count() == 1
    assert body.locator(".katex-display .mfrac").count() == 1 and body.locator(".katex-display .sqrt").count() == 1
    # KaTeX's layout (inline styles) survives the CSP: the space around "=" is there
    assert body.locator(".katex-display .mspace").first.evaluate("(e) => parseFloat(getComputedStyle(e).marginRight)") > 0
    assert body.locator("math").count() == 2 and body.locator("math msqrt").count() == 1
    assert body.locator("math msup mi").first.text_content() == "e"


HOSTILE_MARKDOWN = "\n".join([
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 2">',
    "[click](javascript:window.__pwned=3) [data](data:text/html,<script>alert(1)</script>) [ok](https://example.com)",
    "![pixel](https://example.com/track.png)",
    "| a |", "| - |", "| <svg onload=window.__pwned=4> |", "",
    "$\\href{javascript:window.__pwned=5}{x}$ and $<img src=x onerror=window.__pwned=6>$",
    "```html", '<iframe src="javascript:window.__pwned=7"></iframe>', "```",
])


def test_chat_reply_with_hostile_markdown_and_html_is_rendered_inert(open_page):
    page = open_page("/")
    send_prompt(page, "Be hostile")
    finish_reply(page, HOSTILE_MARKDOWN)
    body = page.locator(".msg-assistant .msg-body")
    page.wait_for_timeout(200)  # let an onerror or onload fire, if one had been let through
    assert page.evaluate("window.__pwned") is None
    assert body.locator("script, img, iframe, svg[onload], object, embed").count() == 0
    found = page.evaluate("""() => {
      const body = document.querySelector('.msg-assistant .msg-body');
      const handlers = [...body.querySelectorAll('*')].flatMap((e) => [...e.attributes].map((a) => a.name))
        .filter((name) => name.startsWith('on'));
      return { handlers, hrefs: [...body.querySelectorAll('[href]')].map((e) => e.getAttribute('href')) };
    }""")
    assert found == {"handlers": [], "hrefs": ["https://example.com", "https://example.com/track.png"]}
    text = body.inner_text()
    # The hostile HTML is shown as text; a link to a refused scheme stays literal; an image becomes a plain link
    # (nothing is fetched), and links open apart from the page.
    assert "<script>window.__pwned = 1</script>" in text and '<img src=x onerror="window.__pwned = 2">' in text
    assert "[click](javascript:window.__pwned=3)" in text and "[data](data:text/html," in text
    assert body.locator('a[href="https://example.com/track.png"]').inner_text() == "pixel"
    assert body.locator("a").first.get_attribute("rel") == "noopener noreferrer"
    assert '<iframe src="javascript:window.__pwned=7"></iframe>' in body.locator("pre code").inner_text()


def token(text: str, p: float, alternatives: list[tuple[str, float]]) -> dict:
    """One entry of a `done` output's `logprobs` (docs/protocol.md), from probabilities."""
    return {"token": text, "logprob": math.log(p), "top": [{"token": t, "logprob": math.log(q)} for t, q in alternatives]}


HOSTILE_TOKEN = '<img src=x onerror="window.__pwned = 1">'


def test_chat_token_probabilities_toggle_asks_for_logprobs_and_each_sample_shows_its_tokens(open_page):
    page = open_page("/")
    page.check('#params input[name="logprobs"]')
    page.fill('#params input[name="n"]', "2")
    generate = send_prompt(page, "Hi")
    assert generate["params"]["logprobs"] == 5 and generate["params"]["n"] == 2
    first = [token("Hel", 0.9, [("Hel", 0.9), ("Hi", 0.05)]),
             token("lo", 0.25, [("p", 0.5), ("lo", 0.25), (" there", 0.125)]),
             token(HOSTILE_TOKEN, 0.5, [(HOSTILE_TOKEN, 0.5), ("<script>window.__pwned = 2</script>", 0.5)])]
    second = [token("Hi", 0.6, [("Hi", 0.6)]), token("!", 1.0, [("!", 1.0)])]
    chat_frame(page, {"type": "started", "request_id": "r1", "conversation_id": "c1"})
    chat_frame(page, {"type": "done", "request_id": "r1", "conversation_id": "c1", "worker": "w1",
                      "outputs": [{"index": 0, "text": "Hello" + HOSTILE_TOKEN, "finish_reason": "stop", "logprobs": first},
                                  {"index": 1, "text": "Hi!", "finish_reason": "stop", "logprobs": second}],
                      "usage": {"prompt_tokens": 5, "completion_tokens": 5, "cached_tokens": 0},
                      "timing": {"ttft_ms": 10.0, "tokens_per_s": 20.0}})
    sample = page.locator('.msg-assistant .sample[data-index="0"]')
    sample.locator(".show-tokens").click()
    assert sample.locator(".msg-body").is_hidden() and sample.locator(".token-view").is_visible()
    tokens = sample.locator(".tok")
    assert tokens.all_inner_texts() == ["Hel", "lo", HOSTILE_TOKEN]
    # Each sample has its own tokens, shown by its own button.
    other = page.locator('.msg-assistant .sample[data-index="1"]')
    assert other.locator(".token-view").is_hidden()
    other.locator(".show-tokens").click()
    assert other.locator(".tok").all_inner_texts() == ["Hi", "!"]

    # Hovering a token shows its probability and the alternatives, most likely first, the chosen one marked.
    tokens.nth(1).hover()
    tip = sample.locator(".tok-tip")
    tip.wait_for(state="visible")
    assert tip.locator(".tok-chosen span").all_inner_texts() == ['"lo"', "25.0%"]
    rows = tip.locator(".tok-alt").evaluate_all(
        "els => els.map(e => [e.querySelector('.tok-alt-text').textContent, e.querySelector('.tok-alt-p').textContent])")
    assert rows == [['"p"', "50.0%"], ['"lo"', "25.0%"], ['" there"', "12.5%"]]
    assert tip.locator(".tok-alt.chosen .tok-alt-text").inner_text() == '"lo"'
    # Focus (the keyboard's way) does the same; Escape hides the tip.
    tokens.nth(0).focus()
    assert tip.locator(".tok-chosen span").all_inner_texts() == ['"Hel"', "90.0%"]
    page.keyboard.press("Escape")
    assert tip.is_hidden()
    # The less likely a token, the stronger its background.
    alpha = "e => Number((getComputedStyle(e).backgroundColor.match(/[\\d.]+/g) ?? []).at(3) ?? 1)"
    assert tokens.nth(1).evaluate(alpha) > tokens.nth(2).evaluate(alpha) > tokens.nth(0).evaluate(alpha)

    # Model text stays text: the hostile token and alternative are shown, never run or parsed as markup.
    tokens.nth(2).hover()
    page.wait_for_timeout(200)  # let an onerror fire, if one had been let through
    assert page.evaluate("window.__pwned") is None
    assert page.locator(".token-view img, .token-view script").count() == 0
    assert tip.locator(".tok-alt .tok-alt-text").all_inner_texts() == [json.dumps(HOSTILE_TOKEN),
                                                                       '"<script>window.__pwned = 2</script>"']


SYSTEM = "Be terse. Don't 'quote' me."
TRICKY = "It's \"quoted\" — naïve 日本語 ✓\nsecond line: a backslash \\ and $HOME `whoami` '' \u2028 end"
TRICKY_REPLY = "Sure: 'yes' \"no\"\n\ttabbed \\n literally"


def test_chat_view_code_writes_a_valid_curl_and_python_call_for_the_chat_and_its_settings(
        open_page, harness_url, monkeypatch, capsys):
    page = open_page("/")
    page.evaluate("() => { window.__copied = []; navigator.clipboard.writeText = async (t) => { window.__copied.push(t); }; }")
    page.click("#system-box summary")
    page.fill("#system-prompt", SYSTEM)
    page.fill('#params input[name="temperature"]', "0.3")
    page.fill('#params input[name="top_k"]', "40")  # one of vLLM's extras: extra_body for the openai client
    page.check('#params input[name="logprobs"]')
    page.click(".params-more summary")
    page.fill('#params input[name="seed"]', "7")
    page.fill('#params textarea[name="stop"]', "it's")
    send_prompt(page, TRICKY)
    finish_reply(page, TRICKY_REPLY)
    page.fill("#prompt", "And then?")  # the message being written is the request's last
    page.click("#view-code")
    dialog = page.locator(".code-dialog")
    dialog.wait_for(state="visible")
    curl = dialog.locator('[data-lang="curl"] code').text_content()
    python = dialog.locator('[data-lang="python"] code').text_content()

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TRICKY},
                {"role": "assistant", "content": TRICKY_REPLY}, {"role": "user", "content": "And then?"}]
    # The API's names and defaults: temperature differs from the API's 1.0; max_tokens (256) and the rest are
    # at the API's default and left out; the toggle is logprobs + top_logprobs.
    settings_sent = {"temperature": 0.3, "top_k": 40, "logprobs": True, "top_logprobs": 5, "seed": 7, "stop": ["it's"]}
    endpoint = harness_url + "/v1/chat/completions"

    # curl: valid bash, and bash hands curl exactly the endpoint, the headers and the JSON body.
    assert subprocess.run(["bash", "-n"], input=curl.encode()).returncode == 0
    script = "curl() { printf '%s\\0' \"$@\"; }\n" + curl
    run = subprocess.run(["bash"], input=script.encode(), capture_output=True, check=True,
                         env={"PATH": os.environ["PATH"], "PLAYGROUND_API_KEY": "pp-test"})
    args = run.stdout.decode().split("\0")[:-1]
    assert args[:6] == ["-N", endpoint, "-H", "Content-Type: application/json", "-H", "Authorization: Bearer pp-test"]
    assert args[6] == "-d" and len(args) == 8
    assert json.loads(args[7]) == {"model": MODEL, "messages": messages, **settings_sent, "stream": True}

    # Python: compiles, and run against a stand-in openai module it makes this client and this call.
    calls = {}

    class Completions:
        def create(self, **kwargs):
            calls["create"] = kwargs
            delta = SimpleNamespace(content="streamed")
            return iter([SimpleNamespace(choices=[SimpleNamespace(index=0, delta=delta)])])

    class OpenAI:
        def __init__(self, **kwargs):
            calls["client"] = kwargs
            self.chat = SimpleNamespace(completions=Completions())

    monkeypatch.setitem(sys.modules, "openai", SimpleNamespace(OpenAI=OpenAI))
    monkeypatch.delenv("PLAYGROUND_API_KEY", raising=False)
    exec(compile(python, "view-code.py", "exec"), {})
    assert calls["client"] == {"base_url": harness_url + "/v1", "api_key": "EMPTY"}
    extra = {"top_k": 40}
    assert calls["create"] == {"model": MODEL, "messages": messages, "extra_body": extra, "stream": True,
                               **{k: v for k, v in settings_sent.items() if k not in extra}}
    assert capsys.readouterr().out == "streamed\n"

    dialog.locator('[data-lang="curl"] .code-snippet-copy').click()
    page.wait_for_function("() => window.__copied.length === 1")
    assert page.evaluate("window.__copied[0]") == curl
    # Escape closes the dialog and the focus goes back to the button that opened it.
    page.keyboard.press("Escape")
    assert dialog.is_hidden() and page.evaluate("document.activeElement.id") == "view-code"


def test_question_mark_lists_the_shortcuts_of_the_one_table_and_they_act(open_page):
    page = open_page("/")
    page.focus("#prompt")
    page.keyboard.press("?")  # typing in a field: a key is text there, not a shortcut
    assert page.input_value("#prompt") == "?" and page.locator(".shortcuts-dialog").is_hidden()
    page.fill("#prompt", "")
    page.evaluate("document.activeElement.blur()")
    page.keyboard.press("?")
    dialog = page.locator(".shortcuts-dialog")
    dialog.wait_for(state="visible")
    listed = dialog.locator("dt").all_inner_texts()
    table = page.evaluate("import('/static/chat/shortcuts.js').then((m) => m.SHORTCUTS.map((s) => s.shown ?? s.key))")
    assert listed == table and {"?", "/", "Esc", "r", "n"} <= set(listed)
    page.keyboard.press("Escape")
    assert dialog.is_hidden()

    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "prompt" and page.input_value("#prompt") == ""
    send_prompt(page, "Hi")
    chat_frame(page, {"type": "started", "request_id": "r1", "conversation_id": "c1"})
    page.keyboard.press("Escape")  # while typing too: stops the reply
    assert page.evaluate("window.__sent").pop() == {"type": "cancel", "request_id": "r1"}
    chat_frame(page, {"type": "done", "request_id": "r1", "conversation_id": "c1", "worker": "w1",
                      "outputs": [{"index": 0, "text": "He", "finish_reason": "abort"}],
                      "usage": {"prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 0},
                      "timing": {"ttft_ms": 10.0, "tokens_per_s": 1.0}})
    page.evaluate("document.activeElement.blur()")
    page.keyboard.press("r")
    regenerate = page.evaluate("window.__sent").pop()
    assert regenerate["type"] == "generate" and regenerate["messages"] == [{"role": "user", "content": "Hi"}]
    finish_reply(page, "Hello", "r2")
    page.evaluate("document.activeElement.blur()")
    page.keyboard.press("n")
    assert page.locator(".msg").count() == 0 and page.locator("#chat-title").inner_text() == "New chat"


def test_chat_any_message_can_be_edited_or_regenerated_and_branches_show(open_page):
    page = open_page("/")
    send_prompt(page, "Hi")
    finish_reply(page, "Hello, world")
    # After the reply is saved the page learns the ids and branches: the user message is the second of two.
    user = page.locator(".msg-user").first
    user.locator(".branch-count").wait_for()
    assert user.locator(".branch-count").inner_text() == "2/2"
    assert user.locator(".branch-prev").is_enabled() and user.locator(".branch-next").is_disabled()
    send_prompt(page, "And?")
    finish_reply(page, "More.", "r2")

    # Regenerate the first reply: it and everything after it leave the page; the transcript ends at "Hi".
    page.locator(".msg-assistant .regenerate").first.click()
    generate = page.evaluate("window.__sent").pop()
    assert generate["messages"] == [{"role": "user", "content": "Hi"}]
    assert page.locator(".msg").count() == 2  # "Hi" and the new reply streaming
    finish_reply(page, "Hello again", "r3")

    # Edit the first message in place: Enter sends the edited transcript, a new branch.
    user.locator(".edit").click()
    page.fill(".edit-form textarea", "Hi there")
    page.press(".edit-form textarea", "Enter")
    generate = page.evaluate("window.__sent").pop()
    assert generate["messages"] == [{"role": "user", "content": "Hi there"}]
    assert page.locator(".msg-user .msg-body").all_inner_texts() == ["Hi there"]


def test_chat_meter_counts_without_a_window_until_a_worker_reports_one(open_page):
    """No worker has loaded yet and ENGINE_MAX_MODEL_LEN is unset: the page has no window to draw against,
    says so, and takes the window the worker resolved from the first reply's `done` frame."""
    assert CHAT_CONFIG["context"]["window"] is None
    page = open_page("/")
    meter = page.locator("#context-meter")
    page.fill("#prompt", "How full is the window?")
    assert meter.get_attribute("data-state") == "unknown"
    assert "window known once a worker has loaded the model" in meter.inner_text()
    send_prompt(page, "Hi")
    chat_frame(page, {"type": "started", "request_id": "r1", "conversation_id": "c1"})
    chat_frame(page, {
        "type": "done", "request_id": "r1", "conversation_id": "c1", "worker": "w1",
        "outputs": [{"index": 0, "text": "Hello", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "cached_tokens": 0},
        "timing": {"ttft_ms": 10.0, "tokens_per_s": 50.0},
        "context": {"policy": "drop-oldest-turns", "window": 8192, "max_tokens": 256, "reply_room": 256,
                    "conversation_tokens": 9, "prompt_tokens": 9, "dropped_messages": 0, "dropped_turns": 0},
    })
    page.wait_for_function("() => document.querySelector('#context-meter').dataset.state === 'ok'")
    assert meter.get_attribute("aria-valuemax") == "8192"
    assert "/ 8,192 tokens" in meter.inner_text()
