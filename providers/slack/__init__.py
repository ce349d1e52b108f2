"""Slack: a bot in one workspace (slack-bolt), by the Events API over HTTP or Socket Mode."""

from pluto.providers.slack.provider import SlackProvider
from pluto.providers.slack.settings import SlackSettings

__all__ = ["SlackProvider", "SlackSettings"]
