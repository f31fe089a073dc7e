"""`python manage.py web`: a web process of the distributed stack (daphne with the playground's websocket
settings, playground/serving/web/server.py). GPU workers run separately (`celery -A playground worker`)."""
from django.core.management.base import BaseCommand, CommandParser

from playground.serving.web import server


class Command(BaseCommand):
    help = "Serve the site and its websockets (no GPU worker in this process)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
        parser.add_argument("--proxy-headers", action="store_true",
                            help="trust X-Forwarded-For/-Port/-Proto (only behind a reverse proxy that sets them)")

    def handle(self, *args, host: str, port: int, proxy_headers: bool, **options) -> None:
        server.build(host, port, lambda: self.stdout.write(f"serving on {host}:{port}"), proxy_headers).run()
