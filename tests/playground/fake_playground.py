"""`manage.py playground` with the scripted FakeStreamingEngine (fake_engine.py) in place of the model: the real
daphne server, chat socket, Celery task and worker runtime, and an engine that answers "echo<i>: <last message>"
one character every PLAYGROUND_TEST_TOKEN_S seconds (0.03 by default), so a reply streams visibly on any
machine. For browser tests whose point is the page, not the model's words (live_stack.EmbeddedServer with
`argv=FAKE_PLAYGROUND`). Run from the repository root: `python tests/playground/fake_playground.py playground`.
"""
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import inference  # noqa: E402
from fake_engine import FakeStreamingEngine  # noqa: E402

# EngineService.load builds `inference.StreamingEngine(**settings.PLAYGROUND_ENGINE)` when the worker starts.
inference.StreamingEngine = functools.partial(FakeStreamingEngine, float(os.environ.get("PLAYGROUND_TEST_TOKEN_S", "0.03")))

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[1:]])
