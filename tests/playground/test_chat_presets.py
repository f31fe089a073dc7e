"""Presets (playground/chat/presets.py, preset_views.py): saved, listed, renamed, overwritten and deleted by their
owner only (a signed-in user, or an anonymous session, as conversations are owned); their settings checked by the
one sampling table and the served models, every refusal a 400 naming the field and storing nothing."""
import json
import uuid

import pytest
from django.test import Client

from playground.chat import presets
from playground.chat.models import Preset
from playground.serving.web import sampling

pytestmark = pytest.mark.django_db

LIST = "/api/presets/"
TERSE = {"name": "Terse", "system_prompt": "Answer in one line.", "params": {"temperature": 0.2, "stop": ["END"]}}


def url(preset_id) -> str:
    return f"{LIST}{preset_id}/"


def post(client, body, path=LIST):
    return client.post(path, json.dumps(body), content_type="application/json")


def patch(client, preset_id, body):
    return client.patch(url(preset_id), json.dumps(body), content_type="application/json")


def defaults(settings) -> dict:
    """Every sampling field's playground default, from the table (what a preset holds for a field not sent)."""
    return sampling.defaults(settings.PLAYGROUND_LIMITS)


@pytest.fixture
def terse(ada):
    response = post(ada, TERSE)
    assert response.status_code == 201, response.content
    return response.json()


def test_a_saved_preset_holds_every_sampling_field_and_is_listed_by_name(ada, terse, settings):
    assert terse["name"] == "Terse" and terse["system_prompt"] == "Answer in one line."
    # the fields not sent take the table's defaults, as a generate frame's would
    assert terse["params"] == {**defaults(settings), "temperature": 0.2, "stop": ["END"]}
    assert terse["model"] is None
    assert post(ada, {"name": "  alpha\n preset "}).status_code == 201
    listed = ada.get(LIST).json()
    assert [p["name"] for p in listed["presets"]] == ["alpha preset", "Terse"]  # by name, whatever the case
    assert listed["presets"][1] == terse and listed["max_presets"] == presets.MAX_PRESETS
    assert ada.get(url(terse["id"])).json() == terse
    stored = Preset.objects.get(id=terse["id"])
    assert stored.user == ada.account and stored.session_key == ""


@pytest.mark.parametrize("body, error", [
    ({"name": "x", "params": {"temperature": 3}}, "params.temperature must be in [0.0, 2.0], got 3"),
    ({"name": "x", "params": {"top_p": 0}}, "params.top_p must be in (0.0, 1.0]"),
    ({"name": "x", "params": {"top_k": 1.5}}, "params.top_k must be an integer"),
    ({"name": "x", "params": {"seed": -1}}, "params.seed must be in"),
    ({"name": "x", "params": {"stop": [""]}}, "params.stop sequences must have 1 to"),
    ({"name": "x", "params": {"best_of": 2}}, "unknown field(s) in params: best_of"),
    ({"name": "x", "params": "hot"}, "params must be an object"),
    ({"name": "x", "colour": "red"}, "colour: unknown field"),
    ({"system_prompt": "hi"}, "name: required"),
    ({"name": "   "}, "name: must not be empty"),
    ({"name": "x" * 81}, "name: at most 80 characters"),
    ({"name": 5}, "name: must be a string"),
    ({"name": "x", "system_prompt": ["hi"]}, "system_prompt: must be a string"),
    ({"name": "x", "model": "no-such-model"}, "model: the model 'no-such-model' does not exist"),
    ({"name": "x", "model": 3}, "model: must be a string or null"),
])
def test_a_bad_preset_is_refused_by_field_and_nothing_is_stored(ada, terse, body, error):
    response = post(ada, body)
    assert response.status_code == 400 and response.json()["error"].startswith(error), response.content
    if error != "name: required":  # an update with the same field is refused the same way; the preset stays
        response = patch(ada, terse["id"], body)
        assert response.status_code == 400 and response.json()["error"].startswith(error), response.content
    assert Preset.objects.count() == 1
    assert ada.get(url(terse["id"])).json() == terse


def test_caps_come_from_the_server_limits_not_from_a_copy(ada, settings):
    settings.PLAYGROUND_LIMITS = {**settings.PLAYGROUND_LIMITS, "max_tokens": 64, "max_message_chars": 10}
    response = post(ada, {"name": "long", "params": {"max_tokens": 65}})
    assert response.status_code == 400 and response.json()["error"] == "params.max_tokens must be in [1, 64], got 65"
    response = post(ada, {"name": "long", "system_prompt": "x" * 11})
    assert response.json()["error"] == "system_prompt: at most 10 characters (this one has 11)"
    assert post(ada, {"name": "long", "system_prompt": "x" * 10, "params": {"max_tokens": 64}}).status_code == 201


def test_bodies_that_are_not_json_objects_or_too_large_are_refused(ada, terse, settings):
    assert ada.post(LIST, "not json", content_type="application/json").status_code == 400
    assert post(ada, ["Terse"]).status_code == 400
    big = {"name": "big", "system_prompt": "x" * (settings.PLAYGROUND_LIMITS["max_frame_bytes"] + 1)}
    assert post(ada, big).status_code == 413
    assert patch(ada, terse["id"], {}).json()["error"].startswith("name, system_prompt, params, model: nothing")
    assert Preset.objects.count() == 1


