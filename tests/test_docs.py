"""The README and the manual (issue 37): the README fits one screen and starts with the two
commands, the manual builds as a site with ``mkdocs build --strict`` (a broken link or a page
missing from the nav fails), and the shell commands the docs show are run as written."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
INSTALL = "bash scripts/install.sh && pluto chat"
TEST = "bash scripts/test.sh"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUTO_")}
    # the `pluto` of this interpreter first (the one `bash scripts/install.sh` installed)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env |= {"PYTHONUNBUFFERED": "1", "NO_MKDOCS_2_WARNING": "1", "NO_COLOR": "1"}
    return env | extra


def _blocks(path: Path) -> list[tuple[str, str]]:
    """The fenced code blocks of a Markdown file: (language, text)."""
    return [(m[1], m[2]) for m in re.finditer(r"^```(\w*)\n(.*?)^```", path.read_text(),
                                               re.S | re.M)]


def _section_blocks(path: Path, heading: str) -> list[str]:
    text = path.read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n#", start + len(heading) + 2)
    part = text[start:end if end != -1 else None]
    return [m[1] for m in re.finditer(r"^```bash\n(.*?)^```", part, re.S | re.M)]


def mkdocs(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


# ---- the README ----------------------------------------------------------------------------


def test_readme_is_one_screen_with_the_two_commands_first() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 45, f"the README is {len(lines)} lines: the manual is docs/"
    blocks = _blocks(README)
    assert [text.strip() for _, text in blocks[:2]] == [INSTALL, TEST]
    text = README.read_text()
    assert "Python ≥ 3.11" in text and "python3 -m venv" in text
    assert "## A 5-minute tour" in text


def test_readme_links_point_at_pages_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+)[^)]*\)", README.read_text())
    assert links
    for link in links:
        if not link.startswith(("http://", "https://")):
            assert (ROOT / link).exists(), link


def test_the_commands_of_the_readme_are_the_ones_scripts_and_ci_run() -> None:
    """The two commands name real scripts: the install script takes no argument for the
    gateway and `test` for the suite, and CI runs the second."""
    assert (ROOT / "scripts" / "install.sh").is_file()
    assert "bash scripts/install.sh test" in (ROOT / "scripts" / "test.sh").read_text()
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


# ---- the site -------------------------------------------------------------------------------


def test_the_manual_builds_strict(tmp_path: Path) -> None:
    out = mkdocs("build", "--strict", "--site-dir", str(tmp_path / "site"), cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "routing" / "index.html").is_file()


def test_every_page_of_docs_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert [p for p in pages if f": {p}" not in nav] == []


def _copy_site(tmp_path: Path) -> Path:
    site = tmp_path / "manual"
    shutil.copytree(ROOT / "docs", site / "docs")
    shutil.copy(ROOT / "mkdocs.yml", site / "mkdocs.yml")
    return site


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    site = _copy_site(tmp_path)
    with (site / "docs" / "routing.md").open("a") as f:
        f.write("\nSee [the missing page](no-such-page.md).\n")
    out = mkdocs("build", "--strict", "--site-dir", str(tmp_path / "site"), cwd=site)
    assert out.returncode != 0
    assert "no-such-page.md" in out.stdout + out.stderr


def test_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path) -> None:
    site = _copy_site(tmp_path)
    (site / "docs" / "orphan.md").write_text("# Orphan\n")
    out = mkdocs("build", "--strict", "--site-dir", str(tmp_path / "site"), cwd=site)
    assert out.returncode != 0
    assert "orphan.md" in out.stdout + out.stderr


# ---- the commands the docs show ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_until_ready(line: str, cwd: Path) -> None:
    """`pluto serve` as shown, on a free port: it answers /readyz, then stops on SIGINT."""
    port = _free_port()
    proc = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=cwd,
                            env=_env(PLUTO_HTTP_PORT=str(port)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert proc.poll() is None, f"{line!r} ended: {proc.stdout.read()}"  # type: ignore[union-attr]
                assert time.monotonic() < deadline, f"{line!r} did not become ready"
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
            assert "widget" in page.read().decode()
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    assert code == 0, proc.stdout.read()  # type: ignore[union-attr]


def run_shown(block: str, cwd: Path) -> list[str]:
    """Runs each command line of a shell block in order, as a reader would; returns their
    outputs. `pluto chat` gets one command on its input, `pluto serve` runs until ready."""
    outputs = []
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        command = line.split("  #")[0].strip()
        if command.startswith("pluto serve"):
            _serve_until_ready(command, cwd)
            outputs.append("")
            continue
        chat = command.startswith("pluto chat")
        out = subprocess.run(["bash", "-c", command], cwd=cwd, env=_env(), text=True,
                             capture_output=True, timeout=120,
                             input="/help\n" if chat else None)
        assert out.returncode == 0, f"{command!r} exited {out.returncode}: {out.stderr}"
        assert "Traceback" not in out.stdout + out.stderr, command
        outputs.append(out.stdout)
    return outputs


def test_the_readme_tour_runs_as_shown(tmp_path: Path) -> None:
    """The tour, in a checkout's layout (./config), every line exit 0 and saying what the
    comments promise."""
    shutil.copytree(ROOT / "config", tmp_path / "config")
    [tour] = _section_blocks(README, "## A 5-minute tour")
    assert tour.count("pluto ") >= 6
    out = run_shown(tour, tmp_path)
    doctor, help_, sql, _, added, described, explained, _ = out
    assert "All good" in doctor
    assert "/sql" in help_ and "/datasets" in help_
    assert "| region |" in sql and "(4 rows)" in sql
    assert added.startswith("Added dataset visits: 2 rows × 2 columns")
    assert "visits" in described and "VARCHAR" in described
    assert "rule 'terminal' matched" in explained


def test_the_install_page_from_the_wheel_runs_as_shown(tmp_path: Path) -> None:
    """`pluto init`, `pluto doctor`, `pluto chat` in an empty directory (docs/install.md)."""
    blocks = _section_blocks(ROOT / "docs" / "install.md", "## From the wheel")
    assert len(blocks) == 1
    init, doctor, chat = run_shown(blocks[0], tmp_path)
    assert init.startswith("Wrote config/")
    assert "All good" in doctor
    assert "/help" in chat and "Commands:" in chat


def test_a_command_that_fails_fails_the_docs_test(tmp_path: Path) -> None:
    """The runner itself: a shown command that exits non-zero is reported, not passed over."""
    with pytest.raises(AssertionError, match="pluto routes check.*exited 2"):
        run_shown("pluto routes check   # no config here\n", tmp_path)
