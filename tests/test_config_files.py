"""Config files are read safely: only regular files (a FIFO is refused at once, never waited
on), at most 1 MiB, symlinks followed; parsing (libyaml) survives deep nesting; the agent
registry's async API reads in a worker thread; the live-reload watcher parses off the loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from pathlib import Path

import pytest

from pluto.agents.registry import AgentRegistry
from pluto.agents.spec import load_agent
from pluto.errors import ConfigError
from pluto.gateway.app import Gateway
from pluto.gateway.pipeline.routing import RoutingTable
from pluto.gateway.reload import load_routes
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig, load_pluto_config
from pluto.yamldoc import MAX_CONFIG_BYTES, YamlDoc
from tests.helpers.gateway import RecordingProvider, write_agent

pytestmark = pytest.mark.timeout(30)  # a FIFO read by mistake would hang: fail instead

ROUTES = "routes:\n  - {name: main, match: {provider: test}, agent: default}\n"


def fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def problem(e: pytest.ExceptionInfo[ConfigError]) -> tuple[str, str]:
    file, _, _, message = e.value.problems[0]
    return file, message


def test_a_fifo_as_agent_yaml_is_refused_at_once(config_dir: Path) -> None:
    agent_yaml = fifo(config_dir / "agents" / "default" / "agent.yaml")
    started = time.monotonic()
    with pytest.raises(ConfigError) as e:
        load_agent(agent_yaml.parent)
    assert problem(e) == (str(agent_yaml), "is not a regular file (a FIFO)")
    with pytest.raises(ConfigError) as e:
        AgentRegistry(config_dir / "agents").get("default")
    assert problem(e) == (str(agent_yaml), "is not a regular file (a FIFO)")
    with pytest.raises(ConfigError) as e:
        load_routes(config_dir, AgentRegistry(config_dir / "agents"))
    assert problem(e) == (str(agent_yaml), "is not a regular file (a FIFO)")
    assert time.monotonic() - started < 5


def test_a_fifo_as_routes_yaml_is_refused_at_once(config_dir: Path) -> None:
    routes = fifo(config_dir / "routes.yaml")
    with pytest.raises(ConfigError) as e:
        load_routes(config_dir, AgentRegistry(config_dir / "agents"))
    assert problem(e) == (str(routes), "is not a regular file (a FIFO)")


def test_a_fifo_as_instructions_is_refused_at_once(config_dir: Path) -> None:
    agent = config_dir / "agents" / "default"
    fifo(agent / "instructions.md")
    with pytest.raises(ConfigError) as e:
        load_agent(agent)
    file, message = problem(e)
    assert file == str(agent / "agent.yaml")
    assert message == "instructions.md is not a regular file (a FIFO)"


def test_a_directory_as_pluto_yaml_is_refused(config_dir: Path) -> None:
    (config_dir / "pluto.yaml").unlink()
    (config_dir / "pluto.yaml").mkdir()
    with pytest.raises(ConfigError) as e:
        load_pluto_config(config_dir)
    assert "pluto.yaml: is not a regular file (a directory)" in str(e.value)


def test_an_8_mb_routes_yaml_is_refused_by_its_size_before_it_is_read(config_dir: Path) -> None:
    routes = config_dir / "routes.yaml"
    rule = "  - {match: {provider: test, chat: '%d'}, agent: default}\n"
    with routes.open("w") as f:
        f.write("routes:\n")
        while f.tell() < 8 * 2**20:
            f.write("".join(rule % i for i in range(1000)))
    started = time.monotonic()
    with pytest.raises(ConfigError) as e:
        RoutingTable.load(routes, {"default"})
    assert time.monotonic() - started < 0.5  # parsing it would take 5-30 s
    assert problem(e) == (str(routes), "is larger than 1 MiB")


def test_a_file_just_under_the_cap_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    item = "'a value of some thirty characters',"
    n = (MAX_CONFIG_BYTES - 100) // len(item)
    path.write_text("a: [" + item * n + "end]\n")
    assert 0.99 * MAX_CONFIG_BYTES < path.stat().st_size <= MAX_CONFIG_BYTES
    assert len(YamlDoc(path).data["a"]) == n + 1


def test_symlinks_to_regular_files_still_work(config_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "routes.yaml").write_text(ROUTES)
    (config_dir / "routes.yaml").unlink()
    (config_dir / "routes.yaml").symlink_to(elsewhere / "routes.yaml")
    agent = config_dir / "agents" / "default"
    (agent / "real.yaml").write_text("description: linked\ninstructions: linked.md\n")
    (agent / "agent.yaml").unlink()
    (agent / "agent.yaml").symlink_to("real.yaml")
    (agent / "text.md").write_text("I am linked")
    (agent / "linked.md").symlink_to(agent / "text.md")
    registry = AgentRegistry(config_dir / "agents")
    table = load_routes(config_dir, registry)
    assert [r.agent for r in table.spec.routes] == ["default"]
    spec = registry.get("default")
    assert (spec.description, spec.instructions) == ("linked", "I am linked")


@pytest.mark.parametrize("text", ["- " * 400_000 + "x\n", "[" * 500_000 + "]" * 500_000,
                                  "a:\n" + "".join(" " * i + "a:\n" for i in range(1, 1400))])
async def test_deep_nesting_is_an_error_not_a_crash_even_in_a_worker_thread(
        tmp_path: Path, text: str) -> None:
    """libyaml's own composer recurses in C and would crash the process here."""
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        await asyncio.to_thread(YamlDoc, path)
    assert "nested too deeply" in str(e.value)


