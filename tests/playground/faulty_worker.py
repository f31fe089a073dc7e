"""A Celery GPU worker whose engine loop raises, outside `step()`, once the file named by
PLAYGROUND_TEST_FAULT_FILE exists (fault injection for test_faults.py; run as `python faulty_worker.py -A
playground worker ...`). The fault is in `LLMEngine.metrics`, which the loop thread calls after every step."""
import os
import sys

from celery.__main__ import main

from inference.engine import LLMEngine

FLAG = os.environ["PLAYGROUND_TEST_FAULT_FILE"]
_metrics = LLMEngine.metrics


def metrics(self, block_map: bool = True) -> dict:
    if os.path.exists(FLAG):
        raise RuntimeError("injected fault in the engine loop")
    return _metrics(self, block_map)


LLMEngine.metrics = metrics

if __name__ == "__main__":
    sys.exit(main())
