"""Parsing of the environment variables that configure the project (kept apart so tests can call it)."""
import os
import secrets
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_bool(name: str, default: bool) -> bool:
    """Read a yes/no variable; anything unrecognised is an error rather than a silent default."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int | None, minimum: int | None = None) -> int | None:
    """Read an integer variable, optionally bounded below."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Read a comma-separated list, dropping blanks."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_lora_modules(name: str, base_model: str) -> dict[str, str]:
    """Read vLLM's --lora-modules as ``name=path,name=path``: adapter name -> PEFT folder, in order."""
    modules: dict[str, str] = {}
    for item in env_list(name, []):
        adapter, sep, path = (part.strip() for part in item.partition("="))
        if not sep or not adapter or not path:
            raise ImproperlyConfigured(f"{name}: {item!r} is not name=path")
        if adapter in modules or adapter == base_model:
            raise ImproperlyConfigured(f"{name}: the name {adapter!r} is taken (adapter names are unique and "
                                       "differ from the base model's)")
        modules[adapter] = path
    return modules


# SQLite as a web app's database: a write-ahead log (readers never wait for the writer, and a commit appends to
# the log instead of rewriting the file) synced at checkpoints, not at every commit. Every chat turn writes twice
# (its transcript, then its reply) on the one database thread, and each fsync'd commit held the turns behind it:
# 2.4 ms a write with the defaults, 1.4 ms with these (docs/performance-notes.md). A commit survives the process
# crashing; only a power cut or an OS crash can lose the last commits, never the file's consistency.
SQLITE_OPTIONS = {"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}


def _sqlite(name: str) -> dict:
    """A DATABASES entry for the SQLite file `name`, with its own copy of SQLITE_OPTIONS, its connections kept.

    Kept (CONN_MAX_AGE None) because a connection to a local file costs its opener ~1.5 ms of CPU (Django's
    functions registered, the PRAGMAs above run), as much again as a new chat's transcript write; a burst of 64
    chats paid it 64 times on the one database thread while their requests were on their way to the engine.
    Django's caution about persistent connections under ASGI is about connections to a server, opened by
    threads that end: here the database thread lives as long as the process, a request thread kept
    (playground/request_threads.py) keeps its connection, Django still closes an unusable one at each request's
    end, and a thread that ends closes its own with it."""
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": name, "OPTIONS": dict(SQLITE_OPTIONS),
            "CONN_MAX_AGE": None}


def database_from_url(url: str | None, default_sqlite_path: Path) -> dict:
    """Turn DATABASE_URL (``sqlite:///path`` or ``postgres://user:pass@host:port/name``) into a DATABASES entry."""
    if not url:
        return _sqlite(str(default_sqlite_path))
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        # sqlite:///relative.db -> "relative.db"; sqlite:////abs/path.db -> "/abs/path.db" (as dj-database-url)
        name = unquote(parts.path)[1:] or str(default_sqlite_path)
        return _sqlite(name)
    if parts.scheme in {"postgres", "postgresql", "pgsql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured("DATABASE_URL for postgres must name a database: postgres://host/NAME")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
        }
    raise ImproperlyConfigured(f"DATABASE_URL scheme {parts.scheme!r} is not supported (use sqlite or postgres)")


def secret_key_file(path: Path) -> str:
    """The secret key kept in `path`, created (random, readable by this user only) on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as key_file:
            key_file.write(secrets.token_urlsafe(50))
    return path.read_text().strip()
