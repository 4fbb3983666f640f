"""A sample's working directory as an overlay (polar.rollout.overlay): real mount(2) of the kernel's overlayfs, as
root (elsewhere need() says why not).

1.x  the view: writes land in the sample's upper layer, the start state stays as it was; the verifier's view stacks
     the agent's upper layer (deletions included) on the start state; removing the work directory unmounts first
2.x  the sweep after a crash: a dead run's views are unmounted and removed, a live run's are left, the own run's go
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polar.rollout import overlay
from tests.support.need import need

pytestmark = pytest.mark.unit


@pytest.fixture
def start(tmp_path) -> Path:
    need(overlay.why_no_overlay(str(tmp_path)))
    root = tmp_path / "start"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "gone.txt").write_text("delete me\n")
    return root


def mounted() -> set[str]:
    return {point for point, _ in overlay._overlay_mounts()}


def test_1_1_writes_land_in_the_upper_layer_and_the_start_state_stays(start, tmp_path):
    work = tmp_path / "run" / ".work" / "t-0-0"
    app = overlay.mount_view([start], work)
    try:
        assert (app / "pkg" / "a.py").read_text() == "A = 1\n"
        (app / "pkg" / "a.py").write_text("A = 2\n")
        (app / "new.txt").write_text("new\n")
        (app / "gone.txt").unlink()
        assert (start / "pkg" / "a.py").read_text() == "A = 1\n" and (start / "gone.txt").is_file()
        assert not (start / "new.txt").exists()
        upper = overlay.upper_of(work)
        assert (upper / "pkg" / "a.py").read_text() == "A = 2\n" and (upper / "new.txt").is_file()
        overlay.unmount(app)
        view = overlay.mount_view([upper, start], work, "verify-app")  # the verifier's: agent's changes, fresh upper
        assert (view / "pkg" / "a.py").read_text() == "A = 2\n" and (view / "new.txt").is_file()
        assert not (view / "gone.txt").exists()
        (view / "verifier-wrote").write_text("x")
        assert not (upper / "verifier-wrote").exists()
    finally:
        overlay.remove_work(work)
    assert not work.exists() and str(app) not in mounted() and (start / "pkg" / "a.py").is_file()


def _view(run: Path, sample: str, start: Path) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / ".lock").touch()
    return overlay.mount_view([start], run / ".work" / sample)


def test_2_1_the_sweep_unmounts_dead_runs_views_and_leaves_live_ones(start, tmp_path):
    dead, live, own = _view(tmp_path / "dead", "t-0-0", start), _view(tmp_path / "live", "t-0-0", start), \
        _view(tmp_path / "own", "t-1-0", start)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDWR); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(tmp_path / "live" / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        swept = overlay.sweep(own_run=tmp_path / "own")
        assert sorted(swept) == sorted([str(dead), str(own)])
        assert str(live) in mounted() and str(dead) not in mounted() and str(own) not in mounted()
        assert not dead.parent.exists() and live.parent.is_dir()
    finally:
        holder.kill()
        holder.wait()
        overlay.remove_work(live.parent)
    assert overlay.sweep() == [] and (start / "pkg" / "a.py").is_file()
