"""API keys: the management command, admin, the user's settings page (CSRF-protected), and lookup rules."""
import re

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from playground.accounts.models import ApiKey

pytestmark = pytest.mark.django_db


def test_create_api_key_prints_a_key_and_creates_the_user(capsys):
    call_command("create_api_key", "carol", "--name", "laptop")
    secret = capsys.readouterr().out.strip()
    assert secret.startswith("pp-") and len(secret) > 40
    key = ApiKey.objects.active_for(secret)
    assert key.user.username == "carol" and key.name == "laptop" and not key.user.has_usable_password()
    assert secret not in {key.key_hash, key.prefix} and secret.startswith(key.prefix)
    call_command("create_api_key", "carol")  # an existing user gets another key
    assert ApiKey.objects.filter(user__username="carol").count() == 2


def test_revoked_keys_and_inactive_users_do_not_authenticate():
    user = User.objects.create_user("dave")
    key, secret = ApiKey.objects.issue(user)
    assert ApiKey.objects.active_for(secret) == key
    assert ApiKey.objects.active_for(secret + "x") is None
    key.revoked = True
    key.save()
    assert ApiKey.objects.active_for(secret) is None
    _, other = ApiKey.objects.issue(user)
    user.is_active = False
    user.save()
    assert ApiKey.objects.active_for(other) is None


def test_admin_add_shows_the_new_secret_once():
    admin = User.objects.create_superuser("root", "root@example.com", "pw-for-tests-only")
    user = User.objects.create_user("erin")
    client = Client()
    client.force_login(admin)
    response = client.post("/admin/accounts/apikey/add/", {"user": user.pk, "name": "ci"}, follow=True)
    assert response.status_code == 200
    shown = re.search(r"New API key for erin: (pp-[A-Za-z0-9_-]+)", response.content.decode()).group(1)
    assert ApiKey.objects.active_for(shown).user == user


def test_settings_page_creates_and_revokes_keys():
    user = User.objects.create_user("fay", password="pw-for-tests-only")
    client = Client()
    assert client.get("/account/settings/").status_code == 302  # login required
    client.force_login(user)
    page = client.post("/account/settings/", {"action": "create", "name": "<b>mine</b>"})
    secret = re.search(r'id="new-key">(pp-[^<]+)<', page.content.decode()).group(1)
    key = ApiKey.objects.active_for(secret)
    assert key.user == user and key.name == "<b>mine</b>"
    listing = client.get("/account/settings/").content.decode()
    assert "&lt;b&gt;mine&lt;/b&gt;" in listing and "<b>mine</b>" not in listing  # names are escaped
    assert secret not in listing  # shown once only
    client.post("/account/settings/", {"action": "revoke", "key_id": str(key.pk)})
    assert ApiKey.objects.active_for(secret) is None
    other = User.objects.create_user("gus")
    _, theirs = ApiKey.objects.issue(other)
    client.post("/account/settings/", {"action": "revoke", "key_id": str(ApiKey.objects.get(user=other).pk)})
    assert ApiKey.objects.active_for(theirs) is not None  # nobody revokes someone else's key


def test_settings_form_needs_the_csrf_token():
    user = User.objects.create_user("hal")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post("/account/settings/", {"action": "create"}).status_code == 403
    page = client.get("/account/settings/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    assert client.post("/account/settings/", {"action": "create", "csrfmiddlewaretoken": token}).status_code == 200
    assert ApiKey.objects.filter(user=user).count() == 1

