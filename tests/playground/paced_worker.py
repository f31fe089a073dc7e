"""A Celery GPU worker whose engine steps are paced (each waits PLAYGROUND_TEST_STEP_S first), so a stream of a
couple of hundred tokens lasts well past Docker's default 10 s stop timeout on any machine (test_drain.py;
run as `python paced_worker.py -A playground worker ...`)."""
import os
import sys
import time

from celery.__main__ import main

from inference.engine import LLMEngine

PAUSE_S = float(os.environ["PLAYGROUND_TEST_STEP_S"])
_step = LLMEngine.step


def step(self, *args, **kwargs):
    time.sleep(PAUSE_S)
    return _step(self, *args, **kwargs)


LLMEngine.step = step

if __name__ == "__main__":
    sys.exit(main())
