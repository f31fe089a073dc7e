"""`python -m bench.serving`: delivery over websockets (and, with --api-clients, streaming API chats at the same
time) vs the bare engine on the embedded stack (the measuring itself is in `clients.py`). Checks that every
delivered text equals the engine's; prints a markdown table row.

It runs the whole site in this process (daphne, the in-process Celery worker, the in-memory channel layer), so
it sets Django up itself, as manage.py would, with the project's settings. With `--rounds`, bare and web runs
alternate which goes first (these machines drift within minutes); `--out` keeps every round's figures as JSON for
a bench/results record.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

LOAD_TIMEOUT_S = 600


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description="Tokens delivered through websockets "
                                     "and the streaming API against the bare engine, on the embedded stack.")
    parser.add_argument("--clients", type=int, default=32, help="websocket chat clients")
    parser.add_argument("--api-clients", type=int, default=0, help="streaming API chat clients, at the same time")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--port", type=int, default=8811)
    parser.add_argument("--rounds", type=int, default=1, help="bare/web pairs, alternating which runs first")
    parser.add_argument("--out", type=Path, metavar="JSON", help="every round's figures, rewritten after each")
    args = parser.parse_args(argv)
    if args.clients < 0 or args.api_clients < 0 or args.clients + args.api_clients < 1 or args.max_tokens < 1:
        parser.error("give at least one client; --max-tokens must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from bench.__main__ import machine
    from bench.serving import clients as bench
    from playground.accounts.models import ApiKey
    from playground.serving import embedded
    from playground.serving.web import sampling
    from playground.serving.worker import runtime

    call_command("migrate", interactive=False, verbosity=0)
    # One benchmarking client opens every stream: per-user and per-address limits would refuse most.
    settings.PLAYGROUND_USER_LIMITS = {**settings.PLAYGROUND_USER_LIMITS, "max_concurrent_requests": 0}
    settings.PLAYGROUND_ANONYMOUS_LIMITS = {key: 0 for key in settings.PLAYGROUND_ANONYMOUS_LIMITS}
    _, api_key = ApiKey.objects.issue(get_user_model().objects.get_or_create(username="bench_ws")[0], "bench")
    params = {**sampling.defaults(settings.PLAYGROUND_LIMITS), "temperature": 0.0, "max_tokens": args.max_tokens}
    outcome: dict = {}

    def measure() -> None:
        try:
            service = runtime.current().service
            engine = service.wait_ready(LOAD_TIMEOUT_S)
            chats = bench.workload(args.clients + args.api_clients)
            warm_up = [[{"role": "user", "content": "Hello!"}]]
            bench.run_bare(service, warm_up, {**params, "max_tokens": 4})
            recorder = bench.FinalsRecorder(service)
            url = f"http://127.0.0.1:{args.port}"
            who = bench.Clients(f"ws://127.0.0.1:{args.port}/ws/chat/", url, chats[:args.clients], url, api_key,
                                settings.PLAYGROUND_ENGINE["model"], chats[args.clients:])
            record: dict = {"machine": machine(), "config": {k: str(v) if isinstance(v, Path) else v
                                                             for k, v in vars(args).items()}, "rounds": []}
            reports = []
            for number in range(args.rounds):
                order = ("bare", "web") if number % 2 == 0 else ("web", "bare")
                runs: dict = {}
                for side in order:
                    engine.reset_prefix_cache()  # every run starts cold: the same prompts must not hit the cache
                    if side == "bare":
                        runs["bare"] = bench.run_bare(service, chats, params)
                        continue
                    runs["web"], results = bench.run_web(who, params, recorder.finals)
                    wrong = bench.mismatched_texts(results, recorder.finals)
                    if wrong:
                        raise RuntimeError(f"{len(wrong)} of {len(results)} delivered texts differ from the engine's")
                    delays = {kind: bench.delivery_delays([r for r in results if r.kind == kind], recorder.finals,
                                                          engine.tokenizer) for kind in ("ws", "api")}
                reports.append(bench.report(args.clients, args.api_clients, args.max_tokens, runs["bare"],
                                            runs["web"], delays, settings.PLAYGROUND_COALESCE_MS)
                               + f"\n\nround {number + 1}: all {len(results)} delivered texts equal the engine's")
                print(reports[-1], file=sys.stderr, flush=True)
                record["rounds"].append(bench.round_record(order, runs["bare"], runs["web"], delays))
                if args.out is not None:
                    args.out.write_text(json.dumps(record, indent=1) + "\n")
            outcome["report"] = "\n\n".join(reports)
        except Exception as exc:
            outcome["error"] = exc
        finally:
            embedded.stop_serving()

    def ready() -> None:
        threading.Thread(target=measure, name="bench", daemon=True).start()

    embedded.serve("127.0.0.1", args.port, ready)
    if "error" in outcome:
        print(f"benchmark failed: {outcome['error']!r}", file=sys.stderr)
        return 1
    if "report" not in outcome:
        print("the server stopped before the benchmark finished", file=sys.stderr)
        return 1
    print(outcome["report"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
