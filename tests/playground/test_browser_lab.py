"""Browser tests of the lab page against the embedded playground (real model; Debian's chromium through
playwright): every scenario steps to its end with the views showing the engine's block counts, each quiz is
answered with the number the page shows and the server agrees, and a recording replays forwards and backwards
(also after importing it as a file, with no model involved).

With PLAYGROUND_SCREENSHOT_DIR set, the views are saved there as PNGs (docs/ holds the committed ones).
"""
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api")

from api_server import start  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCENARIOS = ["fragmentation", "parallel_sampling", "beam_search", "shared_prefix", "preemption", "lru_eviction"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = start(tmp_path_factory.mktemp("lab-browser"))
    yield live
    live.stop()


def screenshot(page, name: str) -> None:
    folder = os.environ.get("PLAYGROUND_SCREENSHOT_DIR")
    if folder:
        page.screenshot(path=str(Path(folder) / f"lab-{name}.png"), full_page=True)


def counter(page, key: str) -> int:
    return int(page.inner_text(f'#counters [data-counter="{key}"] dd'))


def step(page) -> int:
    before = int(page.inner_text("#step-number"))
    page.click("#step")
    page.wait_for_function(f"() => Number(document.getElementById('step-number').textContent) === {before + 1}",
                           timeout=30_000)
    return before + 1


def open_scenario(page, base_url: str, name: str) -> None:
    if not page.url.endswith("/lab/"):
        page.goto(f"{base_url}/lab/")
    page.wait_for_selector(f'#scenarios button[data-scenario="{name}"]', timeout=60_000)
    page.click(f'#scenarios button[data-scenario="{name}"]')
    page.wait_for_function("() => document.getElementById('step-number').textContent === '0'"
                           " && !document.getElementById('scenario-card').hidden")


def assert_views_agree(page) -> None:
    """The pool's cells, the counters and the block tables tell the same story."""
    used = page.locator('#pool .block[data-state="used"]').count()
    assert used == counter(page, "num_blocks_used")
    shared = page.locator("#pool .block.cell-shared").count()
    assert shared == counter(page, "num_blocks_shared")
    in_tables = set(page.eval_on_selector_all("#tables .logical", "cells => cells.map(c => c.dataset.block)"))
    used_ids = set(page.eval_on_selector_all('#pool .block[data-state="used"]',
                                             "cells => cells.map(c => c.dataset.block)"))
    assert in_tables == used_ids


def answer_quiz(page, guess: int) -> str:
    page.evaluate("() => { document.getElementById('quiz-verdict').textContent = ''; }")
    page.fill('#quiz-form [name="guess"]', str(guess))
    page.click("#quiz-form button")
    page.wait_for_function("() => document.getElementById('quiz-verdict').textContent !== ''")
    return page.get_attribute("#quiz-verdict", "data-correct")


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_scenario_runs_to_its_end(server, page, name):
    open_scenario(page, server.base_url, name)
    quiz_step = None
    shown = None
    for _ in range(200):
        number = step(page)
        assert_views_agree(page)
        if name == "fragmentation" and number == 1:
            # Every prompt fits one block of 8 and is prefilled in step 1: one block each, nothing shared.
            assert counter(page, "num_blocks_used") == 4 and counter(page, "num_blocks_shared") == 0
            shown = int(page.inner_text('#contiguous [data-policy^="Contiguous, max_model_len"] .bar-label')
                        .split("admits ")[1].split(" of")[0])
            screenshot(page, "fragmentation")
        if name == "parallel_sampling" and number == 1:
            # Forked at the first sample: the 4 samples hold the prompt's 2 blocks by reference.
            assert page.locator('#pool .block[data-ref="4"]').count() == 2
        if name == "parallel_sampling" and number == 2:
            shown = len(set(page.eval_on_selector_all("#tables .logical", "c => c.map(x => x.dataset.block)")))
            screenshot(page, "copy-on-write")
        if name == "shared_prefix" and number == 5:
            screenshot(page, "prefix-cache")
        if name == "preemption" and counter(page, "num_preemptions_total") and shown is None:
            assert page.locator('#timeline li[data-kind="preempted"]').count() == 1
            screenshot(page, "preemption")
            shown = -1
        if quiz_step is None and page.is_visible("#quiz-answer"):
            quiz_step = number
        if page.get_attribute("#step-number", "data-finished") == "true":
            break
    assert quiz_step is not None
    if name in ("fragmentation", "parallel_sampling"):
        assert answer_quiz(page, shown) == "true"  # the number the page showed is the engine's answer
    else:
        answer_quiz(page, 999_999)
        verdict = page.inner_text("#quiz-verdict")
        assert verdict.startswith("Not quite: the engine says ")
        right = int(verdict.removeprefix("Not quite: the engine says ").rstrip("."))
        if name == "shared_prefix":
            cached = page.inner_text('#tables .request[data-label="C"] header')
            assert f"{right} prompt tokens from the cache" in cached
        if name == "preemption":
            assert right == counter(page, "num_preemptions_total") >= 1
        assert answer_quiz(page, right) == "true"
    assert counter(page, "num_blocks_used") == 0  # everything finished: every block came back


def test_three_attention_variants_fill_the_same_pool_bytes_side_by_side(server, page):
    """The comparison scenario: one lane per tiny model, each drawn with the lab's own views; the page's block
    counts agree with each lane's counters, the model with the smaller cache per token holds more tokens and
    admits more requests, and the quiz is answered from the token slots the page shows."""
    open_scenario(page, server.base_url, "attention_memory")
    models = ["mha", "gqa", "mla"]
    assert page.eval_on_selector_all("#lanes .lane", "c => c.map(x => x.dataset.lane)") == models
    assert page.is_hidden("#single-view") and page.is_disabled("#download")

    def figure(model: str, key: str) -> int:
        return int(page.inner_text(f'#lanes [data-lane="{model}"] [data-counter="{key}"] dd'))

    number = step(page)
    for model in models:
        lane = f'#lanes [data-lane="{model}"]'
        assert page.locator(f"{lane} .pool .block").count() == figure(model, "num_blocks")
        assert page.locator(f'{lane} .pool .block[data-state="used"]').count() == figure(model, "num_blocks_used")
        assert figure(model, "token_slots") == 8 * figure(model, "num_blocks")  # blocks of 8 tokens
        assert figure(model, "running") + figure(model, "waiting") == 8
        assert f"= {figure(model, 'kv_bytes_per_token')} bytes per token" in page.inner_text(f"{lane} .lane-bytes")
    # Same bytes: token slots go as the inverse of bytes per token, and more requests run at once.
    slots = {m: figure(m, "token_slots") for m in models}
    per_token = {m: figure(m, "kv_bytes_per_token") for m in models}
    assert slots["mla"] * per_token["mla"] == slots["mha"] * per_token["mha"]
    assert figure("mha", "running") < figure("gqa", "running") <= figure("mla", "running") == 8
    assert page.locator("#timeline li", has_text="MLA: ").count() > 0
    assert page.is_visible("#quiz-answer")
    while not figure("mha", "num_preemptions_total") and number < 40:  # until the MHA pool runs short
        number = step(page)
    assert figure("mha", "num_preemptions_total") >= 1 and figure("mla", "num_preemptions_total") == 0
    assert answer_quiz(page, slots["mla"] // slots["mha"]) == "true"
    screenshot(page, "attention-memory")


def test_play_runs_a_scenario_and_the_recording_replays(server, page, tmp_path):
    open_scenario(page, server.base_url, "lru_eviction")
    page.select_option("#speed", "200")
    page.click("#play")
    page.wait_for_function("() => document.getElementById('play').textContent === 'Play'", timeout=240_000)
    assert counter(page, "evictions_total") >= 1 and counter(page, "num_blocks_used") == 0
    with page.expect_download() as download:
        page.click("#download")
    path = tmp_path / "recording.json"
    download.value.save_as(path)
    recording = json.loads(path.read_text())
    assert recording["format"] == "paged-playground-recording/1" and recording["num_blocks"] == 16
    page.wait_for_selector("#replay:not([hidden])")
    # At the end nothing is used; scrubbing back to a step where B and C ran shows them holding blocks.
    assert page.locator('#replay-pool .block[data-state="used"]').count() == 0
    target = next(i for i, e in enumerate(_steps(recording)) if e == 20)
    page.fill("#replay-slider", str(target))
    page.dispatch_event("#replay-slider", "input")
    assert page.inner_text("#replay-step") == "20"
    held_at_20 = page.locator('#replay-pool .block[data-state="used"]').count()
    assert held_at_20 > 0 and page.locator("#replay-tables .request").count() == 2
    screenshot(page, "replay")
    page.click("#replay-forward")
    assert page.inner_text("#replay-step") == "21"
    page.click("#replay-back")
    page.click("#replay-back")
    assert page.inner_text("#replay-step") == "19"
    # The same recording imported as a file replays with no model: the page is reloaded first.
    page.goto(f"{server.base_url}/lab/")
    page.set_input_files("#import", str(path))
    page.wait_for_selector("#replay:not([hidden])")
    page.fill("#replay-slider", str(target))
    page.dispatch_event("#replay-slider", "input")
    assert page.locator('#replay-pool .block[data-state="used"]').count() == held_at_20
    server.wait_idle()  # the labs never touched the worker's own pool


def _steps(recording: dict) -> list[int]:
    """The distinct steps of a recording in order (the replay slider's positions)."""
    steps: list[int] = []
    for event in recording["events"]:
        if not steps or steps[-1] != event["step"]:
            steps.append(event["step"])
    return steps


def test_chat_replies_carry_a_cache_receipt_with_the_prompt_coloured(server, page):
    """A follow-up turn finds the first turn's prompt in the prefix cache: its receipt says so, and the
    provenance view colours exactly that many tokens' worth of blocks green."""
    page.goto(f"{server.base_url}/")
    page.wait_for_selector('#conn[data-status="open"]')
    for question in ("Name three colours, briefly.", "And three animals?"):
        page.fill("#prompt", question)
        page.keyboard.press("Enter")
        page.wait_for_function("(n) => document.querySelectorAll('.msg-assistant[data-state=\"done\"]').length === n",
                               arg=page.locator(".msg-assistant").count(), timeout=120_000)
    reply = page.locator(".msg-assistant").last
    cached = int(reply.locator('[data-stat="cached_tokens"] .stat-value').inner_text())
    assert cached > 0
    reply.locator(".receipt summary").click()
    assert reply.locator('[data-stat="receipt_cached"] .stat-value').inner_text().startswith(f"{cached} tokens")
    green = reply.locator('.provenance [data-source="cached"]')
    assert green.count() == cached // 16  # one segment per cached block (the server's blocks are 16 tokens)
    assert reply.locator('.provenance [data-source="computed"]').count() >= 1
    assert reply.locator('[data-stat="receipt_preemptions"] .stat-value').inner_text() == "0"
    screenshot(page, "cache-receipt")


def test_the_api_returns_the_receipt_in_usage(server):
    key = server.api_key("receipt-user")
    body = json.dumps({"model": "smollm2-135m-instruct", "prompt": "The three primary colours are",
                       "max_tokens": 4, "temperature": 0}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    status, raw = server.post("/v1/completions", body, headers)
    assert status == 200, raw
    usage = json.loads(raw)["usage"]
    receipt = usage["cache_receipt"]
    assert receipt["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    spans = receipt["provenance"]
    assert spans[0][0] == 0 and spans[-1][1] == usage["prompt_tokens"]
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous cover of the prompt
    assert receipt["ttft_ms"] > 0 and receipt["preemptions"] == 0


STAFF = {"username": "grace", "password": "cobol-1959-compiler"}


def test_a_live_workers_recording_downloads_and_replays_in_the_lab(server, page, tmp_path):
    """Staff record the worker's own engine on /memory/, serve an API request meanwhile, stop, download the
    recording, and scrub it on /lab/ with no model: the request's blocks appear and are all freed at the end."""
    server.manage("shell", "-c", "from django.contrib.auth.models import User; "
                  f"User.objects.create_superuser({STAFF['username']!r}, 'g@example.com', {STAFF['password']!r})")
    page.goto(f"{server.base_url}/accounts/login/?next=/memory/")
    page.fill("#id_username", STAFF["username"])
    page.fill("#id_password", STAFF["password"])
    page.click("button[type=submit]")
    page.wait_for_selector(".worker .record", timeout=60_000)
    page.click(".worker .record")
    page.wait_for_selector('.worker .record[data-recording="recording"]', timeout=30_000)
    key = server.api_key("recorded-user")
    body = json.dumps({"model": "smollm2-135m-instruct", "prompt": "Once upon a time", "max_tokens": 20,
                       "temperature": 0}).encode()
    status, _ = server.post("/v1/completions", body, {"Authorization": f"Bearer {key}",
                                                      "Content-Type": "application/json"})
    assert status == 200
    page.click(".worker .record")
    page.wait_for_selector(".worker .recording-link:not([hidden])", timeout=30_000)
    href = page.get_attribute(".worker .recording-link", "href")
    recording = page.request.get(f"{server.base_url}{href}").json()
    assert recording["format"] == "paged-playground-recording/1" and not recording["truncated"]
    kinds = {e["kind"] for e in recording["events"]}
    assert {"request_added", "scheduled", "allocated", "freed", "finished"} <= kinds
    path = tmp_path / "live.json"
    path.write_text(json.dumps(recording))
    page.goto(f"{server.base_url}/lab/")
    page.set_input_files("#import", str(path))
    page.wait_for_selector("#replay:not([hidden])")
    assert page.locator('#replay-pool .block[data-state="used"]').count() == 0  # the end: all freed
    page.fill("#replay-slider", "1")
    page.dispatch_event("#replay-slider", "input")
    assert page.locator('#replay-pool .block[data-state="used"]').count() > 0  # mid-request: blocks held
    anonymous = page.context.browser.new_context().new_page()
    anonymous.goto(f"{server.base_url}{href}")
    assert "/accounts/login/" in anonymous.url  # staff only
    anonymous.close()
