"""`python -m bench.serving`: delivery over websockets (and, with --api-clients, streaming API chats at the same
time) vs the bare engine (the measuring itself is in `clients.py`). Checks every delivered text; prints a markdown
table row.

`--stack embedded` (the default) runs the whole site in this process as `bin/playground` does (daphne, the
in-process Celery worker, the in-memory channel layer), and the bare runs use that same engine: each delivered
text is checked against the engine's own output, and each run is split by the engine's request times.

`--stack distributed` runs docker-compose.yml's processes beside this one (`manage.py web` and a Celery worker,
over Redis at `--redis-url`, a database it empties first) with this process's environment, so the worker's engine
has the same settings as the bare one this process loads, which idles while the stack serves. Delivered texts are
checked against the same round's bare texts (greedy), and a web run's CPU is counted per process (web, worker,
Redis); the engine's request times stay in the worker, so there is no split. Before each web run the worker
empties its prefix cache, as the bare engine does before each bare run.

Either way it sets Django up itself, as manage.py would, with the project's settings and the user limits lifted
(one benchmarking client opens every stream). With `--rounds`, bare and web runs alternate which goes first (these
machines drift within minutes); `--out` keeps every round's figures as JSON for a bench/results record.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOAD_TIMEOUT_S = 600
# One benchmarking client opens every stream: per-user and per-address limits would refuse most (0 = unlimited).
NO_LIMITS = {"PLAYGROUND_MAX_CONCURRENT_REQUESTS": "0", "PLAYGROUND_TOKENS_PER_MINUTE": "0",
             "PLAYGROUND_ANON_MAX_CONCURRENT_PER_ADDRESS": "0", "PLAYGROUND_ANON_MAX_CONCURRENT": "0",
             "PLAYGROUND_ANON_TOKENS_PER_MINUTE_PER_ADDRESS": "0"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description="Tokens delivered through websockets "
                                     "and the streaming API against the bare engine.")
    parser.add_argument("--clients", type=int, default=32, help="websocket chat clients")
    parser.add_argument("--api-clients", type=int, default=0, help="streaming API chat clients, at the same time")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--port", type=int, default=8811)
    parser.add_argument("--rounds", type=int, default=1, help="bare/web pairs, alternating which runs first")
    parser.add_argument("--out", type=Path, metavar="JSON", help="every round's figures, rewritten after each")
    parser.add_argument("--stack", choices=("embedded", "distributed"), default="embedded")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13",
                        help="the distributed stack's Redis database (emptied before the stack starts)")
    args = parser.parse_args(argv)
    if args.clients < 0 or args.api_clients < 0 or args.clients + args.api_clients < 1 or args.max_tokens < 1:
        parser.error("give at least one client; --max-tokens must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.update(NO_LIMITS)
    if args.stack == "distributed":  # the stack's processes inherit all of it
        os.environ.update(REDIS_URL=args.redis_url, PLAYGROUND_ALLOW_ANONYMOUS="1",
                          SECRET_KEY=os.environ.get("SECRET_KEY") or "bench-serving")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from playground.accounts.models import ApiKey

    call_command("migrate", interactive=False, verbosity=0)
    _, api_key = ApiKey.objects.issue(get_user_model().objects.get_or_create(username="bench_ws")[0], "bench")
    try:
        report = (embedded if args.stack == "embedded" else distributed)(args, api_key)
    except Exception as exc:
        print(f"benchmark failed: {exc!r}", file=sys.stderr)
        return 1
    print(report)
    return 0


def embedded(args: argparse.Namespace, api_key: str) -> str:
    """The rounds against the site served from this process, its engine also the bare runs'."""
    from bench.serving import clients as bench
    from playground.serving import embedded as embedded_stack
    from playground.serving.worker import runtime

    outcome: dict[str, Any] = {}

    def measure() -> None:
        try:
            service = runtime.current().service
            service.wait_ready(LOAD_TIMEOUT_S)
            recorder = bench.FinalsRecorder(service)
            outcome["report"] = rounds(args, service, clients(args, api_key), recorder.finals)
        except Exception as exc:
            outcome["error"] = exc
        finally:
            embedded_stack.stop_serving()

    def ready() -> None:
        threading.Thread(target=measure, name="bench", daemon=True).start()

    embedded_stack.serve("127.0.0.1", args.port, ready)
    if "error" in outcome:
        raise outcome["error"]
    if "report" not in outcome:
        raise RuntimeError("the server stopped before the benchmark finished")
    return outcome["report"]


