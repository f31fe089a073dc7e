"""The access rules (playground/accounts/access.py) under both settings, and every page and socket following
the one "may use the playground" rule: when anonymous use is off, an anonymous visitor is refused by each."""
import asyncio

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User
from django.test import Client

from playground.accounts.access import is_loopback, is_staff, may_call_api_without_key, may_present, may_use_playground
from playground.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = (b"origin", b"http://127.0.0.1")


@pytest.mark.parametrize("allow_anonymous", [True, False])
def test_each_rule_for_each_kind_of_user(settings, allow_anonymous):
    settings.PLAYGROUND_ALLOW_ANONYMOUS = allow_anonymous
    anonymous = AnonymousUser()
    member = User.objects.create_user("member")
    staff = User.objects.create_user("staff", is_staff=True)
    gone = User.objects.create_user("gone", is_staff=True, is_active=False)
    assert [may_use_playground(u) for u in (None, anonymous, member, staff)] == [allow_anonymous] * 2 + [True] * 2
    assert [may_present(u) for u in (None, anonymous, member, staff)] == [allow_anonymous] * 3 + [True]
    assert [is_staff(u) for u in (None, anonymous, member, staff, gone)] == [False, False, False, True, False]


@pytest.mark.parametrize("address, local", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.2", False), ("203.0.113.9", False), ("::ffff:203.0.113.9", False), ("2001:db8::1", False),
    ("", False), ("localhost", False), ("not an address", False),
])
def test_only_loopback_addresses_count_as_this_machine(settings, address, local):
    assert is_loopback(address) is local
    settings.PLAYGROUND_API_KEYLESS = True
    assert may_call_api_without_key(address) is local
    settings.PLAYGROUND_API_KEYLESS = False
    assert not may_call_api_without_key(address)


@pytest.mark.parametrize("path", ["/", "/demo/", "/lab/"])
def test_pages_send_anonymous_visitors_to_log_in_when_anonymous_use_is_off(settings, path):
    settings.PLAYGROUND_ALLOW_ANONYMOUS = False
    response = Client().get(path)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    settings.PLAYGROUND_ALLOW_ANONYMOUS = True
    assert Client().get(path).status_code == 200


@pytest.mark.parametrize("path", ["/ws/chat/", "/ws/demo/", "/ws/lab/", "/ws/kv/"])
def test_sockets_refuse_anonymous_visitors_when_anonymous_use_is_off(settings, path):
    settings.PLAYGROUND_ALLOW_ANONYMOUS = False

    async def connect():
        socket = WebsocketCommunicator(application, path, headers=[ORIGIN])
        connected, code = await socket.connect(timeout=5)
        if connected:
            await socket.disconnect()
        return connected, code

    assert asyncio.run(connect()) == (False, 4401)