def test_errors_keep_their_words_and_lines(tmp_path: Path) -> None:
    path = tmp_path / "half.yaml"
    path.write_text("routes:\n  - {name: main, match")  # a save caught half-way
    with pytest.raises(ConfigError) as e:
        YamlDoc(path)
    assert e.value.problems == [(str(path), 2, "", "invalid YAML: expected ',' or '}', but got "
                                 "'<stream end>' (while parsing a flow mapping started on line 2)")]


# the agent registry's async API ----------------------------------------------------------------

async def test_the_registry_reads_in_a_worker_thread(config_dir: Path, monkeypatch) -> None:
    registry = AgentRegistry(config_dir / "agents", recheck_seconds=60)
    loop_thread = threading.current_thread()
    threads: list[threading.Thread] = []
    real = AgentRegistry.get

    def spying_get(self: AgentRegistry, name: str):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread())
        return real(self, name)

    monkeypatch.setattr(AgentRegistry, "get", spying_get)
    assert await registry.list_names() == ["cook", "default"]
    spec = await registry.load("default")
    assert spec.name == "default" and threads and loop_thread not in threads
    threads.clear()
    assert await registry.load("default") is spec  # looked at a moment ago: from memory
    assert threads == []
    write_agent(config_dir, "other", "description: other\n", "hi")
    assert await registry.list_names() == ["cook", "default", "other"]
    with pytest.raises(Exception) as e:
        await registry.load("nobody")
    assert type(e.value).__name__ == "UnknownAgent"


async def test_many_concurrent_loads_share_one_cache(config_dir: Path) -> None:
    for i in range(20):
        write_agent(config_dir, f"a{i}", f"description: agent {i}\n", f"I am {i}")
    registry = AgentRegistry(config_dir / "agents", cache_size=8, recheck_seconds=0)
    specs = await asyncio.gather(*(registry.load(f"a{i % 20}") for i in range(400)))
    assert [s.description for s in specs] == [f"agent {i % 20}" for i in range(400)]
    assert len(registry) == 8 and not registry.errors



