"""Fixtures of the polar.launch tests: a fake vLLM environment, servers stopped at the end, no checkout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from polar.launch import paths, vllm, vllm_args

FAKES = Path(__file__).with_name("fakes.py")


@pytest.fixture
def fake_venv(tmp_path) -> Path:
    """A vLLM environment whose python runs the fake server (its command line still names the launcher)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKES}" "$@"\n')
    py.chmod(0o755)
    return venv


@pytest.fixture
def no_checkout(monkeypatch):
    """As under a wheel install: no checkout to take defaults from."""
    monkeypatch.setattr(paths, "checkout_root", lambda: None)
    monkeypatch.delenv(vllm_args.VENV_ENV, raising=False)
    monkeypatch.delenv(vllm_args.MODELS_ENV, raising=False)


@pytest.fixture
def servers():
    """Stops, at the end, the server of every run file a test appends."""
    run_files: list[Path] = []
    yield run_files
    for rf in run_files:
        vllm.stop(rf, timeout=5, log=vllm.quiet)
