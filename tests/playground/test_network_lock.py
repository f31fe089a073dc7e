"""network_lock: browsers share it, Docker's network changes hold it alone, and a waiting change goes before
browsers that came after it."""
import threading
import time

import network_lock
import pytest


@pytest.fixture(autouse=True)
def _own_lock_files(tmp_path, monkeypatch):
    """This test's files, not the machine's: a real test run beside it keeps its own."""
    monkeypatch.setattr(network_lock, "LOCK", tmp_path / "network.lock")
    monkeypatch.setattr(network_lock, "GATE", tmp_path / "network.gate")


def _in_thread(events: list[str], name: str, hold, release: threading.Event) -> threading.Thread:
    def run() -> None:
        with hold():
            events.append(f"{name} in")
            release.wait(10)
        events.append(f"{name} out")
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _until(condition, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_browsers_share_and_a_change_waits_for_them_then_goes_before_later_browsers():
    events: list[str] = []
    first_browser_done, change_done, later_browsers_done = threading.Event(), threading.Event(), threading.Event()
    first = [_in_thread(events, f"browser {i}", network_lock.browsing, first_browser_done) for i in range(2)]
    _until(lambda: events.count("browser 0 in") + events.count("browser 1 in") == 2)  # shared: both at once

    change = _in_thread(events, "change", network_lock.changing_the_network, change_done)
    time.sleep(0.6)  # the change is now waiting for the browsers
    later = _in_thread(events, "browser 2", network_lock.browsing, later_browsers_done)
    time.sleep(0.6)
    assert "change in" not in events and "browser 2 in" not in events  # the change waits; so does browser 2

    first_browser_done.set()
    _until(lambda: "change in" in events)
    time.sleep(0.6)
    assert "browser 2 in" not in events  # not while the network changes

    change_done.set()
    _until(lambda: "browser 2 in" in events)
    later_browsers_done.set()
    for thread in [*first, change, later]:
        thread.join(5)
    assert events.index("change out") < events.index("browser 2 in")


def test_a_holder_that_never_lets_go_fails_the_waiter_by_name(monkeypatch):
    monkeypatch.setattr(network_lock, "WAIT_S", 0.5)
    with network_lock.changing_the_network():
        waiter_error: list[BaseException] = []

        def wait() -> None:
            try:
                with network_lock.browsing():
                    pass
            except TimeoutError as exc:
                waiter_error.append(exc)
        thread = threading.Thread(target=wait)
        thread.start()
        thread.join(5)
    assert waiter_error and "network.lock still held" in str(waiter_error[0])
