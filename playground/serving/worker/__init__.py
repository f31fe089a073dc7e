"""GPU-worker side of serving. One worker process hosts one engine; its threads and what each owns:

| thread | started by | owns |
|---|---|---|
| `engine-loop` | `inference.StreamingEngine.start` | the `LLMEngine`: scheduler, block manager, model; the only thread that steps |
| `engine-load` | `WorkerRuntime.start` | loading the model, once; ends when the engine is up (or failed) |
| `channel-loop` | `LoopBridge.start` (the embedded mode uses daphne's loop instead) | every channel-layer call: the token publisher (`coalesce`), the control-group listener (aborts, dashboard requests), the task threads' sends |
| `worker-heartbeat` | `WorkerRuntime.start` | the registry entry: state, engine health, live request ids, metrics, each second |
| `kv-publisher` | `SnapshotPublisher.start` (playground.dashboard) | sampling the engine's figures and publishing KV snapshots |
| Celery pool threads | Celery (`--pool threads`) | one request each, in `WorkerRuntime.serve`: submit, wait for the publisher, send `gen.done` / `gen.error` |

Only the engine loop touches the engine's state; every other thread goes through `StreamingEngine`'s
thread-safe calls (add_request, abort, metrics, health).
"""
