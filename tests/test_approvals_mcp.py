"""docs/approvals.md's worked example, run: an MCP server's ``delete_file`` behind
``approval: always`` — the stdio server (tests/mcp_servers/files.py, in bubblewrap) deletes
the file only once a person approved, and never when they deny."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

from pluto.gateway.app import Gateway
from pluto.runtime.model import ToolCall
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig
from tests.helpers.gateway import RecordingProvider
from tests.helpers.served import wait_for
from tests.test_approvals import BUTTONS

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "approvals.md"


def example_agent(tmp_path: Path, folder: Path) -> Path:
    """The docs' agent.yaml, its server pointed at ``folder`` (and at this Python)."""
    cfg = tmp_path / "config"
    agent = cfg / "agents" / "ops"
    agent.mkdir(parents=True)
    [block] = re.findall(r"```yaml\n# agents/ops/agent.yaml\n(.*?)```", DOC.read_text(), re.S)
    spec = yaml.safe_load(block)
    server = spec["mcp"]["files"]
    server.update(command=sys.executable, cwd=str(ROOT),
                  args=["-m", "tests.mcp_servers.files", "--root", str(folder)])
    spec["instructions"] = []
    spec["model"] = "scripted"
    (agent / "agent.yaml").write_text(yaml.safe_dump(spec))
    (cfg / "routes.yaml").write_text("routes: []\ndefault: ops\n")
    return cfg


def test_the_docs_show_the_server_that_is_tested():
    code = (ROOT / "tests" / "mcp_servers" / "files.py").read_text()
    [shown] = re.findall(r"```python\n# files_server.py\n(.*?)```", DOC.read_text(), re.S)
    assert shown.strip() in code  # (the file adds only its docstring and imports)


async def test_the_file_is_deleted_only_after_a_person_approves(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "old.log").write_text("old")
    (folder / "q3.csv").write_text("keep me")
    call = ToolCall("c1", "files_delete_file", json.dumps({"name": "old.log"}))
    model = ScriptedModel(Scripted(tool_calls=[call]), Scripted(text="old.log is deleted."),
                          Scripted(tool_calls=[ToolCall("c2", "files_delete_file",
                                                        json.dumps({"name": "q3.csv"}))]),
                          Scripted(text="I kept q3.csv."))
    async with Gateway(example_agent(tmp_path, folder),
                       config=PlutoConfig(data_dir=tmp_path / "data"), model_factory=model) as gw:
        p = RecordingProvider(capabilities=BUTTONS)
        gw.add_provider(p)
        await p.running.wait()
        await p.say("delete old.log")
        await wait_for(lambda: any(m.buttons for m in p.sent), timeout=30)
        assert (folder / "old.log").exists()  # asked, not done
        await p.say(next(m for m in p.sent if m.buttons).buttons[0].command)
        await wait_for(lambda: "old.log is deleted." in p.finals(), timeout=30)
        assert not (folder / "old.log").exists()
        await p.say("and q3.csv")
        await wait_for(lambda: len([m for m in p.sent if m.buttons]) == 2, timeout=30)
        await p.say([m for m in p.sent if m.buttons][1].buttons[1].command)  # Deny
        await wait_for(lambda: "I kept q3.csv." in p.finals(), timeout=30)
        assert (folder / "q3.csv").read_text() == "keep me"
