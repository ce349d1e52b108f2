"""The PostgreSQL server the tests use: ``PLUTO_TEST_DATABASE_URL``, by default the machine's
own (127.0.0.1:5432, user postgres, database test, trust auth; in Docker:
``docker compose up -d postgres``). Each test gets a schema of its own, dropped after it. When
the server cannot be reached the test fails, naming the URL: it never skips."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest

PG_URL = os.environ.get("PLUTO_TEST_DATABASE_URL",
                        "postgresql://postgres@127.0.0.1:5432/test")


def _connect():  # type: ignore[no-untyped-def]
    import psycopg

    try:
        return psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        pytest.fail(f"PostgreSQL is needed for this test and is not reachable at {PG_URL} "
                    f"({str(e).strip().splitlines()[0]}). Start it, or point "
                    f"PLUTO_TEST_DATABASE_URL at one.", pytrace=False)


def url_with_schema(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}')}"


@contextlib.contextmanager
def fresh_schema() -> Iterator[str]:
    """A URL whose tables live in a new, empty schema (dropped afterwards)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with _connect() as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield url_with_schema(schema)
    finally:
        with _connect() as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def connect(url: str):  # type: ignore[no-untyped-def]
    """A plain autocommit connection to ``url`` (to act on the server beside a store)."""
    import psycopg
    return psycopg.connect(url, autocommit=True)


def terminate(conn, application_name: str) -> int:  # type: ignore[no-untyped-def]
    """``pg_terminate_backend`` on every backend of ``application_name`` but ``conn``'s own;
    how many."""
    rows = conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
        " AND pid <> pg_backend_pid()", (application_name,)).fetchall()
    return len(rows)
