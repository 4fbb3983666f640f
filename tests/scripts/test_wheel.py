"""The wheel, installed outside the checkout, runs the whole main job.

Built from a clean copy of the tree (the tracked and unignored files only: a stale build/ of the checkout cannot leak
deleted modules into it) and installed with `--no-deps` into two new venvs, each run from a directory outside the
checkout with no PYTHONPATH:
- A, Python 3.12, `[proxy,agents]`: polar-rollout (its own proxy, the scripted upstream, the answer agent) →
  polar-process (inside polar-rollout) → polar-export;
- B, Python 3.11, `[train]`: polar-verify on A's output with the tiny model;
- C, Python 3.12, `[proxy]` without `[agents]` (the SDKs hidden from it): polar-rollout with a python: agent stops
  before its preflight with the pip line of the extra.
In A, `polar-rollout` runs with no flag but `--upstream` (besides its required TASKS, --agent, --out): its CA goes to
the per-user directory ($XDG_DATA_HOME/polar, else ~/.local/share/polar), exact mode and the bwrap sandbox are its
defaults.
The third-party dependencies come from the project's own venvs (.venv, .venv-train) through one `.pth` line — the
same interpreter versions, and minutes of downloads saved — and the test checks that every dependency the wheel
declares for those extras is installed there, and that each `polar.*` package is imported from the new venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.support.need import BASE, TRAIN, VLLM, need, need_sandbox

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROXY_VENV, TRAIN_VENV = ROOT / ".venv", ROOT / ".venv-train"
TINY = ROOT / ".cache" / "models" / "tiny"
TASK = ROOT / "examples" / "tasks" / "vowel-share"
PINNED = "polar_sampling_override=temperature=1.0,top_p=1.0,top_k=-1"
CONSOLE_SCRIPTS = {"mitmdump": "mitmproxy.tools.main:mitmdump"}  # the dependencies' commands the wheel runs
# Every package pyproject.toml lists, and polar.records.out (the one module of polar.records that needs Polars).
PACKAGES = ("polar.records", "polar.records.out", "polar.launch", "polar.addon", "polar.addon.codecs", "polar.processor",
            "polar.rollout", "polar.rollout.sandbox", "polar.rollout.images", "polar.rollout.agents",
            "polar.rollout.serve", "polar.trainer", "polar.integrations")


def _require(path: Path, setup: str) -> None:
    need(None if path.exists() else f"{path} is missing", setup=setup)


def _base_python(venv: Path) -> str:
    """The interpreter a venv was made from (pyvenv.cfg's `home`), so the new venv has the same version."""
    cfg = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    version = cfg.get("version_info") or cfg.get("version", "")
    major_minor = ".".join(version.split(".")[:2])
    return str(Path(cfg["home"]) / f"python{major_minor}")


def _clean_env(home: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "CI")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["HOME"] = str(home)
    return env


def _run(argv: list, cwd: Path, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the tree's tracked and unignored files."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    src = tmp_path_factory.mktemp("wheel-src") / "src"
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():  # a tracked file deleted in the work tree is not part of the tree
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    dist = src.parent / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (built,) = dist.glob("polar_gateway-*.whl")
    return built


# The checkout's own install in a deps venv: never carried into a new venv.
OWN = ("__editable__.polar_gateway", "__editable___polar_gateway", "polar_gateway-")


def _venv(base_python: str, deps_venv: Path, wheel: Path, where: Path, linked: bool = False) -> Path:
    """A new venv at `where` holding the wheel (no deps), its third-party packages from `deps_venv`: through one
    `.pth` path line, or (`linked`) hard-linked into its own site-packages — what a bwrap sandbox, which mounts the
    venv and hides the rest of the host, needs to import them."""
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    deps = _site_packages(deps_venv / "bin" / "python")
    if linked:  # same filesystem: hard links take seconds and no space
        entries = [p for p in deps.iterdir() if not p.name.startswith(OWN)]
        proc = subprocess.run(["cp", "-al", *map(str, entries), str(_site_packages(python))], capture_output=True,
                              text=True, timeout=300)
        if proc.returncode != 0:  # another filesystem: copies
            subprocess.run(["cp", "-a", *map(str, entries), str(_site_packages(python))], check=True, timeout=600)
    else:
        # one path line, no import line: the deps venv's own .pth files (the checkout's editable finder) stay unread
        (_site_packages(python) / "polar-test-deps.pth").write_text(f"{deps}\n")
    for name, entry in CONSOLE_SCRIPTS.items():  # what pip writes for a dependency's console script
        if (deps_venv / "bin" / name).exists():
            module, func = entry.split(":")
            script = where / "bin" / name
            script.write_text(f"#!{python}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
            script.chmod(0o755)
    return where


def _check_installed(python: Path, extras: tuple[str, ...], cwd: Path, env: dict) -> None:
    """Every polar package comes from the new venv, never the checkout; every declared dependency is present."""
    code = (
        "import importlib, importlib.metadata as md, json, re, sys\n"
        f"packages = {list(PACKAGES)!r}\n"
        "files = {}\n"
        "for name in packages:\n"
        "    try:\n"
        "        files[name] = importlib.import_module(name).__file__\n"
        "    except ImportError as exc:\n"
        "        files[name] = f'ImportError: {exc}'\n"
        "missing = []\n"
        f"extras = {list(extras)!r}\n"
        "for req in md.requires('polar-gateway') or []:\n"
        "    name, _, marker = req.partition(';')\n"
        "    extra = re.search(r\"extra == ['\\\"](\\w+)\", marker)\n"
        "    if extra and extra.group(1) not in extras:\n"
        "        continue\n"
        "    if 'python_version' in marker and \"python_version>='3.12'\" in marker.replace(' ', '') \\\n"
        "            and sys.version_info < (3, 12):\n"
        "        continue\n"
        "    dist = re.match(r'[A-Za-z0-9_.-]+', name.strip()).group(0)\n"
        "    try:\n"
        "        md.version(dist)\n"
        "    except md.PackageNotFoundError:\n"
        "        missing.append(dist)\n"
        "print(json.dumps({'files': files, 'missing': missing, 'path': sys.path}))\n"
    )
    proc = _run([python, "-c", code], cwd, env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout)
    site = str(_site_packages(python))
    assert {name: f for name, f in info["files"].items() if not f.startswith(site)} == {}
    assert info["missing"] == []
    assert not any(p.startswith(str(ROOT)) and "site-packages" not in p for p in info["path"])


@pytest.fixture(scope="module")
def venv_a(wheel, tmp_path_factory) -> Path:
    _require(PROXY_VENV / "bin" / "python", BASE)
    return _venv(_base_python(PROXY_VENV), PROXY_VENV, wheel, tmp_path_factory.mktemp("venv-a") / "a", linked=True)


@pytest.fixture(scope="module")
def venv_c(wheel, tmp_path_factory) -> Path:
    """[proxy] only: the agents' SDKs, present in .venv, are hidden from this venv by a meta path finder."""
    _require(PROXY_VENV / "bin" / "python", BASE)
    venv = _venv(_base_python(PROXY_VENV), PROXY_VENV, wheel, tmp_path_factory.mktemp("venv-c") / "c")
    site = _site_packages(venv / "bin" / "python")
    (site / "polar_test_no_agents.py").write_text(
        "import sys\n"
        "HIDDEN = ('anthropic', 'openai', 'google.genai')\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if any(name == h or name.startswith(h + '.') for h in HIDDEN):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Hide())\n")
    (site / "polar-test-no-agents.pth").write_text("import polar_test_no_agents\n")
    return venv


@pytest.fixture(scope="module")
def venv_b(wheel, tmp_path_factory) -> Path:
    _require(TRAIN_VENV / "bin" / "python", TRAIN)
    _require(TINY / "config.json", VLLM)
    return _venv(_base_python(TRAIN_VENV), TRAIN_VENV, wheel, tmp_path_factory.mktemp("venv-b") / "b")


def test_1_1_the_wheel_runs_rollout_process_export_and_verify_outside_the_checkout(venv_a, venv_b, upstream,
                                                                                   tmp_path):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(), home.mkdir()
    env_a, env_b = _clean_env(home), _clean_env(home)
    _check_installed(venv_a / "bin" / "python", ("proxy", "agents"), work, env_a)
    _check_installed(venv_b / "bin" / "python", ("train",), work, env_b)

    # without a checkout, each service command says in one line which flag or variable gives what it needs
    proc = _run([venv_a / "bin" / "polar-vllm", "start", "--model", "tiny"], work, env_a)
    assert proc.returncode == 2 and "--models-dir" in proc.stderr and "POLAR_MODELS_DIR" in proc.stderr, proc.stderr
    proc = _run([venv_a / "bin" / "polar-vllm", "start", "--model", "tiny"], work,
                {**env_a, "POLAR_MODELS_DIR": str(TINY.parent)})
    assert proc.returncode == 2 and "--vllm-venv" in proc.stderr and "POLAR_VLLM_VENV" in proc.stderr, proc.stderr

    # pip install, then polar-rollout with no flag but --upstream: the CA made in ~/.local/share/polar (0700),
    # exact mode on, the bwrap sandbox, 4 samples, the preflight
    need_sandbox("bwrap")
    plain = work / "plain"
    proc = _run([venv_a / "bin" / "polar-rollout", TASK, "--agent", "python:polar.rollout.sdk_agent:answer",
                 "--out", plain, "--upstream", upstream.base_url], work, env_a)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    confdir = home / ".local" / "share" / "polar"
    assert (confdir / "mitmproxy-ca-cert.pem").is_file() and stat.S_IMODE(confdir.stat().st_mode) == 0o700
    doc = json.loads((plain / "run.json").read_text())
    assert doc["proxy"]["exact"] is True and doc["sandbox"] == "bwrap" and doc["preflight"]["passed"] is True
    assert len((plain / "results.jsonl").read_text().splitlines()) == 4

    # polar-verify without torch names the pip extra, not a checkout's script
    proc = _run([venv_a / "bin" / "polar-verify", plain / "out", "--model", TINY], work, env_a)
    assert proc.returncode == 2 and "pip install 'polar-gateway[train]'" in proc.stderr, proc.stderr
    assert "scripts/" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1

    run = work / "run"
    proc = _run([venv_a / "bin" / "polar-rollout", TASK, "--agent", "python:polar.rollout.sdk_agent:answer",
                 "--samples", "2", "--sandbox", "none", "--upstream", upstream.base_url, "--out", run,
                 "--skip-preflight", "--no-progress", "--proxy-set", PINNED], work, env_a)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in results] == ["completed", "completed"]
    sequences = pl.read_parquet(run / "out" / "sequences.parquet")
    assert sequences.height == 2 and sequences["n_trainable"].min() > 0

    exported = work / "verl"
    proc = _run([venv_a / "bin" / "polar-export", run / "out", "--format", "verl", "-o", exported], work, env_a)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert pl.concat([pl.read_parquet(p) for p in exported.rglob("*.parquet")]).height == 2

    proc = _run([venv_b / "bin" / "polar-verify", run / "out", "--model", TINY, "--max-median", "0"], work, env_b)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    verify = pl.read_parquet(run / "out" / "verify.parquet")
    assert verify.height == 2 and verify["n_checked"].sum() == sequences["n_trainable"].sum()


def test_1_2_without_the_agents_extra_polar_rollout_stops_before_the_preflight_with_the_pip_line(venv_c, upstream,
                                                                                                   tmp_path):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(), home.mkdir()
    env = _clean_env(home)
    proc = _run([venv_c / "bin" / "python", "-c", "import anthropic"], work, env)
    assert proc.returncode == 1 and "No module named 'anthropic'" in proc.stderr  # hidden, as if not installed
    run = work / "run"
    proc = _run([venv_c / "bin" / "polar-rollout", TASK, "--agent", "python:polar.rollout.sdk_agent:answer",
                 "--out", run, "--upstream", upstream.base_url], work, env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0] == ("polar-rollout: error: --agent python:polar.rollout.sdk_agent:answer: it imports anthropic, "
                        "which is not installed here: pip install 'polar-gateway[agents]'")
    assert not run.exists() and not (home / ".local").exists()  # before the proxy, its CA, the preflight
