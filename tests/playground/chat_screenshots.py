"""Regenerate the chat page's screenshots in docs/ with the real model (SmolLM2 on the CPU, the embedded
playground) and Debian's chromium: Compare, token probabilities, presets and View code. A tool, not a test (the
behaviour shown is tested in test_browser_chat_compare.py, test_browser_scripted.py and
test_browser_chat_presets.py). Run from the repository root: `python tests/playground/chat_screenshots.py docs`.
"""
import sys
import tempfile
from pathlib import Path

from live_stack import EmbeddedServer
from playwright.sync_api import Page, sync_playwright

PROMPT = "Describe the sea in one sentence."


def compare(page: Page, folder: Path) -> None:
    """A greedy A against a hot, seeded B, on one prompt; both receipts open."""
    page.evaluate("() => document.activeElement.blur()")
    page.keyboard.press("b")
    for side, fields in (("A", {"temperature": "0", "max_tokens": "48"}),
                         ("B", {"temperature": "1.3", "seed": "7", "max_tokens": "48"})):
        form = page.locator(f'.compare-side[data-side="{side}"]')
        form.locator(".params-more").evaluate("(e) => { e.open = true; }")
        for name, value in fields.items():
            form.locator(f'[name="{name}"]').fill(value)
            form.locator(f'[name="{name}"]').dispatch_event("input")
    page.fill("#prompt", PROMPT)
    page.press("#prompt", "Enter")
    page.wait_for_function("() => document.querySelectorAll('.compare-pane .msg-assistant[data-state=\"done\"]')"
                           ".length === 2", timeout=300_000)
    for summary in page.locator(".compare-pane .receipt summary").all():
        summary.click()
    page.screenshot(path=str(folder / "chat-compare.png"))
    page.click(".compare-close")


def token_probabilities(page: Page, folder: Path) -> None:
    """A reply shown as its tokens, one token's alternatives open."""
    page.check('#params [name="logprobs"]')
    page.fill('#params [name="max_tokens"]', "40")
    page.fill("#prompt", "Name three colours of the sea.")
    page.press("#prompt", "Enter")
    page.wait_for_function("() => document.querySelector('#messages .msg-assistant')?.dataset.state === 'done'",
                           timeout=300_000)
    reply = page.locator("#messages .msg-assistant")
    reply.locator(".show-tokens").click()
    reply.locator(".tok").nth(3).hover()
    page.screenshot(path=str(folder / "chat-token-probabilities.png"))


def presets(page: Page, folder: Path) -> None:
    """The settings panel's presets after saving one."""
    page.click("#system-box summary")
    page.fill("#system-prompt", "Answer in one short sentence.")
    page.click("#preset-save")
    page.fill("#preset-name", "Terse and greedy")
    page.press("#preset-name", "Enter")
    page.wait_for_function("() => !document.querySelector('#preset-status').hidden")
    status = page.inner_text("#preset-status")
    assert status.startswith("Saved"), status
    box = page.locator("#settings-panel").bounding_box()
    page.screenshot(path=str(folder / "chat-presets.png"), clip={**box, "height": min(box["height"], 640)})


def view_code(page: Page, folder: Path) -> None:
    """The conversation so far and a drafted message, as a curl command and a Python call."""
    page.fill("#prompt", "Which of them is the rarest?")
    page.evaluate("() => document.activeElement.blur()")
    page.keyboard.press("c")
    page.wait_for_selector("dialog.code-dialog[open]")
    page.screenshot(path=str(folder / "chat-view-code.png"))


def main(folder: Path) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        server = EmbeddedServer(Path(workdir))
        try:
            server.wait_url()
            server.wait_ready()
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                     args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{server.base_url}/")
                page.wait_for_selector('#conn[data-status="open"]')
                for shoot in (compare, token_probabilities, presets, view_code):
                    shoot(page, folder)
                browser.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
