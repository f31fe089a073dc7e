"""The compose setup's database: migrations and a chat turn's persistence on the real PostgreSQL at
127.0.0.1:5432 (bin/setup --test provides one), in a database made for this test and dropped after.

Where no PostgreSQL answers the test skips, except under CI=true (.ci/run), where it fails.
`TEST_POSTGRES_DSN` points it at another server (libpq key=value form, user with CREATE DATABASE rights)."""
import os
import subprocess
import sys
import uuid

import pytest
from live_stack import REPO

pytestmark = pytest.mark.slow
ADMIN_DSN = os.environ.get("TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test")
IN_CI = os.environ.get("CI") == "true"

try:
    import psycopg
except ImportError:
    if IN_CI:
        raise
    pytest.skip("psycopg is not installed", allow_module_level=True)

ROUND_TRIP = """
from playground.chat import store
c = store.open_conversation(None, "session-1", None, [{"role": "user", "content": "hello"}])
store.save_reply(c.id, "r1", {"outputs": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0},
                              "timing": {"ttft_ms": 1.0, "tokens_per_s": 1.0}}, "w@h")
c.refresh_from_db()  # save_reply moved the shown branch's leaf to the reply
print([m["content"] for m in store.conversation_detail(c)["messages"]])
"""

# The conversation list's queries on PostgreSQL: search with DISTINCT over a join, the keyset cursor over
# (pinned, updated_at, uuid), and an export->import round trip of a branched tree.
LIST_SEARCH_IMPORT = """
from playground.chat import store, transfer
from playground.chat.listing import list_page
from playground.chat.models import Conversation
done = {"outputs": [{"index": 0, "text": "a kiwi", "finish_reason": "stop"}]}
for i in range(7):
    c = store.open_conversation(None, "s", None, [{"role": "user", "content": f"q{i}"}])
    store.save_reply(c.id, "r", done, "w")
    store.open_conversation(None, "s", c.id, [{"role": "user", "content": f"q{i}"}])
    store.save_reply(c.id, "r", {"outputs": [{"index": 0, "text": "Kiwis", "finish_reason": "stop"}]}, "w")
store.update_conversation(c, {"pinned": True})
owned = Conversation.objects.owned_by(None, "s")
ids, cursor = [], None
while True:
    page = list_page(owned, "KIWI", cursor, size=3)
    ids += [x.id for x in page.conversations]
    cursor = page.next_cursor
    if cursor is None:
        break
expected = list(owned.order_by("-pinned", "-updated_at", "-id").values_list("id", flat=True))
(copy,) = transfer.import_conversations(transfer.export_json([c]), None, "t")
tree = lambda x: sorted((m.role, m.content, m.position) for m in x.messages.all())
print(ids == expected, ids[0] == c.id, len(ids), tree(copy) == tree(c), copy.messages.count())
"""


@pytest.fixture
def database():
    try:
        admin = psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        message = f"no PostgreSQL at {ADMIN_DSN!r} (bin/setup --test starts one): {exc}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    name = f"playground_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://{admin.info.user}@{admin.info.host}:{admin.info.port}/{name}"
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


def test_migrations_and_a_saved_turn_on_postgres(database):
    env = {**os.environ, "DATABASE_URL": database, "DJANGO_SETTINGS_MODULE": "playground.settings"}
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=REPO, env=env, check=True, timeout=300)
    out = subprocess.run([*manage, "shell", "-v", "0", "-c", ROUND_TRIP], cwd=REPO, env=env, check=True, timeout=120,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "['hello', 'hi']"


def test_conversation_search_paging_and_import_on_postgres(database):
    env = {**os.environ, "DATABASE_URL": database, "DJANGO_SETTINGS_MODULE": "playground.settings"}
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=REPO, env=env, check=True, timeout=300)
    out = subprocess.run([*manage, "shell", "-v", "0", "-c", LIST_SEARCH_IMPORT], cwd=REPO, env=env, check=True,
                         timeout=120, capture_output=True, text=True)
    assert out.stdout.strip() == "True True 7 True 3"
