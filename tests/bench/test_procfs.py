"""bench.procfs: a process's CPU seconds, all its threads together."""
import os
import threading
import time

import pytest

from bench import procfs


def test_a_process_s_cpu_seconds_are_read_from_proc_for_all_its_threads():
    def burn(seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    before, process_before = procfs.cpu_seconds(os.getpid()), time.process_time()
    worker = threading.Thread(target=burn, args=(0.3,))  # another thread's CPU counts too
    worker.start()
    worker.join()
    burn(0.2)
    used = procfs.cpu_seconds(os.getpid()) - before
    assert used == pytest.approx(time.process_time() - process_before, abs=0.05) and used >= 0.45
