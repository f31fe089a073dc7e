"""GPU-worker side of serving. One worker process hosts one engine; its threads and what each owns:

| thread | started by | owns |
|---|---|---|
| `engine-loop` | `inference.StreamingEngine.start` | the `LLMEngine`: scheduler, block manager, model; the only thread that steps |
| `engine-load` | `WorkerRuntime.start` | loading the model, once; ends when the engine is up (or failed) |
| `channel-loop` | `LoopBridge.start` (the embedded mode uses daphne's loop instead) | every channel-layer call: the token publisher (`coalesce`), the control-group listener (aborts, dashboard requests), the task threads' sends |
| `worker-abort` | `WorkerRuntime` | `gen.abort` messages handed over by the control-group listener: the runtime's request sets (its lock) and `EngineService.abort`, so the event loop never waits for either |
| `worker-drain` | `Drain.begin` (drain.py), on SIGTERM | marking the registry entry draining, waiting up to `PLAYGROUND_DRAIN_S` for the requests held, aborting what is left |
| `worker-heartbeat` | `WorkerRuntime.start` | the registry entry: state, engine health, live request ids, metrics, each second |
| `kv-publisher` | `SnapshotPublisher.start` (`kv_publisher`) | sampling the engine's figures and publishing KV snapshots |
| `kv-record` | `SnapshotPublisher.control`, one per Record / Stop press | starting or stopping the engine's event recording (waits for the engine loop to run the call) |
| `lab` | `LabHost.start` | the lab sessions' inbox: hands each command to the engine loop (which owns the sandboxes) and sends the reply |
| `celery-worker` | `playground.serving.embedded` (the embedded mode only) | Celery's consumer, which starts the pool threads below |
| Celery pool threads | `pool.TaskPool`, all at the pool's start | one request each, in `WorkerRuntime.serve`: submit, wait for the publisher, send `gen.done` / `gen.error` |

The runtime's lock guards its request sets only: it is held for a few set operations, never across a call
into the engine, and never taken on the event loop. Only the engine loop touches the engine's state; every other thread goes through `StreamingEngine`'s
thread-safe calls (add_request, abort, metrics, health).
"""
