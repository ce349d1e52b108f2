"""Pluto's gateway: the process that connects chat platforms to agents.

- :mod:`.app` — the :class:`~pluto.gateway.app.Gateway`: starts and stops everything.
- :mod:`.ports` — what a provider implements and what it is given (never the gateway).
- :mod:`.pipeline` — where a message goes after a provider hands it over: intake, dedupe,
  access, routing, commands, per-session lanes.
- :mod:`.delivery` — where replies leave: the outbox, live previews, rendering.
- :mod:`.feed` — the run feed: a run's events after a seq, then live.
- :mod:`.http` — the one HTTP server: health, metrics, the admin API.
- :mod:`.cli` — the ``pluto`` command.
"""
