"""`python manage.py playground`: the whole playground in one process, nothing to install or start first.

Migrates the database, starts an in-process Celery GPU worker, and serves the site and its websockets with
daphne. With REDIS_URL set the same command uses Redis for the broker and channel layer, so more workers
(`celery -A playground worker -Q gpu`) can join it.
"""
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from playground.serving import embedded


class Command(BaseCommand):
    help = "Run the playground (web, websockets and one GPU worker) in one process."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
        parser.add_argument("--skip-migrate", action="store_true", help="do not apply database migrations first")

    def handle(self, *args, host: str, port: int, skip_migrate: bool, **options) -> None:
        if not skip_migrate:
            call_command("migrate", interactive=False, verbosity=0)
        shown_host = f"[{host}]" if ":" in host else host
        url = f"http://{shown_host}:{port}/"

        def ready() -> None:
            self.stdout.write(f"Paged Playground is running at {url}  (model loads in the background)")
            self.stdout.flush()

        embedded.serve(host, port, ready)
