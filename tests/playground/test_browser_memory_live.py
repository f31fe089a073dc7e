"""The admin memory view live against the real embedded playground (daphne, in-process worker, the real
model on the CPU), in Debian's chromium: a staff user watches while a generation runs over the chat socket.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from live_stack import REPO, EmbeddedServer
from websockets.sync.client import connect

pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STAFF = {"username": "ada", "password": "analytical-engine-1843"}
SYSTEM = "You are a patient tutor. Explain every idea with a short example and keep a friendly tone throughout."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`manage.py playground` with a staff user, once its worker is ready."""
    workdir = tmp_path_factory.mktemp("memory-live")
    embedded = EmbeddedServer(workdir)
    try:
        embedded.wait_url()
        embedded.wait_ready()
        env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
        env.update(PLAYGROUND_VAR_DIR=str(workdir), DJANGO_SUPERUSER_PASSWORD=STAFF["password"])
        subprocess.run([sys.executable, "manage.py", "createsuperuser", "--noinput", "--username", STAFF["username"],
                        "--email", "ada@example.com"], cwd=REPO, env=env, check=True, timeout=120)
        yield embedded
    finally:
        embedded.stop()


@pytest.fixture
def open_page(browser, server):
    """open_page(path, staff=False) -> a page of the server at `path`, logged in as staff when asked."""
    contexts = []
    errors: list[str] = []

    def open_(path: str, staff: bool = False):
        context = browser.new_context(viewport={"width": 1500, "height": 1100})
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        if staff:
            page.goto(f"{server.base_url}/accounts/login/?next={path}")
            page.fill('input[name="username"]', STAFF["username"])
            page.fill('input[name="password"]', STAFF["password"])
            page.locator('form button[type="submit"]').click()
            page.wait_for_url(f"**{path}")
        else:
            page.goto(server.base_url + path)
        return page

    yield open_
    for context in contexts:
        context.close()
    assert errors == [], f"uncaught errors in the page: {errors}"


def chat(server: EmbeddedServer, params: dict, result: list) -> None:
    """One generation over the chat socket, to its end; appends the `done` (or error) frame to `result`."""
    with connect(server.ws_url, origin=server.base_url, proxy=None) as ws:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Explain recursion."}]
        ws.send(json.dumps({"type": "generate", "messages": messages, "params": params}))
        while (frame := json.loads(ws.recv(timeout=300)))["type"] not in ("done", "error"):
            pass
        result.append(frame)


def shared_seen(page) -> bool:
    return page.evaluate("window.seen.some(s => s.shared > 0)")


def points(card) -> list[int]:
    return [int(p) for p in card.locator(".chart").evaluate_all("els => els.map(e => e.dataset.points || '0')")]


def test_admin_view_charts_and_block_map_follow_a_running_generation(open_page, server, tmp_path):
    page = open_page("/memory/", staff=True)
    card = page.locator(".worker").first
    card.wait_for()  # the idle worker answers the page's connect with one snapshot
    canvas = card.locator("canvas.blockmap")
    assert canvas.get_attribute("data-used") == "0" and canvas.get_attribute("data-shared") == "0"
    start = points(card)
    # Record every map the page draws, so a state shown between two of playwright's polls is not missed.
    page.evaluate("""c => { window.seen = [];
        new MutationObserver(() => window.seen.push({shared: Number(c.dataset.shared),
                                                     rows: document.querySelectorAll('.requests tbody tr').length}))
            .observe(c, {attributes: true}); }""", canvas.element_handle())

    result: list[dict] = []
    thread = threading.Thread(target=chat, args=(server, {"n": 2, "temperature": 0.8, "seed": 3, "max_tokens": 48},
                                                 result))
    thread.start()
    try:
        # Both samples hold the prompt's blocks: shared cells appear, and the request shows its block tables.
        deadline = time.monotonic() + 120
        while thread.is_alive() and time.monotonic() < deadline and not shared_seen(page):
            time.sleep(0.1)
        page.wait_for_timeout(1000)  # frames still on their way once the chat has ended
        seen = page.evaluate("window.seen")
        assert any(s["shared"] > 0 and s["rows"] == 2 for s in seen), (seen, result, server.log_path.read_text()[-3000:])
        page.wait_for_function(
            "([c, n]) => [...c.querySelectorAll('.chart')].every((e) => Number(e.dataset.points) >= n)",
            arg=[card.element_handle(), max(start) + 3], timeout=120_000,
        )
    finally:
        thread.join(300)
    assert result and result[0]["type"] == "done", result
    # Finished: nothing is used any more, and the prompt's full blocks stay cached for the next turn.
    page.wait_for_function("c => c.dataset.used === '0' && c.dataset.shared === '0' && Number(c.dataset.cached) > 0",
                           arg=canvas.element_handle(), timeout=30_000)
    assert card.locator(".requests tbody tr").count() == 0
    page.screenshot(path=str(tmp_path / "admin-view.png"), full_page=True)


def test_chat_page_panel_shows_the_workers_figures(open_page):
    page = open_page("/")  # anonymous chat is on in the one-process mode
    page.locator("#kv-idle").wait_for(state="hidden")  # the idle worker answers the feed's connect
    assert page.locator("#kv-worker").inner_text().startswith("embedded@")
    assert page.locator('#kv-figures [data-figure="kv_usage"] dd').inner_text().endswith("%")
    assert page.locator('#kv-figures [data-figure="requests"] dd').inner_text() == "0 / 0"
