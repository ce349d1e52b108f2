"""The test-wide guard: nothing in the suite can reach the internet, so no real model."""

from __future__ import annotations

import socket

import pytest

from tests.conftest import NetworkBlocked


def test_public_addresses_are_refused() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with pytest.raises(NetworkBlocked):
        s.connect(("8.8.8.8", 443))
    s.close()


def test_public_names_do_not_resolve() -> None:
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("api.openai.com", 443)


async def test_a_real_model_call_fails_fast_and_plainly() -> None:
    from pluto.runtime.errors import ModelError
    from pluto.runtime.model import LiteLLMModel, ModelSettings

    settings = ModelSettings(model="openai/gpt-4o-mini", timeout=5)
    with pytest.raises(ModelError) as exc:
        async for _ in LiteLLMModel().stream([{"role": "user", "content": "hi"}], [], settings):
            pass
    assert str(exc.value).startswith(("No API key is set for the model openai/gpt-4o-mini",
                                      "Could not reach the model service"))
