"""Serving: how a generation gets from a front door (chat socket, OpenAI API, demo) to a GPU worker's
engine and back. A module's path says which process runs it:

- `web/`: web processes only (daphne): the request lifecycle, validation of what clients send, routing
  and dispatch to Celery, liveness checks, /healthz. Never imports torch or the engine.
- `worker/`: GPU worker processes only (Celery, or the embedded in-process worker): the runtime and its
  threads (listed in worker/__init__.py), the Celery task, the engine service, the token publisher, and the
  KV dashboard's snapshots (kv_publisher, kv_snapshot, stats).
- `shared/`: names, the worker registry and the KV dashboard's messages (kv_feed), which both sides use.
- `tools/`: benchmarks, run by management commands.
- `embedded.py`: the one-process mode, which runs a web server and a worker together.
"""