def held_looks(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], threading.Event]:
    """Each look at an agent's files noted (its name), and held until the event is set."""
    looks: list[str] = []
    real = AgentRegistry.get
    gate = threading.Event()

    def slow_get(self: AgentRegistry, name: str):  # type: ignore[no-untyped-def]
        looks.append(name)
        gate.wait(5)
        return real(self, name)

    monkeypatch.setattr(AgentRegistry, "get", slow_get)
    return looks, gate


async def test_callers_asking_while_an_agent_is_looked_at_share_that_look(
        config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst of messages when the agent's last look is old: one look at its files, in one
    worker thread, serves every caller asking meanwhile — its definition, or its error."""
    registry = AgentRegistry(config_dir / "agents", recheck_seconds=60)
    looks, gate = held_looks(monkeypatch)
    callers = [asyncio.ensure_future(registry.load("default")) for _ in range(50)]
    lost = [asyncio.ensure_future(registry.load("nobody")) for _ in range(5)]
    while len(looks) < 2:
        await asyncio.sleep(0.01)
    callers[0].cancel()  # one caller gone: the others still get the look's outcome
    gate.set()
    specs = await asyncio.gather(*callers[1:])
    assert {s.name for s in specs} == {"default"} and len({id(s) for s in specs}) == 1
    for caller in lost:
        with pytest.raises(Exception) as e:
            await caller
        assert type(e.value).__name__ == "UnknownAgent"
    assert sorted(looks) == ["default", "nobody"]  # one look each
    assert registry._looking == {}
    looks.clear()
    assert (await registry.load("default")).name == "default" and looks == []  # from memory


async def test_callers_get_a_definition_looked_at_moments_ago_while_the_next_look_runs(
        config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The look at the files runs behind the callers, not in front of them: while it is under
    way, a definition looked at less than serve_stale_seconds ago is served at once; the edit
    it finds is served from then on; a definition older than that (or recheck_seconds 0)
    waits for the look, and so does an agent never loaded."""
    registry = AgentRegistry(config_dir / "agents", recheck_seconds=0.25,
                             serve_stale_seconds=60)
    first = await registry.load("default")
    looks, gate = held_looks(monkeypatch)
    registry._cache["default"].checked -= 1  # its last look is due again
    write_agent(config_dir, "default", "description: edited\n", "hi")
    served = [await registry.load("default") for _ in range(20)]  # none waits for the look
    assert {id(s) for s in served} == {id(first)}
    while not looks:
        await asyncio.sleep(0.01)
    assert looks == ["default"]  # one look, behind them
    never_loaded = asyncio.ensure_future(registry.load("cook"))  # nothing to serve: it waits
    while len(looks) < 2:
        await asyncio.sleep(0.01)
    assert not never_loaded.done()
    gate.set()
    assert (await never_loaded).name == "cook"
    while registry._looking:
        await asyncio.sleep(0.01)
    assert (await registry.load("default")).description == "edited"  # the look's find

    async def waits_for_the_look() -> str:
        gate.clear()
        asked = len(looks)
        waiting = asyncio.ensure_future(registry.load("default"))
        while len(looks) == asked:
            await asyncio.sleep(0.01)
        assert not waiting.done()
        gate.set()
        return (await waiting).description

    registry._cache["default"].checked -= 61  # older than serve_stale_seconds
    assert await waits_for_the_look() == "edited"
    registry.recheck_seconds = 0  # files looked at for every caller
    assert await waits_for_the_look() == "edited"


async def test_an_agent_removed_is_unknown_once_the_look_has_seen_it(
        config_dir: Path) -> None:
    registry = AgentRegistry(config_dir / "agents", recheck_seconds=0.25,
                             serve_stale_seconds=60)
    await registry.load("cook")
    for path in sorted((config_dir / "agents" / "cook").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (config_dir / "agents" / "cook").rmdir()
    registry._cache["cook"].checked -= 1
    assert (await registry.load("cook")).name == "cook"  # served while the look runs
    while registry._looking:
        await asyncio.sleep(0.01)
    with pytest.raises(Exception) as e:
        await registry.load("cook")
    assert type(e.value).__name__ == "UnknownAgent"

# the live-reload watcher -----------------------------------------------------------------------

async def serving(config: Path, data_dir: Path) -> tuple[Gateway, RecordingProvider]:
    cfg = PlutoConfig(data_dir=data_dir, gateway={"reload_interval_seconds": 0.05})
    gw = Gateway(config, config=cfg, serve=True, http_bind=("127.0.0.1", 0),
                 model_factory=ScriptedModel(fallback=lambda m: Scripted(text="pong")))
    await gw.start()
    p = RecordingProvider("test")
    gw.add_provider(p)
    await p.running.wait()
    return gw, p


async def until(cond, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    async def poll():  # type: ignore[no-untyped-def]
        while not (value := cond()):
            await asyncio.sleep(0.01)
        return value
    return await asyncio.wait_for(poll(), timeout)


async def loop_lag(stop: asyncio.Event) -> float:
    worst = 0.0
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(0.005)
        worst = max(worst, time.perf_counter() - started - 0.005)
    return worst


async def test_the_watcher_parses_a_big_routes_yaml_off_the_loop(config_dir: Path,
                                                                 data_dir: Path) -> None:
    (config_dir / "routes.yaml").write_text(ROUTES)
    gw, p = await serving(config_dir, data_dir)
    # As `pluto serve` does once up (gateway/gcpolicy.py): what the process holds is frozen, so
    # a full collection walks only what came since. Unfrozen, a collection would walk what the
    # whole test session left behind (0.5 s in CI), whichever thread happened to set it off.
    gc.collect()
    gc.freeze()
    try:
        rule = "  - {name: rule-%05d, match: {provider: other, chat: '%060d'}, agent: default}\n"
        rules = "".join(rule % (i, i) for i in range(7_000))  # ~84k values: under the cap
        text = "routes:\n" + rules + ROUTES.split("\n", 1)[1]
        assert 0.7 * MAX_CONFIG_BYTES < len(text) < MAX_CONFIG_BYTES
        stop = asyncio.Event()
        lag = asyncio.create_task(loop_lag(stop))
        tmp = config_dir / "routes.yaml.tmp"
        tmp.write_text(text)
        started = time.perf_counter()
        os.replace(tmp, config_dir / "routes.yaml")
        await until(lambda: len(gw.routes.spec.routes) == 7_001, timeout=60)
        took = time.perf_counter() - started
        stop.set()
        worst = await lag
        logging.getLogger(__name__).info("reload of %d bytes: %.2fs; worst loop stall %.0f ms",
                                         len(text), took, worst * 1000)
        assert gw.watcher.status.ok and gw.watcher.status.generation == 2
        assert worst < 0.25, f"the loop stalled {worst:.3f}s while a {took:.1f}s reload ran"
        await p.say("still here?")
        assert await p.wait_finals(1) == ["pong"]
    finally:
        gc.unfreeze()
        await gw.stop()


async def test_a_fifo_put_in_place_of_routes_yaml_is_refused_live(config_dir: Path,
                                                                  data_dir: Path) -> None:
    (config_dir / "routes.yaml").write_text(ROUTES)
    gw, p = await serving(config_dir, data_dir)
    try:
        os.mkfifo(config_dir / "routes.fifo")
        os.replace(config_dir / "routes.fifo", config_dir / "routes.yaml")
        await until(lambda: "routes" in gw.watcher.status.refused)
        assert gw.watcher.status.refused["routes"][0][3] == "is not a regular file (a FIFO)"
        await p.say("hello")
        assert await p.wait_finals(1) == ["pong"]  # the last good table keeps serving
        status = await gw.watcher.reload_now_async()  # POST /admin/reload
        assert not status.ok and status.as_dict()["problems"][0]["message"] == (
            "is not a regular file (a FIFO)")
    finally:
        await gw.stop()
