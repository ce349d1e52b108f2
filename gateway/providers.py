"""The provider registry: the one place that imports ``providers/``, lazily, by name."""

from __future__ import annotations

import importlib

from gateway.config import ProviderConfig
from gateway.provider import Provider, ProviderContext

# name in pluto.yaml → "module:Class"; the class has ``from_context(ctx) -> Provider``
PROVIDERS: dict[str, str] = {
    "web": "providers.web:WebProvider",
    "telegram": "providers.telegram:TelegramProvider",
    "discord": "providers.discord:DiscordProvider",
    "slack": "providers.slack:SlackProvider",
    "api": "gateway.api:ApiProvider",  # the HTTP API acts as a provider of its own
}


def build_provider(name: str, ctx: ProviderContext) -> Provider:
    if name not in PROVIDERS:
        known = ", ".join(sorted(PROVIDERS)) or "none"
        raise ValueError(f"unknown provider '{name}' (known: {known})")
    module, cls = PROVIDERS[name].split(":")
    return getattr(importlib.import_module(module), cls).from_context(ctx)


def enabled(providers: dict[str, ProviderConfig]) -> list[str]:
    return [name for name, cfg in providers.items() if cfg.enabled]
