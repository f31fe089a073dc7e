"""Settings from the environment: database URLs, booleans, DEBUG off by default, where the secret key comes from."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.sqlite3.base import DatabaseWrapper

from playground.envconfig import database_from_url, env_bool, env_int

REPO = Path(__file__).resolve().parents[2]


def test_default_database_is_sqlite(tmp_path):
    database = database_from_url(None, tmp_path / "x.db")
    assert (database["ENGINE"], database["NAME"]) == ("django.db.backends.sqlite3", str(tmp_path / "x.db"))
    assert database["CONN_MAX_AGE"] is None  # a local file's connections are kept (envconfig._sqlite says why)


@pytest.mark.parametrize("url", [None, "sqlite:///{path}"])
def test_sqlite_connections_use_a_write_ahead_log_synced_at_checkpoints(tmp_path, url, django_db_blocker):
    """Every connection to the SQLite file: WAL journal, synchronous NORMAL (1), not the fsync-per-commit defaults."""
    path = tmp_path / "x.db"
    settings = database_from_url(url and url.format(path=path), path)
    connection = DatabaseWrapper({**settings, "TIME_ZONE": None, "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": False,
                                  "AUTOCOMMIT": True, "ATOMIC_REQUESTS": False}, alias="envconfig_test")
    try:
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            assert cursor.fetchone() == ("wal",)
            cursor.execute("PRAGMA synchronous")
            assert cursor.fetchone() == (1,)
    finally:
        connection.close()
    assert path.exists()


def test_sqlite_urls():
    assert database_from_url("sqlite:////abs/path.db", Path("d"))["NAME"] == "/abs/path.db"
    assert database_from_url("sqlite:///rel.db", Path("d"))["NAME"] == "rel.db"


def test_postgres_url():
    db = database_from_url("postgres://bob:p%40ss@db.example:5433/play", Path("unused"))
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == (
        "play", "bob", "p@ss", "db.example", "5433",
    )
    assert "CONN_MAX_AGE" not in db  # Django's 0: a server's connections end with each request (Django's ASGI advice)


@pytest.mark.parametrize("url", ["mysql://x/y", "postgres://host/"])
def test_bad_database_urls(url):
    with pytest.raises(ImproperlyConfigured):
        database_from_url(url, Path("unused"))


def test_env_bool_and_int(monkeypatch):
    monkeypatch.setenv("PG_TEST_FLAG", "off")
    assert env_bool("PG_TEST_FLAG", True) is False
    monkeypatch.setenv("PG_TEST_FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="PG_TEST_FLAG"):
        env_bool("PG_TEST_FLAG", True)
    monkeypatch.setenv("PG_TEST_INT", "0")
    with pytest.raises(ImproperlyConfigured, match="at least 1"):
        env_int("PG_TEST_INT", 5, minimum=1)
    monkeypatch.delenv("PG_TEST_INT")
    assert env_int("PG_TEST_INT", 5) == 5


def test_debug_is_off_by_default_and_the_secret_key_comes_from_the_environment_or_var(tmp_path):
    def settings_of(**env: str) -> subprocess.CompletedProcess:
        environ = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG", "REDIS_URL"}}
        code = "import playground.settings as s; print(s.DEBUG, s.SECRET_KEY)"
        return subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**environ, **env}, capture_output=True,
                              text=True, timeout=60)

    var = str(tmp_path / "var")
    first = settings_of(PLAYGROUND_VAR_DIR=var).stdout.split()
    assert first[0] == "False" and len(first[1]) >= 50  # a random key, not a public development one
    assert settings_of(PLAYGROUND_VAR_DIR=var).stdout.split() == first  # kept across restarts
    assert oct((tmp_path / "var" / "secret_key").stat().st_mode)[-3:] == "600"
    assert settings_of(PLAYGROUND_VAR_DIR=var, DEBUG="1").stdout.split()[0] == "True"
    assert settings_of(SECRET_KEY="a-real-secret").stdout.split() == ["False", "a-real-secret"]
    distributed = settings_of(REDIS_URL="redis://127.0.0.1:6379/0")
    assert distributed.returncode != 0 and "set SECRET_KEY" in distributed.stderr


def test_anonymous_use_and_the_keyless_api_default_on_only_for_the_one_process_mode():
    def defaults(**env: str) -> tuple[str, ...]:
        code = "import playground.settings as s; print(s.PLAYGROUND_ALLOW_ANONYMOUS, s.PLAYGROUND_API_KEYLESS)"
        names = {"REDIS_URL", "PLAYGROUND_ALLOW_ANONYMOUS", "PLAYGROUND_API_KEYLESS"}
        environ = {k: v for k, v in os.environ.items() if k not in names}
        env = {"SECRET_KEY": "test-only", **env}
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**environ, **env}, capture_output=True,
                             text=True, timeout=60, check=True)
        return tuple(out.stdout.split())

    redis = "redis://127.0.0.1:6379/0"
    assert defaults() == ("True", "True")
    assert defaults(REDIS_URL=redis) == ("False", "False")
    assert defaults(REDIS_URL=redis, PLAYGROUND_ALLOW_ANONYMOUS="1") == ("True", "False")  # the API still wants keys
    assert defaults(PLAYGROUND_ALLOW_ANONYMOUS="0") == ("False", "False")
    assert defaults(PLAYGROUND_API_KEYLESS="0") == ("True", "False")
