"""The chat page gives every visitor the CSRF cookie its JSON writes send back as X-CSRFToken
(static/chat/conversations.js): an anonymous visitor's page renders no form with a token, so without the cookie
its first preset save, import, rename or delete would be refused with a 403."""
import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_an_anonymous_visitor_gets_the_csrf_cookie_and_may_save_a_preset():
    client = Client(enforce_csrf_checks=True)
    assert client.get("/").status_code == 200
    token = client.cookies["csrftoken"].value
    refused = client.post("/api/presets/", {"name": "Terse", "system_prompt": "", "params": {}},
                          content_type="application/json")
    saved = client.post("/api/presets/", {"name": "Terse", "system_prompt": "", "params": {}},
                        content_type="application/json", headers={"X-CSRFToken": token})
    assert refused.status_code == 403
    assert saved.status_code == 201 and saved.json()["name"] == "Terse"
