"""Presets: a name for a system prompt, sampling settings and model choice that its owner applies to the chat page.

A preset's settings are checked by what checks a generate frame's: the sampling table
(`sampling.validate_sampling`, over the playground's defaults) and the served models (`models.adapter_for`), so a
preset holds nothing the socket would refuse at the time it is saved, and the ranges live in one place. What is
stored is the complete validated settings (every field of the table), so applying a preset sets every control.
Its owner is whoever owns conversations (store.owner_fields, `Preset.objects.owned_by`).
"""
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from playground.serving.web import sampling
from playground.serving.web.edge import InvalidInput
from playground.serving.web.models import UnknownModel, adapter_for

from .models import PRESET_NAME_MAX_CHARS, Preset
from .store import one_line, owner_fields

MAX_PRESETS = 50  # per owner: a picker, not a library; the 51st is refused until one is deleted
FIELDS = ("name", "system_prompt", "params", "model")


def create_preset(user, session_key: str, body: dict[str, Any]) -> Preset:
    """A new preset of this caller from a POST body (`name` required; `system_prompt`, `params`, `model`
    optional). Raises InvalidInput naming the field at fault; nothing is stored then."""
    if "name" not in body:
        raise InvalidInput("name: required")
    fields = _checked(body)
    owned = Preset.objects.owned_by(user, session_key)
    if owned.count() >= MAX_PRESETS:
        raise InvalidInput(f"presets: you have {MAX_PRESETS}, the most kept; delete one to save another")
    _refuse_taken(owned, fields["name"])
    fields.setdefault("params", _params(None))  # no settings sent: the defaults
    preset = Preset(**owner_fields(user, session_key), **fields)
    _save(preset, fields["name"])
    return preset


def update_preset(preset: Preset, body: dict[str, Any]) -> None:
    """Rename and/or overwrite a preset from a PATCH body (any of its fields; `params` replaces the stored
    settings as a whole, fields left out taking their defaults). Raises InvalidInput naming the field."""
    if not body:
        raise InvalidInput(f"{', '.join(FIELDS)}: nothing to change")
    fields = _checked(body)
    if "name" in fields:
        owned = Preset.objects.owned_by(preset.user, preset.session_key).exclude(id=preset.id)
        _refuse_taken(owned, fields["name"])
    for name, value in fields.items():
        setattr(preset, name, value)
    _save(preset, preset.name)


def preset_dict(preset: Preset) -> dict[str, Any]:
    """The JSON shape of a preset (docs/protocol.md)."""
    return {"id": str(preset.id), "name": preset.name, "system_prompt": preset.system_prompt,
            "params": preset.params, "model": preset.model or None, "updated_at": preset.updated_at.isoformat()}


def _checked(body: dict[str, Any]) -> dict[str, Any]:
    """The body's fields, checked and normalised for storage."""
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidInput(f"{unknown[0]}: unknown field (a preset has {', '.join(FIELDS)})")
    fields = {}
    if "name" in body:
        fields["name"] = one_line(body["name"], "name", PRESET_NAME_MAX_CHARS)
    if "system_prompt" in body:
        fields["system_prompt"] = _system_prompt(body["system_prompt"])
    if "params" in body:
        fields["params"] = _params(body["params"])
    if "model" in body:
        fields["model"] = _model(body["model"])
    return fields


def _system_prompt(value: Any) -> str:
    most = settings.PLAYGROUND_LIMITS["max_message_chars"]
    if not isinstance(value, str):
        raise InvalidInput("system_prompt: must be a string")
    if len(value) > most:
        raise InvalidInput(f"system_prompt: at most {most} characters (this one has {len(value)})")
    return value


def _params(value: Any) -> dict[str, Any]:
    """Every sampling field: the sent ones checked by the one table, the rest its defaults."""
    limits = settings.PLAYGROUND_LIMITS
    return sampling.validate_sampling(value, sampling.defaults(limits), limits)


def _model(value: Any) -> str:
    """A served model's name ('' for none: the page's current choice stays when the preset is applied)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInput("model: must be a string or null")
    try:
        adapter_for(value)
    except UnknownModel as exc:
        raise InvalidInput(f"model: {exc}") from None
    return value


def _refuse_taken(owned, name: str) -> None:
    if owned.filter(name=name).exists():
        raise InvalidInput(f"name: you already have a preset named {name!r}")


def _save(preset: Preset, name: str) -> None:
    """Save; a name taken by a concurrent request (the unique constraint) is the same 400 as one taken before."""
    try:
        with transaction.atomic():
            preset.save()
    except IntegrityError:
        raise InvalidInput(f"name: you already have a preset named {name!r}") from None
