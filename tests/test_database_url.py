"""A DATABASE_URL that is not PostgreSQL is one sentence naming its scheme (never the rest of
the URL, which may hold a password), from the function and from `pluto serve`."""

from __future__ import annotations

from pathlib import Path

import pytest

from pluto.errors import ConfigError
from pluto.storage import store_for
from tests.test_data_commands import pluto


@pytest.mark.parametrize(("url", "says"), [
    ("mysql://user:hunter2@db.example/app", "is a mysql:// URL"),
    ("sqlite:///var/lib/pluto.db", "is a sqlite:// URL"),
    ("hunter2", "is not a URL"),
])
def test_a_url_that_is_not_postgresql_is_one_sentence(tmp_path: Path, url: str,
                                                      says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        store_for(tmp_path, url)
    text = str(raised.value)
    assert says in text and "postgresql://" in text and "DATABASE_URL" in text
    assert "hunter2" not in text and "\n" not in text
    assert raised.value.problems[0][0] == "environment"


def test_serve_refuses_it_in_one_sentence(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "mysql://user:hunter2@db.example/app")
    done = pluto("serve", "--port", "0", data_dir=tmp_path)
    assert done.returncode != 0
    assert "is a mysql:// URL; Pluto needs postgresql://" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "hunter2" not in done.stderr + done.stdout
