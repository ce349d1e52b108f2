"""``pluto schedule list | add | rm | run-now | history``, in-process: an admin schedules an
agent into a chat, a gateway on the same data dir fires it when told to run it now, the history
shows the firing; bad options are one sentence each (exit 2), unknown ids exit 1."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from pluto.gateway.app import Gateway
from pluto.gateway.cli import main as cli_main
from pluto.runtime.testing import ScriptedModel
from pluto.settings import PlutoConfig
from tests.helpers.gateway import RecordingProvider


def runner(config_dir: Path, data_dir: Path, capsys):  # type: ignore[no-untyped-def]
    def pluto(*args: str) -> tuple[int, str, str]:
        code = cli_main(["--config", str(config_dir), "--data-dir", str(data_dir), "schedule",
                         *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    async def run(*args: str) -> tuple[int, str, str]:
        return await asyncio.to_thread(pluto, *args)
    return run


async def test_add_list_run_now_history_and_rm(config_dir: Path, data_dir: Path, capsys):
    pluto = runner(config_dir, data_dir, capsys)
    code, out, err = await pluto("add", "--agent", "default", "--to", "test:ops", "--every",
                                 "1h", "--tz", "Europe/Berlin", "what changed?")
    assert code == 0, err
    assert out.startswith("added ") and ": every 1h, next " in out and "Europe/Berlin" in out
    sid = out.split()[1].rstrip(":")
    code, out, _ = await pluto("add", "--agent", "default", "--to", "test:ops", "--cron",
                               "0 9 * * 1-5", "standup")
    assert code == 0 and "cron '0 9 * * 1-5' (UTC)" in out
    code, out, _ = await pluto("list", "--json")
    listed = json.loads(out)
    assert code == 0 and {r["prompt"] for r in listed} == {"what changed?", "standup"}
    assert {(r["provider"], r["chat_id"], r["source"]) for r in listed} == {("test", "ops",
                                                                              "admin")}
    code, out, _ = await pluto("history")
    assert (code, out.strip()) == (0, "no firings yet")

    code, out, _ = await pluto("run-now", sid)
    assert code == 0 and out.strip() == f"{sid} is due now: a running gateway fires it within 15 s"
    model = ScriptedModel()
    async with Gateway(config_dir, config=PlutoConfig(data_dir=data_dir),
                       model_factory=model) as gw:
        p = RecordingProvider("test")
        gw.add_provider(p)
        await p.running.wait()
        gw.scheduler.wake()
        assert await p.wait_finals(1, chat="ops") == ["echo: what changed?"]
        await gw.settled()
    code, out, _ = await pluto("history", sid, "--json")
    [firing] = json.loads(out)
    assert code == 0 and firing["outcome"] == "ran" and firing["run_id"]
    code, out, _ = await pluto("history")
    assert code == 0 and out.startswith(f"{sid}  due ") and " ran  run " in out
    code, out, _ = await pluto("rm", sid)
    assert (code, out.strip()) == (0, f"removed {sid}")
    code, out, _ = await pluto("list")
    assert code == 0 and sid not in out and "standup" in out


async def test_bad_options_are_one_sentence(config_dir: Path, data_dir: Path, capsys):
    pluto = runner(config_dir, data_dir, capsys)
    base = ("add", "--agent", "default", "--to", "test:ops")
    for args, says in [
        ((*base, "--cron", "0 25 * * *", "p"), "pluto schedule: --cron: '0 25 * * *' is not a "
                                               "cron expression I can use (bad hour)"),
        ((*base, "--every", "soon", "p"), "pluto schedule: --every: 'soon' is not a duration"),
        ((*base, "--at", "2001-01-01 09:00", "p"), "pluto schedule: --at: That time has "
                                                    "already passed"),
        ((*base, "--at", "+1h", "--tz", "Mars/Base", "p"), "pluto schedule: --tz: 'Mars/Base'"),
        (("add", "--agent", "nobody", "--to", "test:ops", "--every", "1h", "p"),
         "pluto schedule: --agent: unknown agent 'nobody' (known: cook, default)"),
        (("add", "--agent", "default", "--to", "ops", "--every", "1h", "p"),
         "pluto schedule: --to: 'ops' is not PROVIDER:CHAT"),
    ]:
        code, out, err = await pluto(*args)
        assert code == 2 and err.startswith(says), err
        assert err.count("\n") == 1 and "Traceback" not in err and out == ""
    for action in ("rm", "run-now"):
        code, _, err = await pluto(action, "nope")
        assert code == 1 and err.strip() == ("pluto schedule: there is no schedule 'nope' "
                                             "(pluto schedule list)")


async def test_routes_check_knows_the_tool_and_checks_schedules_yaml(config_dir: Path,
                                                                    data_dir: Path, capsys):
    agent = config_dir / "agents" / "default" / "agent.yaml"
    agent.write_text(agent.read_text().replace("tools: [current_time,",
                                               "tools: [schedule, current_time,"))

    def check() -> tuple[int, str]:
        code = cli_main(["--config", str(config_dir), "--data-dir", str(data_dir), "routes",
                         "check"])
        out = capsys.readouterr()
        return code, out.out + out.err
    code, out = await asyncio.to_thread(check)
    assert code == 0 and out.startswith("ok: "), out
    (config_dir / "schedules.yaml").write_text(
        "schedules:\n  - name: x\n    agent: default\n    to: test:c\n    cron: '0 9 * * 8'\n"
        "    prompt: p\n")
    code, out = await asyncio.to_thread(check)
    assert code == 2 and "schedules.yaml:5: schedules[0].cron: '0 9 * * 8' is not a cron " \
        "expression I can use (bad day-of-week)" in out, out


async def test_doctor_names_a_bad_schedules_yaml(config_dir: Path, data_dir: Path, capsys):
    (config_dir / "schedules.yaml").write_text(
        "schedules:\n  - name: x\n    agent: default\n    to: test:c\n    every: often\n"
        "    prompt: p\n")

    def doctor() -> tuple[int, str]:
        code = cli_main(["--config", str(config_dir), "--data-dir", str(data_dir), "doctor",
                         "--offline"])
        out = capsys.readouterr()
        return code, out.out + out.err
    code, out = await asyncio.to_thread(doctor)
    assert code == 2 and "schedules.yaml:5: schedules[0].every: 'often' is not a duration" \
        in out, out