def test_names_are_unique_per_owner(ada, terse, mallory):
    response = post(ada, {**TERSE, "name": " Terse  "})
    assert response.status_code == 400
    assert response.json()["error"] == "name: you already have a preset named 'Terse'"
    other = post(ada, {"name": "Other"}).json()
    response = patch(ada, other["id"], {"name": "Terse"})
    assert response.status_code == 400 and response.json()["error"] == "name: you already have a preset named 'Terse'"
    assert patch(ada, terse["id"], {"name": "Terse"}).status_code == 200  # its own name is not taken
    assert post(mallory, TERSE).status_code == 201  # another owner's names are theirs
    assert sorted(Preset.objects.values_list("name", flat=True)) == ["Other", "Terse", "Terse"]


def test_rename_and_overwrite(ada, terse, settings):
    renamed = patch(ada, terse["id"], {"name": "Short answers"}).json()
    assert renamed["name"] == "Short answers" and renamed["params"] == terse["params"]
    # an overwrite replaces the settings as a whole: the fields left out go back to their defaults
    overwritten = patch(ada, terse["id"], {"system_prompt": "", "params": {"top_k": 5}}).json()
    assert overwritten["params"] == {**defaults(settings), "top_k": 5}
    assert overwritten["system_prompt"] == "" and overwritten["name"] == "Short answers"
    assert ada.get(LIST).json()["presets"] == [overwritten]


def test_a_preset_keeps_a_served_model_or_adapter(ada, settings):
    settings.PLAYGROUND_LORA_MODULES = {"sql-lora": "/adapters/sql"}
    made = post(ada, {"name": "SQL", "model": "sql-lora"}).json()
    assert made["model"] == "sql-lora"
    base = settings.PLAYGROUND_ENGINE["model"]
    assert patch(ada, made["id"], {"model": base}).json()["model"] == base
    assert patch(ada, made["id"], {"model": None}).json()["model"] is None


def test_every_action_on_someone_elses_preset_is_not_found(ada, terse, mallory):
    assert mallory.get(url(terse["id"])).status_code == 404
    assert patch(mallory, terse["id"], {"name": "mine"}).status_code == 404
    assert patch(mallory, terse["id"], {"params": {"temperature": 9}}).status_code == 404  # 404 before the 400
    assert mallory.delete(url(terse["id"])).status_code == 404
    assert mallory.get(LIST).json()["presets"] == []
    assert ada.get(url(terse["id"])).json() == terse
    assert ada.get(url(uuid.uuid4())).status_code == 404
    assert ada.delete(url(terse["id"])).status_code == 204
    assert ada.get(url(terse["id"])).status_code == 404 and not Preset.objects.exists()


def test_anonymous_presets_belong_to_their_session(ada):
    visitor = Client()
    made = post(visitor, {"name": "Mine", "params": {"n": 2}})  # the first request gets the session
    assert made.status_code == 201
    preset = Preset.objects.get(id=made.json()["id"])
    assert preset.user is None and preset.session_key == visitor.session.session_key
    assert [p["id"] for p in visitor.get(LIST).json()["presets"]] == [str(preset.id)]
    assert patch(visitor, preset.id, {"name": "Still mine"}).status_code == 200

    stranger = Client()
    stranger.get("/")
    for response in (stranger.get(url(preset.id)), patch(stranger, preset.id, {"name": "x"}),
                     stranger.delete(url(preset.id)), ada.get(url(preset.id)), ada.delete(url(preset.id))):
        assert response.status_code == 404
    assert stranger.get(LIST).json()["presets"] == [] and ada.get(LIST).json()["presets"] == []
    assert post(stranger, {"name": "Still mine"}).status_code == 201  # names are per session too
    assert visitor.delete(url(preset.id)).status_code == 204


def test_anonymous_visitors_are_refused_when_anonymous_use_is_off(client, settings):
    settings.PLAYGROUND_ALLOW_ANONYMOUS = False
    assert client.get(LIST).status_code == 401
    assert post(client, TERSE).status_code == 401
    assert not Preset.objects.exists()


def test_an_owner_keeps_at_most_max_presets(ada, mallory, monkeypatch):
    monkeypatch.setattr(presets, "MAX_PRESETS", 3)
    made = [post(ada, {"name": f"p{i}"}).json() for i in range(3)]
    response = post(ada, {"name": "p3"})
    assert response.status_code == 400 and response.json()["error"].startswith("presets: you have 3, the most kept")
    assert post(mallory, {"name": "p3"}).status_code == 201  # the cap is per owner
    assert ada.delete(url(made[0]["id"])).status_code == 204
    assert post(ada, {"name": "p3"}).status_code == 201
    assert Preset.objects.filter(user=ada.account).count() == 3


def test_the_chat_page_links_the_presets_endpoint(client):
    assert client.get("/").context["chat_config"]["urls"]["presets"] == LIST
