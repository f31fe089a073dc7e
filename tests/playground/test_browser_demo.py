"""Browser test of the demo presenter page against the embedded playground (real model, Debian's
chromium through playwright): starting 8 simulated users shows 8 streams and a rising memory chart."""
import re

import pytest

pytest.importorskip("playwright.sync_api")

from api_server import start  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MEMORY_CHART = '#charts [data-chart="memory"]'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = start(tmp_path_factory.mktemp("demo-browser"))
    yield live
    live.stop()


def test_eight_simulated_users_stream_and_memory_rises(server, page):
    page.goto(f"{server.base_url}/demo/")
    page.wait_for_selector('#conn[data-status="open"]')
    # Idle worker first: the chart has points and nothing is held yet.
    page.wait_for_function(f"() => Number(document.querySelector('{MEMORY_CHART}')?.dataset.points) >= 1",
                           timeout=30_000)
    assert float(page.get_attribute(MEMORY_CHART, "data-peak-usage")) == 0

    page.fill('#controls [name="users"]', "8")
    page.fill('#controls [name="rate"]', "8")
    page.fill('#controls [name="max_tokens"]', "16")
    page.click("#start")

    page.wait_for_function("() => document.querySelectorAll('#streams .stream').length === 8", timeout=30_000)
    # Every simulated user streams text, and the memory chart climbs above zero while they do.
    page.wait_for_function(
        "() => [...document.querySelectorAll('#streams .stream-text')].every((t) => t.textContent.trim().length > 0)",
        timeout=240_000,
    )
    page.wait_for_function(f"() => Number(document.querySelector('{MEMORY_CHART}').dataset.peakUsage) > 0",
                           timeout=60_000)
    # The block map of the demo's own requests fills while they run (full snapshots, filtered by the server).
    page.wait_for_function("() => Number(document.getElementById('demo-blockmap').dataset.used) > 0",
                           timeout=60_000)
    assert "of the demo's sequences running" in page.inner_text("#demo-blockmap-counts")
    assert int(page.get_attribute(MEMORY_CHART, "data-points")) >= 2
    names = page.locator("#streams .stream-name").all_inner_texts()
    assert len(set(names)) == 8
    page.wait_for_selector('#run-status[data-state="finished"]', timeout=240_000)
    assert page.locator('#streams .stream[data-state="done"]').count() == 8
    stats = page.locator("#streams .stream-stats").all_inner_texts()
    assert all("generated" in s for s in stats)
    # Several presets share a system prompt: later arrivals find its blocks in the prefix cache.
    assert any(int(re.search(r"(\d+) cached", s).group(1)) > 0 for s in stats)
    server.wait_idle()
