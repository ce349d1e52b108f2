"""The provider registry: chat platforms declare themselves, the gateway finds them by name.

A provider is declared as an entry point in the ``pluto.providers`` group (see
``pyproject.toml``); the entry's name is the provider's name in ``pluto.yaml``. This is the one
place that loads ``providers/`` packages, lazily, and only those that are enabled. A platform
added in its own package (ours or anyone's) needs no change here.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points

from pluto.errors import ConfigError
from pluto.gateway.ports import Provider, ProviderContext
from pluto.settings import ProviderConfig

GROUP = "pluto.providers"


@cache
def declared() -> dict[str, EntryPoint]:
    """Every provider an installed package declares, by name."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def provider_class(name: str) -> type[Provider]:
    found = declared().get(name)
    if found is None:
        known = ", ".join(sorted(declared())) or "none"
        raise ConfigError([("pluto.yaml", None, f"providers.{name}",
                            f"unknown provider '{name}' (known: {known})")])
    cls = found.load()
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise ConfigError([("pluto.yaml", None, f"providers.{name}",
                            f"the entry point {found.value} is not a Provider")])
    return cls


def build_provider(name: str, ctx: ProviderContext) -> Provider:
    return provider_class(name).from_context(ctx)


def enabled(providers: dict[str, ProviderConfig]) -> list[str]:
    return [name for name, cfg in providers.items() if cfg.enabled]
