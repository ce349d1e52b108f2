"""The first hour of a new user (issue 17): each surprise they met, kept fixed.

The shipped config (a relative ``data_dir``) delivering the headline chart; model errors that
name their cause, endpoint and variable; the data dir decided once, absolute.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pluto.runtime.errors import ModelError
from pluto.runtime.model import LiteLLMModel, ModelSettings
from pluto.runtime.model_errors import endpoint, service_reason
from pluto.settings import PlutoConfig, data_dir_for, load_pluto_config
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

ROOT = Path(__file__).resolve().parent.parent
CHART = ToolCall("make_chart", {"sql": "SELECT month(date) AS month, sum(amount) AS total "
                                       "FROM sales GROUP BY 1 ORDER BY 1",
                                "kind": "line", "x": "month", "title": "By month"})


def pluto_cmd() -> list[str]:
    exe = shutil.which("pluto")
    return [exe] if exe else [sys.executable, "-m", "pluto.gateway.cli"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    return env | {"PYTHONUNBUFFERED": "1"} | extra


# ---- (1) the headline example with the shipped config ----------------------------------


def test_the_shipped_config_delivers_the_chart_in_the_terminal(tmp_path: Path) -> None:
    """As in the README: the example config (data_dir: .pluto, relative), run from its
    parent directory; the PNG is delivered, not dropped for a doubled path."""
    shutil.copytree(ROOT / "config", tmp_path / "config")
    with FakeOpenAI.in_thread(api_key="sk-first") as fake:
        fake.script(Reply(tool_calls=[CHART]), Reply(text="Sales peak in **December**."))
        env = clean_env(PLUTO_MODEL="openai/fake", PLUTO_API_BASE=fake.base_url,
                        PLUTO_API_KEY="sk-first", PYTHONPATH=os.pathsep.join(sys.path))
        out = subprocess.run([*pluto_cmd(), "run", "which month sold best? draw it by month"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("[image: ")]
    png = Path(line.removeprefix("[image: ").rstrip("]"))
    assert png.is_absolute() and png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    assert png.is_relative_to(tmp_path / ".pluto" / "artifacts")
    assert not (tmp_path / ".pluto" / ".pluto").exists()
    log = (tmp_path / ".pluto" / "pluto.log").read_text()
    assert "outside the data dir or missing" not in log


def test_the_data_dir_is_absolute_once_decided(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PLUTO_DATA_DIR", raising=False)
    assert PlutoConfig().data_dir == tmp_path / ".pluto"
    assert PlutoConfig(data_dir="~/state").data_dir == Path.home() / "state"
    shutil.copytree(ROOT / "config", tmp_path / "config")
    config = load_pluto_config(tmp_path / "config")
    assert config.data_dir == tmp_path / ".pluto"
    assert data_dir_for(config, Path("elsewhere")) == tmp_path / "elsewhere"
    monkeypatch.setenv("PLUTO_DATA_DIR", "from-env")
    assert data_dir_for(config) == tmp_path / "from-env"


def test_outside_a_config_dir_the_error_says_how_to_get_one(tmp_path: Path) -> None:
    out = subprocess.run([*pluto_cmd(), "agents"], cwd=tmp_path, env=clean_env(
        PYTHONPATH=os.pathsep.join(sys.path)), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "config directory not found; make one with 'pluto init'" in out.stderr


# ---- (5) model errors that name their cause --------------------------------------------


@pytest.fixture
async def fake():
    async with FakeOpenAI(api_key="sk-right") as server:
        yield server


async def fail(settings: ModelSettings) -> str:
    with pytest.raises(ModelError) as caught:
        async for _ in LiteLLMModel().stream([{"role": "user", "content": "hi"}], [], settings):
            pass
    return str(caught.value)


async def test_a_mistyped_model_name_shows_the_services_reason_and_logs_it(fake, caplog,
                                                                           monkeypatch):
    monkeypatch.setenv("PLUTO_API_KEY", "sk-right")
    fake.script(Reply(status=400, error_message="The model `gpt-4o-mimi` does not exist"))
    settings = ModelSettings(model="openai/gpt-4o-mimi", api_base=fake.base_url,
                             api_key_env="PLUTO_API_KEY", retries=0)
    with caplog.at_level(logging.WARNING, logger="pluto.runtime.model"):
        said = await fail(settings)
    assert said == (f"The model service at {fake.base_url} refused the request: "
                    "The model `gpt-4o-mimi` does not exist.")
    logged = [r.getMessage() for r in caplog.records if r.name == "pluto.runtime.model"]
    assert any("gpt-4o-mimi" in m and "does not exist" in m for m in logged), logged


async def test_an_unreachable_api_base_is_named(monkeypatch):
    monkeypatch.setenv("PLUTO_API_KEY", "sk-any")
    said = await fail(ModelSettings(model="openai/fake", api_base="http://user:pw@127.0.0.1:9/v1",
                                    api_key_env="PLUTO_API_KEY", retries=0, timeout=5))
    assert said == ("Could not reach the model service at http://127.0.0.1:9/v1. Check "
                    "PLUTO_API_BASE (api_base in pluto.yaml) and that the server is up.")
    assert "pw" not in said


async def test_a_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("PLUTO_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    said = await fail(ModelSettings(model="openai/gpt-4o-mini", api_key_env="PLUTO_API_KEY",
                                    retries=0, timeout=5))
    assert said == ("No API key is set for the model openai/gpt-4o-mini: set the environment "
                    "variable PLUTO_API_KEY (api_key_env in pluto.yaml).")


async def test_a_wrong_key_is_named_but_never_shown(fake, monkeypatch):
    monkeypatch.setenv("PLUTO_API_KEY", "sk-wrong-value-123")
    fake.script(Reply(status=401, error_message="Incorrect API key provided: sk-wrong-value-123"))
    said = await fail(ModelSettings(model="openai/fake", api_base=fake.base_url,
                                    api_key_env="PLUTO_API_KEY", retries=0))
    assert "rejected the API key in PLUTO_API_KEY" in said and "sk-wrong-value" not in said


async def test_a_model_without_a_provider_prefix_says_how_to_write_it(monkeypatch):
    said = await fail(ModelSettings(model="gpt-4o-mimi", api_base="http://127.0.0.1:9/v1",
                                    retries=0))
    assert said.startswith("The model name 'gpt-4o-mimi' does not say which service serves it")


def test_reasons_and_endpoints_are_short_and_clean() -> None:
    assert endpoint("https://u:p@host.example:8443/v1?key=x") == "https://host.example:8443/v1"
    assert endpoint(None) == ""
    long = Exception("litellm.BadRequestError: OpenAIException - " + "x" * 1000 + "\nmore")
    reason = service_reason(long)
    assert len(reason) == 240 and reason.endswith("…") and "OpenAIException" not in reason
    assert service_reason(Exception("key sk-abcdefghijk leaked")) == "key sk-*** leaked"


# ---- (7) small surprises --------------------------------------------------------------


def test_explaining_a_provider_that_does_not_exist_warns(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "config", tmp_path / "config")
    out = subprocess.run([*pluto_cmd(), "routes", "explain", "--provider", "telgram", "--chat",
                          "1", "--user", "2"], cwd=tmp_path, capture_output=True, text=True,
                         env=clean_env(PYTHONPATH=os.pathsep.join(sys.path)), timeout=60)
    assert out.stderr.startswith("warning: no provider named 'telgram' in pluto.yaml "
                                 "(configured: api, cli, web); did you mean 'telegram'?")
    installed = subprocess.run([*pluto_cmd(), "routes", "explain", "--provider", "telegram",
                                "--chat", "1", "--user", "2"], cwd=tmp_path, capture_output=True,
                               text=True, env=clean_env(PYTHONPATH=os.pathsep.join(sys.path)),
                               timeout=60)
    # installed but not set up: said so, never "did you mean 'telegram'?" to 'telegram'
    assert installed.stderr.startswith("warning: the provider 'telegram' is not in pluto.yaml "
                                       "(configured: api, cli, web).")
    assert "did you mean" not in installed.stderr
    known = subprocess.run([*pluto_cmd(), "routes", "explain", "--provider", "cli", "--chat",
                            "1", "--user", "2"], cwd=tmp_path, capture_output=True, text=True,
                           env=clean_env(PYTHONPATH=os.pathsep.join(sys.path)), timeout=60)
    assert "warning" not in known.stderr and known.returncode == 0


@pytest.mark.parametrize(("value", "people", "model"), [
    (12.639070257304708, "12.6391", "12.63907026"), (0.30000000000000004, "0.3", "0.3"),
    (1234567.891, "1234567.89", "1234567.891"), (-0.000001234, "-1.234e-06", "-1.234e-06"),
    (3.0, "3", "3"), (0.0, "0", "0"), (float("nan"), "nan", "nan"), (7, "7", "7"),
])
def test_numbers_are_rounded_for_people_and_exact_enough_for_the_model(
        value: object, people: str, model: str) -> None:
    from pluto.runtime.data.format import model_text, people_text

    assert people_text(value) == people and model_text(value) == model


# ---- (3)(6) the terminal draws Markdown: bold, code, aligned tables, words kept whole ----


REPLY = ("The **busiest** carrier is `UA`, then AA \\[see below\\]. This sentence is long "
         "enough that it has to wrap at a word boundary on a narrow terminal screen.\n\n"
         "| carrier | flights | avg_delay | a | b | c | d |\n"
         "| --- | ---: | ---: | --- | --- | --- | --- |\n"
         "| UA | 58,665 | 12.1 | x | y | z | w |\n"
         "| AA | 2 | 8.6 | x | y | z | w |\n")


def drawn(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def assert_readable(lines: list[str], width: int) -> None:
    body = "\n".join(lines)
    assert "**" not in body and "`" not in body and "|---" not in body and "\\[" not in body
    assert "[see below]" in body and all(len(line) <= width for line in lines)
    words = set(REPLY.replace("\n", " ").split())
    assert "boundary" in body and "bound-" not in body
    assert not [w for w in body.split() if w.isalpha() and len(w) > 3 and w not in words
                and w not in {"busiest", "carrier", "avg_delay"}], body
    header = next(line for line in lines if "carrier" in line and "flights" in line)
    first = next(line for line in lines if line.lstrip().startswith("UA"))
    second = next(line for line in lines if line.lstrip().startswith("AA"))
    assert header.index("carrier") == first.index("UA")  # the header sits over its rows
    # numbers right-aligned: their last digits end where the header's column ends
    assert first.index("58,665") + 6 == second.index(" 2 ") + 2 == header.index("flights") + 7


async def test_the_terminal_renders_markdown_replies() -> None:
    import io

    from pluto.providers.cli import CliProvider
    from pluto.types import OutgoingMessage

    out = io.StringIO()
    cli = CliProvider(None, out=out, err=io.StringIO(), markdown=True, width=60)  # type: ignore[arg-type]
    await cli.send(OutgoingMessage(chat_id="terminal", text=REPLY, run_id="r1", seq=1))
    assert_readable(drawn(out.getvalue()), 60)


async def test_a_streamed_reply_is_drawn_as_markdown_when_complete() -> None:
    import io

    from pluto.providers.cli import CliProvider

    out = io.StringIO()
    cli = CliProvider(None, out=out, err=io.StringIO(), markdown=True, width=60)  # type: ignore[arg-type]
    for i in range(0, len(REPLY), 7):
        cli._delta("r2", REPLY[i:i + 7])
    cli._end_line("r2")
    assert_readable(drawn(out.getvalue()), 60)


async def test_pipes_get_the_text_as_written() -> None:
    import io

    from pluto.providers.cli import CliProvider
    from pluto.types import OutgoingMessage

    out = io.StringIO()
    cli = CliProvider(None, out=out, err=io.StringIO())  # type: ignore[arg-type]
    assert cli.screen.markdown is False
    await cli.send(OutgoingMessage(chat_id="terminal", text=REPLY, run_id="r3", seq=1))
    assert out.getvalue() == REPLY + "\n"


def test_model_tables_get_numbers_aligned_right() -> None:
    from pluto.gateway.delivery.render.ir import Table, parse

    [table] = parse("| name | n | share | code | left |\n|---|---|---|---|:--|\n"
                    "| x | 1,234 | 12.5% | A1 | 3 |\n| y | -5.5 | 3% | B2 | 4 |\n| z |  | 1e-3 | 7 | 5 |")
    assert isinstance(table, Table)
    assert table.aligns == ("left", "right", "right", "left", "left")  # ':--' was asked for


# ---- the newcomer: the wheel in a fresh venv, outside the repository --------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_newcomer_installs_the_wheel_and_gets_going(tmp_path: Path) -> None:
    """pip install of the wheel in a fresh venv, then in a directory of their own: pluto init,
    pluto doctor against the fake model server, the chart example delivering a PNG, pluto data
    add of a CSV with NA values and avg() over it; then (issue 37) a CSV named semi.csv (an SQL
    keyword) added and queried, and pluto serve: a chart fetched through the HTTP API's
    artifacts endpoint, and the A2A card's URL answering message/send."""
    from tests.test_packaging import BUILD_LOCK, _not_source, _Venv

    work = tmp_path / "home"
    work.mkdir()
    venv = _Venv(tmp_path / "venv", cwd=work)
    src, dist = tmp_path / "src", tmp_path / "dist"
    shutil.copytree(ROOT, src, ignore=_not_source)
    venv.pip("install", "--quiet", "--require-hashes", "-r", str(BUILD_LOCK))
    venv.pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(dist),
             str(src))
    (wheel,) = dist.glob("pluto_gateway-*.whl")
    venv.pip("install", "--quiet", "--no-deps", str(wheel))
    exe = str(Path(venv.python).parent / "pluto")

    with FakeOpenAI.in_thread(api_key="sk-newcomer") as fake:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PLUTO_", "PYTHON"))} | {"PYTHONUNBUFFERED": "1"}

        def pluto(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([exe, *args], cwd=work, env=env | extra, text=True,
                                  capture_output=True, timeout=120, stdin=subprocess.DEVNULL)

        lost = pluto("chat")
        assert lost.returncode == 2 and "make one with 'pluto init'" in lost.stderr
        made = pluto("init", "--model", "openai/fake", "--api-base", fake.base_url)
        assert made.returncode == 0, made.stderr
        assert (work / "config" / "pluto.yaml").is_file()
        (work / "config" / ".env").write_text("PLUTO_API_KEY=sk-newcomer\n")

        fake.script(Reply(text="OK"))
        doctor = pluto("doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "ok    model default: openai/fake answered" in doctor.stdout

        fake.script(Reply(tool_calls=[CHART]), Reply(text="December sold best."))
        chart = pluto("run", "which product sold best in Q4 2024? draw it by month")
        assert chart.returncode == 0, chart.stderr
        [line] = [ln for ln in chart.stdout.splitlines() if ln.startswith("[image: ")]
        png = Path(line.removeprefix("[image: ").rstrip("]"))
        assert png.is_relative_to(work / ".pluto" / "artifacts")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        (work / "flights.csv").write_text("year,carrier,dep_delay\n2013,UA,2\n2013,AA,NA\n"
                                          "2013,B6,-4\n2013,UA,NA\n2013,DL,17\n")
        added = pluto("data", "add", "flights.csv")
        assert added.returncode == 0, added.stderr
        assert added.stdout.startswith("Added dataset flights: 5 rows × 3 columns")
        avg = pluto("run", "/sql SELECT avg(dep_delay) AS mean, count(dep_delay) AS n "
                           "FROM flights")
        assert avg.returncode == 0, avg.stderr
        assert [ln.split() for ln in avg.stdout.splitlines() if "|" in ln][-1] == [
            "|", "5", "|", "3", "|"]

        (work / "semi.csv").write_text("region,amount\nNorth,12.50\nSouth,3.25\nNorth,1\n")
        added = pluto("data", "add", "semi.csv")
        assert added.returncode == 0, added.stderr
        assert added.stdout.strip() == ('Added dataset semi: 3 rows × 2 columns (region, '
                                        'amount). semi is an SQL keyword: write it "semi" in '
                                        'queries.')
        total = pluto("run", '/sql SELECT sum(amount) AS total FROM "semi"')
        assert total.returncode == 0, total.stderr
        assert [ln.split() for ln in total.stdout.splitlines() if "|" in ln][-1] == [
            "|", "16.75", "|"]
        _serve_chart_and_a2a(exe, work, env, fake)


API_KEY = "newcomer-api-key-0123456789"


def _serve_chart_and_a2a(exe: str, work: Path, env: dict[str, str], fake: FakeOpenAI) -> None:
    """pluto serve from the wheel: a chart of semi through the HTTP API and its artifacts
    endpoint, then the A2A card's URL."""
    import json
    import re
    import signal
    import urllib.request

    serve = subprocess.Popen([exe, "serve", "--port", "0"], cwd=work,
                             env=env | {"PLUTO_API_KEYS": API_KEY}, text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL)
    try:
        assert serve.stderr is not None
        base = None
        for line in serve.stderr:  # until it listens (it says so once, or ends)
            if found := re.search(r"listening on (http://127\.0\.0\.1:\d+)", line):
                base = found.group(1)
                break
        assert base is not None, "pluto serve never listened"

        def call(method: str, path: str, body: object = None,
                 auth: bool = True) -> tuple[int, str, bytes]:
            request = urllib.request.Request(
                path if path.startswith("http") else base + path, method=method,
                data=json.dumps(body).encode() if body is not None else None,
                headers={"Authorization": f"Bearer {API_KEY}"} if auth else {})
            with urllib.request.urlopen(request, timeout=90) as resp:
                return resp.status, resp.headers.get("Content-Type", ""), resp.read()

        fake.script(Reply(tool_calls=[ToolCall("make_chart", {
            "sql": 'SELECT region, sum(amount) AS total FROM "semi" GROUP BY 1 ORDER BY 1',
            "kind": "bar"})]), Reply(text="North sold most."))
        status, _, body = call("POST", "/api/v1/agent/tasks?wait=60",
                               {"input": "chart semi by region"})
        task = json.loads(body)
        step = task["last_step"]
        assert status == 201 and step["output"] == "North sold most.", step
        [chart] = step["artifacts"]
        assert chart["media_type"] == "image/png" and str(work) not in body.decode()
        status, ctype, png = call("GET", chart["url"])
        assert (status, ctype, png[:8]) == (200, "image/png", b"\x89PNG\r\n\x1a\n")

        _, _, raw = call("GET", "/agents/default/.well-known/agent-card.json", auth=False)
        card = json.loads(raw)
        assert card["url"] == f"{base}/agents/default"
        fake.script(Reply(text="Hello, agent."))
        _, _, raw = call("POST", card["url"], {
            "jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
                "role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hi"}]}}})
        answer = json.loads(raw)["result"]
        assert answer["status"]["state"] == "completed"
        assert answer["artifacts"][0]["parts"] == [{"kind": "text", "text": "Hello, agent."}]
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.communicate()


