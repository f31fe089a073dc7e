"""ApiKey's move from the api app to accounts (migrations api/0002 and accounts/0002) keeps a database's
keys: a key stored before the move still authenticates after it, in the same table, with its admin content
type (and so its permissions) carried over; and the move can be undone."""
import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from playground.accounts.models import ApiKey, hash_key

pytestmark = pytest.mark.django_db(transaction=True)
BEFORE = [("api", "0001_initial"), ("accounts", "0001_initial")]
SECRET = "pp-a-key-issued-before-the-move"


def migrate(targets: list[tuple[str, str]]):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def test_a_key_stored_before_the_move_authenticates_after_it():
    old = migrate(BEFORE)  # the other apps' tables (users, content types) are untouched by the move
    try:
        user = User.objects.create(username="olive")
        stored = old.get_model("api", "ApiKey").objects.create(user_id=user.pk, name="laptop", prefix=SECRET[:9],
                                                                key_hash=hash_key(SECRET))
        ContentType.objects.filter(app_label="accounts", model="apikey").delete()
        content_type = ContentType.objects.get_or_create(app_label="api", model="apikey")[0]
        permission = Permission.objects.create(name="Can view API key", content_type=content_type,
                                               codename="view_apikey_before")
    finally:
        migrate(latest())

    key = ApiKey.objects.active_for(SECRET)
    assert key is not None and (key.pk, key.user.username, key.name) == (stored.pk, "olive", "laptop")
    assert ApiKey._meta.db_table == "api_apikey"  # the same table: no copy, no rename
    ContentType.objects.clear_cache()
    moved = ContentType.objects.get(pk=content_type.pk)
    assert (moved.app_label, moved.model) == ("accounts", "apikey")
    assert Permission.objects.get(pk=permission.pk).content_type == moved

    back = migrate(BEFORE)  # and undone: the api app has its model, its rows and its content type again
    try:
        assert back.get_model("api", "ApiKey").objects.get(pk=stored.pk).key_hash == hash_key(SECRET)
        assert ContentType.objects.get(pk=content_type.pk).app_label == "api"
    finally:
        migrate(latest())
