"""The two servers the benchmarks compare: the whole gateway (``pluto serve`` with the web
provider and the in-process ``echo`` model) and a bare aiohttp WebSocket echo server."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from bench.common import ROOT, free_port, pluto_exe

BENCH_PLUTO_YAML = """\
data_dir: {data}
http: {{host: 127.0.0.1, port: {port}{http_extra}}}
models:
  default: {{model: echo}}        # answers at once with the user's words: gateway cost only
providers:
  web:
    enabled: true
    rate_messages: 10000          # the benchmark floods on purpose
    rate_seconds: 1
    max_message_chars: 4000
log_level: WARNING
"""

ECHO_SERVER = r"""
import json, sys
from aiohttp import web, WSMsgType

async def ws(request):
    sock = web.WebSocketResponse(max_msg_size=1 << 20)
    await sock.prepare(request)
    async for msg in sock:
        if msg.type != WSMsgType.TEXT:
            continue
        frame = json.loads(msg.data)
        if frame.get("type") == "hello":
            await sock.send_str(json.dumps({"type": "ready", "token": "t"}))
        elif frame.get("type") == "message":
            await sock.send_str(json.dumps({"type": "message.final", "id": frame.get("id"),
                                            "text": frame.get("text")}))
    return sock

async def ok(request):
    return web.json_response({"status": "ready"})

app = web.Application()
app.router.add_get("/ws", ws)
app.router.add_get("/readyz", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def _more_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Server:
    """A server in its own process; ``url`` once ready."""

    def __init__(self, kind: str, env: dict[str, str] | None = None,
                 max_connections: int | None = None):
        self.kind = kind
        self.extra_env = env or {}  # e.g. DATABASE_URL: the instance shares a PostgreSQL
        # (pluto) ``http.max_connections``: by default the gateway keeps half its open-files
        # limit for connections (each answer may hold a model connection beside its socket)
        self.max_connections = max_connections
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix=f"pluto-bench-{kind}-")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def _command(self) -> list[str]:
        tmp = Path(self._tmp.name)
        if self.kind == "echo":
            script = tmp / "echo.py"
            script.write_text(ECHO_SERVER)
            return [sys.executable, str(script), str(self.port)]
        config = tmp / "config"
        shutil.copytree(ROOT / "config" / "agents", config / "agents")
        shutil.copy(ROOT / "config" / "routes.yaml", config / "routes.yaml")
        extra = (f", max_connections: {self.max_connections}"
                 if self.max_connections is not None else "")
        (config / "pluto.yaml").write_text(BENCH_PLUTO_YAML.format(
            data=tmp / "data", port=self.port, http_extra=extra))
        return [*pluto_exe(), "serve", "--config", str(config)]

    def __enter__(self) -> Server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")
               and k != "DATABASE_URL"} | self.extra_env
        self.proc = subprocess.Popen(self._command(), cwd=ROOT, env=env, preexec_fn=_more_files,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"{self.kind} server exited: {err[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"{self.kind} server did not become ready")

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._tmp.cleanup()

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used so far."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        from bench.common import rss_mb

        assert self.proc is not None
        return rss_mb(self.proc.pid)
