"""The harness registry and fixture of the conformance suite (see README.md here)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.api_harness import ApiHarness
from tests.conformance.cli_harness import CliHarness
from tests.conformance.discord_harness import DiscordHarness
from tests.conformance.email_harness import EmailHarness
from tests.conformance.harness import Harness
from tests.conformance.matrix_harness import MatrixHarness
from tests.conformance.mattermost_harness import MattermostHarness
from tests.conformance.slack_harness import SlackHttpHarness, SlackSocketHarness
from tests.conformance.teams_harness import TeamsHarness
from tests.conformance.telegram_harness import TelegramHarness
from tests.conformance.web_harness import WebHarness
from tests.conformance.whatsapp_harness import WhatsAppHarness

# One entry per provider. Adding a provider to the suite = adding its harness here.
HARNESSES: dict[str, type[Harness]] = {
    "telegram": TelegramHarness,
    "cli": CliHarness,
    "discord": DiscordHarness,
    "slack-http": SlackHttpHarness,
    "slack-socket": SlackSocketHarness,
    "web": WebHarness,
    "api": ApiHarness,
    "whatsapp": WhatsAppHarness,
    "matrix": MatrixHarness,
    "email": EmailHarness,
    "mattermost": MattermostHarness,
    "teams": TeamsHarness,
}


def harnesses(needs: Callable[[type[Harness]], bool] = lambda h: True) -> list[Any]:
    """The harnesses a scenario applies to, as ``parametrize`` values for the ``harness``
    fixture: ``needs`` reads the class's ``caps`` (the provider's Capabilities) and
    ``features`` (what its platform can do)."""
    return [pytest.param(name, id=name) for name, cls in HARNESSES.items() if needs(cls)]


@pytest.fixture
async def harness(request: pytest.FixtureRequest, config_dir: Path,
                  data_dir: Path) -> AsyncIterator[Harness]:
    cls = HARNESSES[request.param]
    h = cls(config_dir=config_dir, data_dir=data_dir)
    await h.open()
    try:
        yield h
    finally:
        await h.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # PTB 22 warns whenever it builds a RetryAfter (its int becomes a timedelta in a future
    # major); the provider reads either
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning"))
