"""`python manage.py bench_ws`: delivery over websockets (and, with --api-clients, streaming API chats at the
same time) vs the bare engine on the embedded stack (see playground/serving/tools/bench.py). Checks that every
delivered text equals the engine's; prints a markdown table row for BENCHMARKS.md."""
import threading

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from playground.serving.tools import bench
from playground.serving import embedded
from playground.serving.web import sampling
from playground.serving.worker import runtime

LOAD_TIMEOUT_S = 600


class Command(BaseCommand):
    help = "Measure tokens/s and engine-to-client delay through websockets (and the API) against the bare engine."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--clients", type=int, default=32, help="websocket chat clients")
        parser.add_argument("--api-clients", type=int, default=0, help="streaming API chat clients, at the same time")
        parser.add_argument("--max-tokens", type=int, default=64)
        parser.add_argument("--port", type=int, default=8811)

    def handle(self, *args, clients: int, api_clients: int, max_tokens: int, port: int, **options) -> None:
        if clients < 0 or api_clients < 0 or clients + api_clients < 1 or max_tokens < 1:
            raise CommandError("give at least one client; --max-tokens must be at least 1")
        call_command("migrate", interactive=False, verbosity=0)
        # One benchmarking client opens every stream: per-user and per-address limits would refuse most. It
        # runs on this machine, so its API clients need no key (playground/accounts/access.py).
        settings.PLAYGROUND_USER_LIMITS = {**settings.PLAYGROUND_USER_LIMITS, "max_concurrent_requests": 0}
        settings.PLAYGROUND_ANONYMOUS_LIMITS = {key: 0 for key in settings.PLAYGROUND_ANONYMOUS_LIMITS}
        settings.PLAYGROUND_API_KEYLESS = True
        api_key = "EMPTY"  # the placeholder vLLM's clients send; a keyless API ignores it
        params = {**sampling.defaults(settings.PLAYGROUND_LIMITS), "temperature": 0.0, "max_tokens": max_tokens}
        outcome: dict = {}

        def measure() -> None:
            try:
                service = runtime.current().service
                engine = service.wait_ready(LOAD_TIMEOUT_S)
                chats = bench.workload(clients + api_clients)
                warm_up = [[{"role": "user", "content": "Hello!"}]]
                bench.run_bare(service, warm_up, {**params, "max_tokens": 4})
                engine.reset_prefix_cache()  # both runs start cold: the same prompts must not hit the cache
                bare = bench.run_bare(service, chats, params)
                engine.reset_prefix_cache()
                recorder = bench.FinalsRecorder(service)
                url = f"http://127.0.0.1:{port}"
                who = bench.Clients(f"ws://127.0.0.1:{port}/ws/chat/", url, chats[:clients], url, api_key,
                                    settings.PLAYGROUND_ENGINE["model"], chats[clients:])  # fmt: skip
                web, results = bench.run_web(who, params)
                wrong = bench.mismatched_texts(results, recorder.finals)
                if wrong:
                    raise RuntimeError(f"{len(wrong)} of {len(results)} delivered texts differ from the engine's")
                delays = {kind: bench.delivery_delays([r for r in results if r.kind == kind], recorder.finals,
                                                      engine.tokenizer) for kind in ("ws", "api")}  # fmt: skip
                outcome["report"] = bench.report(clients, api_clients, max_tokens, bare, web, delays,
                                                 settings.PLAYGROUND_COALESCE_MS)  # fmt: skip
                outcome["report"] += f"\n\nall {len(results)} delivered texts equal the engine's"
            except Exception as exc:
                outcome["error"] = exc
            finally:
                embedded.stop_serving()

        def ready() -> None:
            threading.Thread(target=measure, name="bench", daemon=True).start()

        embedded.serve("127.0.0.1", port, ready)
        if "error" in outcome:
            raise CommandError(f"benchmark failed: {outcome['error']!r}")
        if "report" not in outcome:
            raise CommandError("the server stopped before the benchmark finished")
        self.stdout.write(outcome["report"])
