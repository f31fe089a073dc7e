"""on_own_thread: the work runs, its result or error comes back, and the caller keeps no OpenMP team."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from inference.openmp import on_own_thread

REPO = Path(__file__).resolve().parents[2]
# Counts the process's native threads beyond Python's own: an OpenMP team's threads are among them. They leave a
# moment after their master thread ends, so a count is taken once it has held still for a second.
_COUNTING = """
import os, threading, time
import torch
torch.set_num_threads(2)

def count():
    last, since = None, time.monotonic()
    while time.monotonic() - since < 1.0:
        now = len(os.listdir("/proc/self/task")) - threading.active_count()
        if now != last:
            last, since = now, time.monotonic()
        time.sleep(0.02)
    print("native threads:", last)
"""


def native_thread_counts(body: str) -> list[int]:
    """Run `body` in a fresh Python with two OpenMP threads, where `count()` records the native threads there are;
    the counts, in order."""
    done = subprocess.run([sys.executable, "-c", _COUNTING + body], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [int(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("native threads:")]


def test_the_result_and_the_error_come_back_to_the_caller():
    callers = []
    assert on_own_thread(lambda a, b=0: callers.append(threading.current_thread()) or a + b, 2, b=3) == 5
    assert callers[0] is not threading.current_thread() and not callers[0].is_alive()
    with pytest.raises(ValueError, match="invalid literal"):
        on_own_thread(int, "not a number")


def test_the_caller_keeps_no_openmp_team():
    before, elsewhere, here = native_thread_counts("""
from inference.openmp import on_own_thread

def work():
    return float((torch.ones(1 << 20) * 2).sum())  # large enough for a parallel region

count()
assert on_own_thread(work) == 2 * (1 << 20)
count()
work()
count()
""")
    assert elsewhere == before
    assert here == before + 1  # work on this thread leaves its team: the count can see one
