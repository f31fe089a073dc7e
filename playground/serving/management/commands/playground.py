"""`python manage.py playground`: the whole playground in one process, nothing to install or start first.

Migrates the database, starts an in-process Celery GPU worker, and serves the site and its websockets with
daphne. With REDIS_URL set the same command uses Redis for the broker and channel layer, so more workers
(`celery -A playground worker -Q gpu`) can join it.
"""
from daphne.endpoints import build_endpoint_description_strings
from daphne.server import Server, twisted_loop
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from playground.serving.embedded import EmbeddedWorker


class Command(BaseCommand):
    help = "Run the playground (web, websockets and one GPU worker) in one process."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
        parser.add_argument("--skip-migrate", action="store_true", help="do not apply database migrations first")

    def handle(self, *args, host: str, port: int, skip_migrate: bool, **options) -> None:
        if not skip_migrate:
            call_command("migrate", interactive=False, verbosity=0)
        from playground.asgi import application

        worker = EmbeddedWorker(twisted_loop)
        shown_host = f"[{host}]" if ":" in host else host
        url = f"http://{shown_host}:{port}/"

        def ready() -> None:
            self.stdout.write(f"Paged Playground is running at {url}  (model loads in the background)", ending="\n")
            self.stdout.flush()

        server = Server(
            application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            ready_callable=ready,
            websocket_max_message_size=settings.PLAYGROUND_LIMITS["max_frame_bytes"] * 2,
            verbosity=0,
        )
        worker.start()
        try:
            server.run()
        finally:
            worker.stop()
