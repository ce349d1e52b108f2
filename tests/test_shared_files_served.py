"""The docker-compose.yml layout, as processes: two ``pluto serve`` with a data dir each, one
PostgreSQL schema, one web signing key, a round-robin balancer in front. A chart drawn on A
(the widget's socket is on A) downloads through B and through the balancer by the link the
user got. PostgreSQL: tests/helpers/pg.py (fails, never skips, without it)."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import yaml

from tests.conformance.test_kill import Serve
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.helpers.balancer import Balancer
from tests.helpers.gateway import write_agent
from tests.helpers.pg import fresh_schema
from tests.helpers.served import Tab
from tests.test_cluster import free_port, wait_ready

SECRET = "compose-secret-0123456789-0123456789"
SALES_SQL = "SELECT region, sum(amount) AS total FROM sales GROUP BY 1 ORDER BY 1"


def _configure(config_dir: Path) -> None:
    config = yaml.safe_load((config_dir / "pluto.yaml").read_text())
    config["providers"] = {"web": {"enabled": True}}
    (config_dir / "pluto.yaml").write_text(yaml.safe_dump(config))
    write_agent(config_dir, "charts", "tools: [make_chart]\ndatasets: '*'\n")
    (config_dir / "routes.yaml").write_text(
        "routes:\n  - match: {provider: web, guild: charts}\n    agent: charts\n"
        "default: default\n")


async def test_two_served_instances_with_their_own_data_dirs_serve_each_others_charts(
        tmp_path: Path, config_dir: Path) -> None:
    _configure(config_dir)
    model = FakeOpenAI()
    await model.start()
    model.script(Reply(tool_calls=[ToolCall("make_chart", {"sql": SALES_SQL, "kind": "bar",
                                                            "x": "region", "y": ["total"]})]),
                 Reply(text="Here is the chart."))
    ports = [free_port(), free_port()]
    balancer = Balancer([f"http://127.0.0.1:{p}" for p in ports])
    await balancer.start()
    with fresh_schema() as db_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")} | {
            "DATABASE_URL": db_url, "PLUTO_MODEL": "openai/fake",
            "PLUTO_API_BASE": model.base_url, "PLUTO_API_KEY": "sk-files-test",
            "PLUTO_WEB_SECRET": SECRET, "PYTHONUNBUFFERED": "1"}
        instances = [Serve(config_dir, env | {"PLUTO_DATA_DIR": str(tmp_path / f"data{i}")},
                           tmp_path / f"serve{i}.log") for i in range(2)]
        try:
            for serve, port in zip(instances, ports):
                await serve.start("--port", str(port))
            for port in ports:
                await wait_ready(port)
            async with aiohttp.ClientSession() as http:
                tab = Tab(await http.ws_connect(f"http://127.0.0.1:{ports[0]}/ws"))
                await tab.send(type="hello", token=None, agent="charts")
                await tab.until("history", timeout=30)
                await tab.send(type="message", text="chart the sales by region")
                end = await tab.until("tool.end", timeout=90)
                await tab.until("message.final", timeout=90)
                link = end["details"]["image"]
                rel = link.split("/", 4)[4]
                made = (tmp_path / "data0" / rel).read_bytes()
                assert not (tmp_path / "data1" / rel).exists()
                async with http.get(f"http://127.0.0.1:{ports[1]}{link}") as resp:
                    assert resp.status == 200 and resp.content_type == "image/png"
                    assert await resp.read() == made
                assert (tmp_path / "data1" / rel).read_bytes() == made
                for _ in range(2):  # whichever instance the balancer picks
                    async with http.get(f"{balancer.url}{link}") as resp:
                        assert resp.status == 200 and await resp.read() == made
                await tab.ws.close()
        except BaseException:
            for i, serve in enumerate(instances):
                print(f"--- instance {i}:\n{serve.tail()}")
            raise
        finally:
            for serve in instances:
                if serve.proc is not None:
                    await serve.stop()
            await balancer.stop()
            await model.stop()
