"""What a newcomer hit on the first day (issue 37): the CLI's small surprises, run as real
subprocesses (`pluto serve`, `run`, `status`, `memory`) or in-process (the terminal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(data_dir: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    return e | {"PLUTO_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}


def pluto(*args: str, env: dict[str, str], config: Path,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pluto.gateway.cli", *args, "--config",
                           str(config)], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_serve_stops_without_native_leak_reports(env, config_dir) -> None:
    """DuckDB's nanobind printed ~43 lines of 'leaked' at a stop when DuckDB was loaded before
    the gateway froze what it held (gc.freeze(): never collected, not even at exit). Loaded
    first here, so that it is always so."""
    start = ("import sys, duckdb; from pluto.gateway.cli import main; "
             "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", start, "serve", "--port", "0",
                             "--config", str(config_dir)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "serving on" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopped" in err and "nanobind" not in err and "leaked" not in err


def test_run_with_a_broken_agent_file_says_why(env, config_dir) -> None:
    broken = config_dir / "agents" / "broken"
    broken.mkdir()
    (broken / "agent.yaml").write_text("description: x\nmodel: [\n")
    for command in (["run", "--agent", "broken", "hi"], ["chat", "--agent", "broken"]):
        out = pluto(*command, env=env, config=config_dir)
        assert out.returncode == 2, out.stderr
        assert "agents/broken/agent.yaml:" in out.stderr and "invalid YAML" in out.stderr
        assert "not available right now" not in out.stdout + out.stderr
        assert "Traceback" not in out.stderr
