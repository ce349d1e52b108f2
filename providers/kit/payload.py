"""Reading a platform's JSON defensively: a value of the wrong type reads as empty, never as
a crash (a webhook's body is outside input)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def text_at(data: Mapping[str, Any], key: str) -> str:
    """``data[key]`` as a string; ``""`` when absent, None or empty."""
    return str(data.get(key) or "")


def dict_at(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``data[key]`` when it is a JSON object, else ``{}``."""
    found = data.get(key)
    return found if isinstance(found, dict) else {}


def list_at(data: Mapping[str, Any], key: str) -> list[Any]:
    """``data[key]`` when it is a JSON array, else ``[]``."""
    found = data.get(key)
    return found if isinstance(found, list) else []