async def test_the_shipped_config_delivers_the_chart_on_the_widget_and_telegram(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The headline example with the shipped config (data_dir: .pluto, relative to where pluto
    runs): the chart reaches the widget (a signed link that serves the PNG) and Telegram (a
    photo)."""
    import aiohttp

    from pluto.gateway.app import Gateway
    from pluto.runtime.model import ToolCall as Call
    from pluto.runtime.testing import Scripted, ScriptedModel
    from tests.fakes.telegram_server import DEFAULT_TOKEN, FakeTelegram
    from tests.helpers.served import Tab, url, wait_for

    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "config", tmp_path / "config")
    shipped = load_pluto_config(Path("config"))
    assert shipped.data_dir == tmp_path / ".pluto"
    chart = Call("c1", CHART.name, json_args(CHART.arguments))
    model = ScriptedModel(Scripted(tool_calls=[chart]), Scripted(text="December sold best."),
                          Scripted(tool_calls=[Call("c2", CHART.name,
                                                    json_args(CHART.arguments))]),
                          Scripted(text="December sold best."))
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", DEFAULT_TOKEN)
    async with FakeTelegram() as fake:
        providers = {**{k: v.model_dump() for k, v in shipped.providers.items()},
                     "telegram": {"enabled": True, "base_url": fake.url, "poll_timeout": 1}}
        config = shipped.model_copy(update={"providers": {
            k: type(shipped.providers["web"])(**v) for k, v in providers.items()}})
        gw = Gateway(Path("config"), config=config, model_factory=model, serve=True,
                     http_bind=("127.0.0.1", 0))
        async with gw, aiohttp.ClientSession() as session:
            await wait_for(lambda: all(gw.health[n].state == "running"
                                       for n in ("web", "telegram")))
            tab = await Tab.open(session, gw)
            await tab.ask("which product sold best in Q4 2024? draw it by month")
            [shown] = [f["details"] for f in tab.frames
                       if f.get("type") == "tool.end" and "image" in f.get("details", {})]
            async with session.get(url(gw, shown["image"])) as got:
                assert got.status == 200 and (await got.read())[:4] == b"\x89PNG"

            fake.inject_message(4242, "which product sold best in Q4 2024? draw it by month")
            photos = await wait_for(lambda: [s for s in fake.messages(4242)
                                             if s.kind == "photo"], timeout=30)
            assert photos[0].file_bytes[:4] == b"\x89PNG"
    assert not (tmp_path / ".pluto" / ".pluto").exists()
    assert len(list((tmp_path / ".pluto" / "artifacts").rglob("*.png"))) == 2


def json_args(arguments: object) -> str:
    import json

    return json.dumps(arguments)


async def test_admin_api_errors_carry_a_code_like_the_api(config_dir: Path, data_dir: Path,
                                                          monkeypatch) -> None:
    import aiohttp

    from tests.test_admin import AUTH, KEY, make_admin

    monkeypatch.setenv("PLUTO_ADMIN_KEY", KEY)
    gw, _ = await make_admin(config_dir, data_dir)
    try:
        base = f"http://127.0.0.1:{gw.http.port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/admin/agents") as r:
                assert r.status == 401 and (await r.json())["code"] == "unauthorized"
            async with http.get(base + "/admin/agents/nobody", headers=AUTH) as r:
                body = await r.json()
                assert r.status == 404 and body == {"error": "no agent named 'nobody'",
                                                    "code": "not_found"}
    finally:
        await gw.stop()


async def test_a_query_over_a_text_column_fails_in_one_short_sentence(tmp_path: Path) -> None:
    """avg() of a column of text was a 700-character binder error listing every candidate."""
    from pluto.runtime.data import DataService
    from pluto.runtime.data.child import QueryError

    service = DataService(tmp_path, demo=False)
    source = tmp_path / "t.csv"
    source.write_text("code,label\nA1,x\nB2,y\n")
    service.warehouse().ingest(source, "t")
    with pytest.raises(QueryError) as caught:
        await service.query("SELECT avg(code) FROM t", None)
    said = str(caught.value)
    assert len(said) < 250 and "Candidate" not in said
    assert said.endswith("The column holds text: convert it, e.g. TRY_CAST(column AS DOUBLE).")


async def test_a_missing_key_of_another_service_names_the_variable(monkeypatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("PLUTO_API_KEY", raising=False)
    said = await fail(ModelSettings(model="anthropic/claude-x", api_key_env="PLUTO_API_KEY",
                                    retries=0, timeout=5))
    assert said == ("No API key is set for the model anthropic/claude-x: set the environment "
                    "variable PLUTO_API_KEY (api_key_env in pluto.yaml).")
