"""The shipped deployment files say what the code needs: docker-compose.yml forwards every
variable the configuration names, requires a real PLUTO_WEB_SECRET, and the balancer keeps the
Host's port and keeps /metrics inside; `pluto serve` refuses an example secret off loopback."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from pluto.errors import ConfigError
from pluto.gateway.cli.placeholders import (looks_like_placeholder, loopback, refusal,
                                            refuse_off_loopback)
from pluto.settings import PlutoConfig, load_pluto_config

ROOT = Path(__file__).resolve().parent.parent
PLATFORMS = ("api", "web", "telegram", "discord", "slack", "whatsapp", "matrix")


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _dockerfile_env() -> set[str]:
    text = (ROOT / "Dockerfile").read_text()
    return set(re.findall(r"\b([A-Z][A-Z0-9_]+)=", " ".join(
        line for line in text.replace("\\\n", " ").splitlines() if line.startswith("ENV "))))


def _settings_env_defaults(model: type[BaseModel]) -> set[str]:
    """Every ``*_env`` field's default in a settings model and the models inside it."""
    found: set[str] = set()
    for name, field in model.model_fields.items():
        if name.endswith("_env") and isinstance(field.default, str):
            found.add(field.default)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found |= _settings_env_defaults(annotation)
    return found


def _named_by_code_and_config() -> set[str]:
    """The variables Pluto reads for its configuration and its platforms: the defaults of every
    provider's ``*_env`` settings, of pluto.yaml's own, and each variable config/pluto.yaml
    names (``*_env: NAME``, ``${NAME}``), commented-out platforms included."""
    names: set[str] = _settings_env_defaults(PlutoConfig)
    for platform in PLATFORMS:
        module = importlib.import_module(f"pluto.providers.{platform}.settings"
                                         if platform not in ("api",) else "pluto.providers.api.auth")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseModel) and \
                    value.__module__ == module.__name__:
                names |= _settings_env_defaults(value)
    text = (ROOT / "config" / "pluto.yaml").read_text()
    names |= set(re.findall(r"_env:\s*([A-Z][A-Z0-9_]+)", text))
    values = "\n".join(line.split("#")[0] for line in text.splitlines())  # (not the examples)
    names |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]+)", values))
    return names


def test_compose_forwards_every_variable_the_configuration_names() -> None:
    compose = _compose()
    wanted = _named_by_code_and_config() - _dockerfile_env()
    assert {"PLUTO_API_KEYS", "PLUTO_ADMIN_KEY", "TELEGRAM_BOT_TOKEN", "SLACK_APP_TOKEN",
            "MATRIX_ACCESS_TOKEN", "PLUTO_WEB_SECRET", "DATABASE_URL"} <= wanted  # (the scan works)
    for name in ("pluto-1", "pluto-2", "pluto-3"):
        service = compose["services"][name]
        forwarded = set(service["environment"])
        assert wanted <= forwarded, f"{name} does not forward {sorted(wanted - forwarded)}"
        for var, value in service["environment"].items():  # from the environment, same name
            if var != "DATABASE_URL":
                assert str(value).startswith("${" + var), (var, value)
        assert "./config:/app/config:ro" in service["volumes"]  # config edits reach it
    comment = (ROOT / "docker-compose.yml").read_text().split("x-pluto:")[0]
    for named in re.findall(r"\b((?:PLUTO|TELEGRAM|DISCORD|MATRIX)_[A-Z_]+)\b", comment):
        assert named in compose["services"]["pluto-1"]["environment"], named


def test_compose_requires_a_real_web_secret() -> None:
    value = _compose()["services"]["pluto-1"]["environment"]["PLUTO_WEB_SECRET"]
    assert value.startswith("${PLUTO_WEB_SECRET:?")  # compose stops, saying what to set
    assert not looks_like_placeholder(value.split(":?", 1)[0])
    assert "change-me" not in (ROOT / "docker-compose.yml").read_text()


def test_the_balancer_keeps_the_port_and_keeps_metrics_inside() -> None:
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    code = "\n".join(line.split("#")[0] for line in conf.splitlines())
    assert re.search(r"proxy_set_header\s+Host\s+\$http_host;", code)
    assert not re.search(r"proxy_set_header\s+Host\s+\$host;", code)
    metrics = re.search(r"location\s*=\s*/metrics\s*\{([^}]*)\}", code)
    assert metrics is not None and re.search(r"return\s+404|deny\s+all", metrics.group(1))
    assert "ports:" not in yaml.safe_dump(_compose()["services"]["pluto-1"])  # only the balancer


@pytest.mark.parametrize("value", ["change-me-to-32-or-more-characters-please",
                                   "CHANGEME-please-make-this-32-chars-long",
                                   "replace_me_with_a_long_random_secret_value",
                                   "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"])
def test_example_values_are_recognized(value: str) -> None:
    assert looks_like_placeholder(value)


@pytest.mark.parametrize("value", ["3f9c2a8e1d7b4c6a9e0f1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6",
                                   "k5Jm2pQ9vT8xW1yZ4bN7cR0dF3gH6jL9"])
def test_random_secrets_are_not_taken_for_examples(value: str) -> None:
    assert not looks_like_placeholder(value)


def test_loopback_addresses() -> None:
    assert all(loopback(h) for h in ("127.0.0.1", "127.0.1.1", "::1", "[::1]", "localhost"))
    assert not any(loopback(h) for h in ("0.0.0.0", "::", "", "10.0.0.5", "chat.example.com"))


def test_serve_refuses_an_example_secret_off_loopback(monkeypatch, config_dir: Path) -> None:
    config = load_pluto_config(config_dir)
    monkeypatch.setenv("PLUTO_WEB_SECRET", "change-me-to-32-or-more-characters-please")
    assert refusal(config, "127.0.0.1") is None  # trying things out on this machine: fine
    why = refusal(config, "0.0.0.0")
    assert why is not None and why.count(". ") == 0 and "$PLUTO_WEB_SECRET" in why
    assert "openssl rand -hex 32" in why and "change-me" not in why  # (the value is not shown)
    with pytest.raises(ConfigError):
        refuse_off_loopback(config, "0.0.0.0")
    monkeypatch.setenv("PLUTO_WEB_SECRET", "3f9c2a8e1d7b4c6a9e0f1b2c3d4e5f60718293a4b5c6d7e8f9a0")
    assert refusal(config, "0.0.0.0") is None
    monkeypatch.setenv("DATABASE_URL", "postgresql://pluto:changeme@db/pluto")  # not a secret
    assert refusal(config, "0.0.0.0") is None  # of ours: the database's own password
    monkeypatch.setenv("PLUTO_ADMIN_KEY", "your-secret-admin-key-here")  # another example
    assert "$PLUTO_ADMIN_KEY" in (refusal(config, "10.1.2.3") or "")


def test_pluto_serve_says_so_in_one_sentence_and_exits_2(config_dir: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    env |= {"PLUTO_DATA_DIR": str(tmp_path / "data"),
            "PLUTO_WEB_SECRET": "change-me-to-32-or-more-characters-please"}
    out = subprocess.run([sys.executable, "-m", "pluto.gateway.cli", "serve", "--host",
                          "0.0.0.0", "--port", "0", "--config", str(config_dir)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "$PLUTO_WEB_SECRET holds an example value" in out.stderr
    assert "Traceback" not in out.stderr and "change-me" not in out.stderr
