"""Writes fenced by a claim: several instances, one database, a run's writes refused once its
chat was taken over.

A run taken from the inbox by an instance holding its chat's claim (a lease with a token that
only grows: :mod:`.leases`) writes its events, tool results, answer and end only while that
claim still carries that token. The check is part of each write's own statement (no extra
round trip, no window between a check and the write; a transaction a paused process left open
is ended by the server before its claim can be taken: storage/postgres/engine.py): an ``INSERT … VALUES`` becomes
``INSERT … SELECT … WHERE EXISTS (the claim)``, an ``UPDATE … WHERE …`` gets ``AND EXISTS
(the claim)``. A statement that changed nothing because of it means the run was taken over
(:class:`~pluto.errors.RunTakenOver`); what it wrote before then is removed by the taker, so a
taken-over run's tool calls never enter the history the re-run reads.

One process per database (SQLite) takes no claims: its statements are left as they are.
"""

from __future__ import annotations

from pluto.storage.sql import Statement
from pluto.storage.sql.leases import fenced

Claim = tuple[str, int]  # (lease name, token)

_FENCE = fenced()


def fence(stmt: Statement, claim: Claim | None) -> Statement:
    """``stmt`` (an ``INSERT … VALUES (…)`` without a conflict clause, or an ``UPDATE`` with a
    ``WHERE``) made to change nothing unless ``claim`` still holds."""
    if claim is None:
        return stmt
    sql, params = stmt
    if sql.startswith("INSERT INTO "):
        head, sep, values = sql.partition(" VALUES (")
        if not sep or not values.endswith(")"):
            raise ValueError(f"cannot fence {sql!r}")
        return f"{head} SELECT {values[:-1]} WHERE {_FENCE}", (*params, *claim)
    if sql.startswith("UPDATE ") and " WHERE " in sql:
        return f"{sql} AND {_FENCE}", (*params, *claim)
    raise ValueError(f"cannot fence {sql!r}")
