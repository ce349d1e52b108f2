"""Packaging: one import name, a wheel that lives beside openai-agents, and hashed lock files.

The layers are folders at the repository root (gateway/, providers/, ...) installed under the one
import name `pluto` (pyproject.toml: [tool.setuptools] packages and package-dir). A wheel that
claimed generic top-level names (`agents`, `gateway`, ...) broke the openai-agents SDK, which
imports as `agents`: installing one overwrote the other and uninstalling one removed the other.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("pluto", "gateway", "providers", "agents", "runtime", "storage")
DATA_PACKAGES = {"pluto.config": "config"}  # files only (no code): the example configuration
LOCK = ROOT / "requirements" / "lock.txt"
RUNTIME_LOCK = ROOT / "requirements" / "runtime.txt"
BENCH_LOCK = ROOT / "requirements" / "bench.txt"
BUILD_LOCK = ROOT / "requirements" / "build.txt"
AGENTS_LOCK = ROOT / "tests" / "packaging" / "openai-agents.lock"
REGENERATE = "bash scripts/lock.sh"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _package_folders() -> dict[str, Path]:
    """Every package folder of the layers, by the name it installs as."""
    found: dict[str, Path] = {}
    for layer in LAYERS:
        for init in sorted((ROOT / layer).rglob("__init__.py")):
            parts = init.parent.relative_to(ROOT).parts
            if "__pycache__" in parts:
                continue
            name = ".".join(parts if parts[0] == "pluto" else ("pluto", *parts))
            assert name not in found, f"{name} is both {found[name]} and {init.parent}"
            found[name] = init.parent
    return found


# --- one import name ------------------------------------------------------------------------


def test_packages_list_names_every_package_folder():
    setuptools = _pyproject()["tool"]["setuptools"]
    listed = setuptools["packages"]
    where = "pyproject.toml [tool.setuptools] packages"
    twice = sorted({name for name in listed if listed.count(name) > 1})
    assert not twice, f"{where} lists twice: {twice}"
    folders = _package_folders()
    missing = [f"{n} ({folders[n].relative_to(ROOT)}/)" for n in sorted(set(folders) - set(listed))]
    assert not missing, f"{where} misses package folders (not in the wheel): {', '.join(missing)}"
    stale = sorted(set(listed) - set(folders) - set(DATA_PACKAGES))
    assert not stale, f"{where} lists packages that have no folder: {stale}"
    layers = {f"pluto.{layer}": layer for layer in LAYERS if layer != "pluto"}
    assert setuptools["package-dir"] == {"pluto": "pluto", **layers, **DATA_PACKAGES}


# --- hashed lock files ----------------------------------------------------------------------


def _read_lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """{canonical name: (version, [sha256 hashes])} of a pip requirements file with hashes."""
    where = path.relative_to(ROOT)
    assert path.is_file(), f"{where} is missing: run `{REGENERATE}`"
    text = path.read_text(encoding="utf-8")
    assert REGENERATE in text[:400], f"{where}: its header should say `{REGENERATE}` regenerates it"
    entries: dict[str, tuple[str, list[str]]] = {}
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", line)
        assert m, f"{where}: not an exact pin: {line[:120]}"
        name = canonicalize_name(m.group(1))
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})\b", line)
        assert hashes, f"{where}: {name} has no --hash=sha256: (--require-hashes refuses it)"
        assert name not in entries, f"{where}: {name} is pinned twice"
        entries[name] = (m.group(2), hashes)
    return entries


def _pins(*groups: list[str]) -> dict[str, str]:
    """{canonical name: version} of pyproject.toml requirements, each of which must be `==`."""
    pins = {}
    for text in (text for group in groups for text in group):
        specs = list(Requirement(text).specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"pyproject.toml: {text!r} is no pin"
        pins[canonicalize_name(Requirement(text).name)] = specs[0].version
    return pins


def _assert_locked(pins: dict[str, str], lock: dict[str, tuple[str, list[str]]], path: Path):
    stale = [
        f"{name}=={version} (lock: {lock[name][0] if name in lock else 'missing'})"
        for name, version in sorted(pins.items())
        if lock.get(name, (None,))[0] != version
    ]
    where = path.relative_to(ROOT)
    assert not stale, f"{where} is stale, run `{REGENERATE}`: {', '.join(stale)}"


def test_lock_pins_every_requirement_with_hashes():
    project = _pyproject()["project"]
    pins = _pins(project["dependencies"], project["optional-dependencies"]["test"])
    _assert_locked(pins, _read_lock(LOCK), LOCK)


def test_other_locks_agree_with_the_main_lock():
    project = _pyproject()["project"]
    lock = _read_lock(LOCK)
    runtime = _read_lock(RUNTIME_LOCK)
    _assert_locked(_pins(project["dependencies"]), runtime, RUNTIME_LOCK)
    bench = _read_lock(BENCH_LOCK)
    bench_pins = _pins(project["dependencies"], project["optional-dependencies"]["bench"])
    _assert_locked(bench_pins, bench, BENCH_LOCK)
    agents = _read_lock(AGENTS_LOCK)
    assert "openai-agents" in agents
    for path, other in ((RUNTIME_LOCK, runtime), (BENCH_LOCK, bench), (AGENTS_LOCK, agents)):
        # the same versions as lock.txt, so that one environment holds Pluto and these
        _assert_locked({name: lock[name][0] for name in set(lock) & set(other)}, other, path)
    build = _read_lock(BUILD_LOCK)
    for text in _pyproject()["build-system"]["requires"]:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in build and req.specifier.contains(build[name][0]), (
            f"{BUILD_LOCK.relative_to(ROOT)} does not meet [build-system] requires {text!r}: "
            f"run `{REGENERATE}`"
        )


def test_dockerfile_installs_from_the_locks_and_copies_every_layer():
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    copied = set(re.findall(r"^COPY\s+(\S+)\s+\./\1/?\s*$", dockerfile, re.M))
    layers = set(_pyproject()["tool"]["setuptools"]["package-dir"].values())
    assert layers <= copied, f"the Dockerfile does not COPY {sorted(layers - copied)}"
    installs = [
        line for line in re.sub(r"\\\n", " ", dockerfile).splitlines() if "pip install" in line
    ]
    assert any("--require-hashes" in line and "requirements/runtime.txt" in line
               for line in installs), installs
    assert any("--no-deps" in line and re.search(r"pip install [^&]*\s\.(\s|$)", line)
               for line in installs), installs


# --- the wheel, beside openai-agents --------------------------------------------------------


def _not_source(directory: str, names: list[str]) -> set[str]:
    """What is not copied from the work tree to build from (stale build/ output gets packaged)."""
    skip = {n for n in names if n in (".git", "__pycache__") or n.endswith(".egg-info")}
    rel = Path(directory).resolve().relative_to(ROOT).as_posix()
    if rel == ".":
        skip |= set(names) & {"build", "dist", ".venv", ".pluto", ".hypothesis", ".pytest_cache"}
    elif rel == "bench":
        skip |= set(names) & {"results"}
    return skip


_CHECK = textwrap.dedent(
    """
    import importlib, json, sys
    for spec in sys.argv[1:]:
        module, _, attr = spec.partition(":")
        mod = importlib.import_module(module)
        if attr:
            getattr(mod, attr)
    print(json.dumps({name: getattr(mod, "__file__", None) for name, mod in sys.modules.items()
                      if name.split(".")[0] in ("pluto", "agents")}))
    """
)


class _Venv:
    """A virtual environment whose own site-packages comes first, then this interpreter's.

    Pluto's runtime dependencies are already installed where the tests run, so they are reached
    through a .pth that lists this interpreter's site-packages (a plain path line: the .pth files
    in there, such as the editable install's finder that maps `pluto` to this checkout, are not
    run). pip is this interpreter's; it installs and uninstalls in the venv only.
    """

    def __init__(self, path: Path, cwd: Path):
        self.cwd = cwd
        venv = [sys.executable, "-m", "venv", "--without-pip", str(path)]
        subprocess.run(venv, check=True, cwd=cwd)
        self.python = str(path / "bin" / "python")
        purelib = self.run("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        self.site = Path(purelib.strip()).resolve()
        outer = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
        (self.site / "_outer_site_packages.pth").write_text("".join(f"{p}\n" for p in outer))

    def run(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        proc = subprocess.run([self.python, "-I", *args], cwd=self.cwd, env=env,
                              capture_output=True, text=True, timeout=240)
        label = " ".join("<script>" if "\n" in a else a for a in args)[:300]
        assert proc.returncode == 0, (
            f"{label} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
        return proc.stdout

    def pip(self, *args: str) -> str:
        return self.run("-m", "pip", "--disable-pip-version-check", "--no-input", *args)

    def imports(self, *specs: str) -> dict[str, str | None]:
        """Imports each `module` or `module:attribute` in one process: {module: its file}."""
        return json.loads(self.run("-c", _CHECK, *specs).strip().splitlines()[-1])

    def record(self, dist_info_glob: str) -> dict[Path, str]:
        """The files a distribution installed and their hashes, from its RECORD (.pyc left out)."""
        found = list(self.site.glob(dist_info_glob))
        assert len(found) == 1, f"{dist_info_glob} in the venv: {found}"
        with open(found[0] / "RECORD", newline="", encoding="utf-8") as f:
            rows = [row for row in csv.reader(f) if row and not row[0].endswith(".pyc")]
        return {(self.site / row[0]).resolve(): row[1] for row in rows}


def _damaged(record: dict[Path, str]) -> list[str]:
    """The files of a RECORD that are gone or no longer hold what was installed."""
    damaged = []
    for path, digest in record.items():
        if not path.is_file():
            damaged.append(f"{path} (gone)")
        elif digest.startswith("sha256="):
            actual = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest())
            if digest != "sha256=" + actual.rstrip(b"=").decode():
                damaged.append(f"{path} (changed)")
    return damaged


@pytest.mark.timeout(360)  # a first run downloads openai-agents' dependencies, later ones not
def test_wheel_installs_beside_openai_agents(tmp_path):
    started = time.monotonic()
    packages = _pyproject()["tool"]["setuptools"]["packages"]
    work = tmp_path / "work"  # every command runs here, outside the repository
    work.mkdir()
    venv = _Venv(tmp_path / "venv", cwd=work)

    # The wheel, built from a copy of the work tree with the pinned, hashed build backend.
    src, dist = tmp_path / "src", tmp_path / "dist"
    shutil.copytree(ROOT, src, ignore=_not_source)
    venv.pip("install", "--quiet", "--require-hashes", "-r", str(BUILD_LOCK))
    venv.pip("wheel", "--quiet", "--no-deps", "--no-build-isolation",
             "--check-build-dependencies", "--wheel-dir", str(dist), str(src))
    (wheel,) = dist.glob("pluto_gateway-*.whl")

    # One top-level name: pluto/ and the wheel's .dist-info/, nothing else.
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    dist_info = [top for top in tops if top.endswith(".dist-info")]
    assert len(dist_info) == 1 and tops == {"pluto", *dist_info}, f"top-level names: {tops}"
    assert "pluto/providers/web/static/widget.js" in names
    for package in packages:
        if package in DATA_PACKAGES:
            assert package.replace(".", "/") + "/pluto.yaml" in names, f"{package}: not in it"
            continue
        assert package.replace(".", "/") + "/__init__.py" in names, f"{package}: not in the wheel"

    # openai-agents first (with its dependencies, from the hashed lock), then Pluto's wheel.
    venv.pip("install", "--quiet", "--require-hashes", "-r", str(AGENTS_LOCK))
    agents_files = venv.record("openai_agents-*.dist-info")
    venv.pip("install", "--quiet", "--no-deps", "--ignore-installed", str(wheel))
    pluto_files = venv.record("pluto_gateway-*.dist-info")
    agents_init = venv.site / "agents" / "__init__.py"
    assert agents_init in agents_files
    damaged = _damaged(agents_files)
    assert not damaged, f"installing Pluto overwrote openai-agents files: {damaged[:10]}"

    def assert_from_venv(files: dict[str, str | None], top: str) -> None:
        stray = {
            name: file for name, file in files.items()
            if name.split(".")[0] == top and file
            and not Path(file).resolve().is_relative_to(venv.site)
        }
        assert not stray, f"imported from outside the venv: {stray}"

    # Both import, in one process, each from its own files in the venv.
    files = venv.imports("agents:Agent", "pluto.gateway.app",
                         *(p for p in packages if p not in DATA_PACKAGES))
    assert Path(files["pluto"]).resolve() == venv.site / "pluto" / "__init__.py"
    assert Path(files["agents"]).resolve() == agents_init
    assert_from_venv(files, "pluto")
    assert_from_venv(files, "agents")

    # Uninstalling Pluto leaves openai-agents whole.
    venv.pip("uninstall", "--yes", "pluto-gateway")
    assert not (venv.site / "pluto").exists(), "pip uninstall pluto-gateway left pluto/ behind"
    damaged = _damaged(agents_files)
    assert not damaged, f"uninstalling pluto-gateway damaged openai-agents: {damaged[:10]}"
    assert_from_venv(venv.imports("agents:Agent", "agents:Runner"), "agents")

    # Uninstalling openai-agents leaves Pluto whole.
    venv.pip("install", "--quiet", "--no-deps", "--ignore-installed", str(wheel))
    venv.pip("uninstall", "--yes", "openai-agents")
    assert not agents_init.exists(), "pip uninstall openai-agents left agents/ behind"
    damaged = _damaged(pluto_files)
    assert not damaged, f"uninstalling openai-agents damaged Pluto: {damaged[:10]}"
    assert_from_venv(venv.imports("pluto.gateway.app", *packages), "pluto")

    print(f"wheel beside openai-agents: {time.monotonic() - started:.1f} s")
