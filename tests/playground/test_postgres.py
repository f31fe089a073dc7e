"""The compose setup's database: migrations and a chat turn's persistence on the real PostgreSQL at
127.0.0.1:5432, in a database made for this test and dropped after."""
import os
import subprocess
import sys
import uuid

import pytest
from live_stack import REPO

psycopg = pytest.importorskip("psycopg")
pytestmark = pytest.mark.slow
ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"

ROUND_TRIP = """
from playground.chat import store
c = store.open_conversation(None, "session-1", None, [{"role": "user", "content": "hello"}])
store.save_reply(c.id, "r1", {"outputs": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0},
                              "timing": {"ttft_ms": 1.0, "tokens_per_s": 1.0}}, "w@h")
print([m["content"] for m in store.conversation_detail(c)["messages"]])
"""


@pytest.fixture
def database():
    try:
        admin = psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432: {exc}")
    name = f"playground_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://postgres@127.0.0.1:5432/{name}"
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


def test_migrations_and_a_saved_turn_on_postgres(database):
    env = {**os.environ, "DATABASE_URL": database, "DJANGO_SETTINGS_MODULE": "playground.settings"}
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=REPO, env=env, check=True, timeout=300)
    out = subprocess.run([*manage, "shell", "-v", "0", "-c", ROUND_TRIP], cwd=REPO, env=env, check=True, timeout=120,
                         capture_output=True, text=True)  # fmt: skip
    assert out.stdout.strip() == "['hello', 'hi']"
