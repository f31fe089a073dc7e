"""`python manage.py bench_ws`: websocket delivery vs the bare engine on the embedded stack (see
playground/serving/bench.py). Prints a markdown table row for BENCHMARKS.md."""
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
    help = "Measure tokens/s and engine-to-client delay through websockets against the bare engine."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--clients", type=int, default=32)
        parser.add_argument("--max-tokens", type=int, default=64)
        parser.add_argument("--port", type=int, default=8811)

    def handle(self, *args, clients: int, max_tokens: int, port: int, **options) -> None:
        if clients < 1 or max_tokens < 1:
            raise CommandError("--clients and --max-tokens must be at least 1")
        call_command("migrate", interactive=False, verbosity=0)
        params = {**sampling.defaults(settings.PLAYGROUND_LIMITS), "temperature": 0.0, "max_tokens": max_tokens}
        outcome: dict = {}

        def measure() -> None:
            try:
                service = runtime.current().service
                engine = service.wait_ready(LOAD_TIMEOUT_S)
                chats = bench.workload(clients)
                warm_up = [[{"role": "user", "content": "Hello!"}]]
                bench.run_bare(service, warm_up, {**params, "max_tokens": 4})
                engine.reset_prefix_cache()  # both runs start cold: the same prompts must not hit the cache
                bare = bench.run_bare(service, chats, params)
                engine.reset_prefix_cache()
                recorder = bench.FinalsRecorder(service)
                url = f"http://127.0.0.1:{port}"
                web, results = bench.run_web(f"ws://127.0.0.1:{port}/ws/chat/", url, chats, params)
                delays = bench.delivery_delays(results, recorder.finals, engine.tokenizer)
                outcome["report"] = bench.report(
                    clients, max_tokens, bare, web, delays, settings.PLAYGROUND_COALESCE_MS
                )
            except Exception as exc:
                outcome["error"] = exc
            finally:
                embedded.stop_serving()

        def ready() -> None:
            threading.Thread(target=measure, name="bench", daemon=True).start()

        embedded.serve("127.0.0.1", port, ready)
        if "error" in outcome:
            raise CommandError(f"benchmark failed: {outcome['error']!r}")
        self.stdout.write(outcome["report"])