def distributed(args: argparse.Namespace, api_key: str) -> str:
    """The rounds against docker-compose.yml's web and worker processes on Redis; the bare runs on an engine of
    this process with the same settings."""
    import redis
    from django.conf import settings

    from bench import serve_vs_vllm
    from playground.serving.shared import registry
    from playground.serving.worker.engine_service import EngineService

    serve_vs_vllm.empty_redis(args.redis_url)
    service = EngineService(settings.PLAYGROUND_ENGINE, lora_modules=settings.PLAYGROUND_LORA_MODULES)
    service.load()
    service.wait_ready(0)
    gc.collect()  # as the worker does once its engine has loaded (runtime.WorkerRuntime._load)
    gc.freeze()
    _, worker, web = serve_vs_vllm.distributed_commands(args.port, settings.CELERY_WORKER_CONCURRENCY)
    log = Path(settings.VAR_DIR) / "bench-serving-stack.log"
    with serve_vs_vllm.running("distributed", [(worker, dict(os.environ)), (web, dict(os.environ))], args.port,
                               log) as (worker_proc, web_proc):
        cpu_pids = {"web": web_proc.pid, "worker": worker_proc.pid,
                    "redis": redis.Redis.from_url(args.redis_url).info("server")["process_id"]}
        (worker,) = [entry["name"] for entry in registry.live_workers()]  # the stack's one, healthy by now
        return rounds(args, service, clients(args, api_key, cpu_pids), None, lambda: empty_worker_cache(worker))


def empty_worker_cache(worker: str, timeout_s: float = 10.0) -> None:
    """Have the stack's worker drop its cached blocks (the dashboard's control message) and wait until its
    registry entry says none are left: every round sends the same prompts, which would otherwise find the last
    round's blocks in the worker's cache while the bare engine's starts cold."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from playground.serving.shared import kv_feed, registry

    async_to_sync(kv_feed.reset_prefix_cache)(get_channel_layer(), worker)
    deadline = time.monotonic() + timeout_s
    while (entry := registry.get(worker)) is None or entry["metrics"].get("num_blocks_cached", 1) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"worker {worker} still reports cached blocks {timeout_s:.0f} s after the reset")
        time.sleep(0.1)


def clients(args: argparse.Namespace, api_key: str, cpu_pids: dict[str, int] | None = None):
    """Who connects to the server on args.port in a web run."""
    from django.conf import settings

    from bench.serving import clients as bench

    chats = bench.workload(args.clients + args.api_clients)
    url = f"http://127.0.0.1:{args.port}"
    return bench.Clients(f"ws://127.0.0.1:{args.port}/ws/chat/", url, chats[:args.clients], url, api_key,
                         settings.PLAYGROUND_ENGINE["model"], chats[args.clients:], cpu_pids or {})


def rounds(args: argparse.Namespace, service, who, finals: dict[str, Any] | None,
           empty_web_cache: Callable[[], None] | None = None) -> str:
    """args.rounds bare/web pairs, alternating which goes first; every delivered text checked, against the
    engine's own outputs by request id (`finals`) or, without them, the same round's bare texts. Every run
    starts with an empty prefix cache: the bare engine's, and before a web run `empty_web_cache`'s engine
    (the stack's worker; None: the web side serves from `service`'s engine)."""
    from django.conf import settings

    from bench.__main__ import machine
    from bench.serving import clients as bench
    from playground.serving.web import sampling

    engine = service.wait_ready(0)
    params = {**sampling.defaults(settings.PLAYGROUND_LIMITS), "temperature": 0.0, "max_tokens": args.max_tokens}
    bench.run_bare(service, [[{"role": "user", "content": "Hello!"}]], {**params, "max_tokens": 4})
    # A first web request warms the web path (and, distributed, the worker's engine) outside the measured runs.
    bench.run_web(bench.Clients(who.ws_url, who.origin, [[{"role": "user", "content": "Hello!"}]]),
                  {**params, "max_tokens": 4}, None)
    record: dict = {"machine": machine(), "config": {k: str(v) if isinstance(v, Path) else v
                                                     for k, v in vars(args).items()}, "rounds": []}
    reports = []
    for number in range(args.rounds):
        order = ("bare", "web") if number % 2 == 0 else ("web", "bare")
        runs: dict = {}
        for side in order:
            engine.reset_prefix_cache()  # every run starts cold: the same prompts must not hit the cache
            if side == "web" and empty_web_cache is not None:
                empty_web_cache()
            if side == "bare":
                runs["bare"] = bench.run_bare(service, who.ws_chats + who.api_chats, params)
            else:
                runs["web"], results = bench.run_web(who, params, finals)
        if finals is not None:
            wrong = bench.mismatched_texts(results, finals)
            checked = "equal the engine's"
            delays = {kind: bench.delivery_delays([r for r in results if r.kind == kind], finals, engine.tokenizer)
                      for kind in ("ws", "api")}
        else:
            wrong = bench.texts_unlike_bare(runs["bare"], runs["web"])
            checked = "equal the bare engine's"
            delays = {}
        if wrong:
            raise RuntimeError(f"{len(wrong)} of {len(results)} delivered texts do not {checked}")
        reports.append(bench.report(args.clients, args.api_clients, args.max_tokens, runs["bare"], runs["web"],
                                    delays, settings.PLAYGROUND_COALESCE_MS)
                       + f"\n\nround {number + 1}: all {len(results)} delivered texts {checked}")
        print(reports[-1], file=sys.stderr, flush=True)
        record["rounds"].append(bench.round_record(order, runs["bare"], runs["web"], delays))
        if args.out is not None:
            args.out.write_text(json.dumps(record, indent=1) + "\n")
    return "\n\n".join(reports)


if __name__ == "__main__":
    sys.exit(main())
