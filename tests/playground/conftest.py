"""Fixtures shared by the playground tests."""
from pathlib import Path

import network_lock
import page_log
import pytest
from django.core.cache import cache
from django.test import Client

# Debian's chromium, driven by playwright; no browser is ever downloaded (bin/setup installs it).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


@pytest.fixture(autouse=True)
def _fresh_cache():
    """The worker registry lives in the cache: no heartbeat leaks from one test into the next."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(scope="module")
def browser():
    """One headless chromium per test module (skips where chromium or playwright is missing), while no Docker
    work changes the host's interfaces (network_lock.py: a change fails the page's loads)."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed")
    with network_lock.browsing(), playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh desktop-sized page; the test fails if the page raised an uncaught error. What it saw is printed
    (page_log.py), so a failed test's captured output shows it."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page_log.follow(page)
    yield page
    context.close()
    assert errors == [], f"uncaught errors in the page: {errors}"


@pytest.fixture(scope="module")
def orm_beside_playwright():
    """For browser tests on Django's live_server that use the ORM between page steps (request it with
    `pytest.mark.usefixtures` in the module's pytestmark). Playwright's sync API keeps an event loop running in
    this thread, which makes Django refuse database calls here (SynchronousOnlyOperation), the test database's
    own set-up and flush included; they run one at a time, between page steps. Module-scoped, so it is in place
    before any per-test database fixture."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture
def ada(django_user_model):
    """A logged-in test client of user "ada" (`.account` is the user): the owner in the ownership tests."""
    account = django_user_model.objects.create_user("ada", password="x" * 12)
    client = Client()
    client.force_login(account)
    client.account = account
    return client


@pytest.fixture
def mallory(django_user_model):
    """A logged-in test client of another user, "mallory": everything of ada's must be a 404 to her."""
    client = Client()
    client.force_login(django_user_model.objects.create_user("mallory", password="x" * 12))
    return client
