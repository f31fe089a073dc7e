"""Web-process side of serving (daphne): never imports torch; talks to workers only through Celery and the
channel layer. `lifecycle` is the one request lifecycle every front door uses."""
