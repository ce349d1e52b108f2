"""Schedules: agents that speak first — reminders, recurring reports, heartbeats.

- :mod:`.recurrence` — when a schedule fires (one-offs, intervals, cron in a time zone).
- :mod:`.scheduler` — the gateway's task that claims due firings and runs them as messages.
- :mod:`.commands` — ``/remind`` and ``/schedules`` in any chat.
- :mod:`.config` — ``schedules.yaml``: admins' schedules and the limits, reloaded live.

The rows live in storage (:mod:`pluto.storage.sql.schedules`); docs/schedules.md is the
manual.
"""
