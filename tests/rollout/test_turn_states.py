"""rollout/turn_states.py without a sandbox: snapshots hold what changed since the start and stand for the working
directory at the call; the announce endpoint checks the token, names snapshots by call and marks a slow one late under
hold; the disk budget stops snapshots and comes back when a sample ends; scores come out per boundary plus the final
state, and a missing snapshot or score gives null. (The scorer in its sandbox, and the gateway announcing real calls:
tests/rollout/test_turn_states_run.py.)"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from polar.rollout import turn_states as ts

pytestmark = pytest.mark.unit


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def _start(tmp_path: Path) -> tuple[Path, Path]:
    start = tmp_path / "start"
    (start / "src").mkdir(parents=True)
    (start / "src" / "a.py").write_text("a = 1\n")
    (start / "keep.txt").write_text("keep\n")
    (start / "gone.txt").write_text("gone\n")
    app = tmp_path / "app"
    import shutil
    shutil.copytree(start, app, symlinks=True)
    return start, app


def test_1_a_snapshot_holds_the_changes_and_materializes_to_the_state_at_the_call(tmp_path):
    start, app = _start(tmp_path)
    base = ts.tree_stats(app)
    (app / "src" / "a.py").write_text("a = 2\n")
    (app / "new" / "deep").mkdir(parents=True)
    (app / "new" / "deep" / "b.txt").write_text("b\n")
    (app / "gone.txt").unlink()
    os.symlink("keep.txt", app / "link")
    snap = tmp_path / "snap"
    copied = ts.take_snapshot(app, base, snap)
    assert sorted(tree(snap / "files")) == ["new/deep/b.txt", "src/a.py"] and os.path.islink(snap / "files" / "link")
    assert json.loads((snap / "deleted.json").read_text()) == ["gone.txt"] and copied == len("a = 2\n") + len("b\n")
    (app / "src" / "a.py").write_text("a = 3, after the call\n")  # later work does not reach the snapshot
    out = tmp_path / "out"
    ts.materialize(start, snap, out)
    assert tree(out) == {"keep.txt": "keep\n", "new/deep/b.txt": "b\n", "src/a.py": "a = 2\n"}
    assert os.readlink(out / "link") == "keep.txt"


def test_1_2_a_directory_that_became_a_file_and_a_file_that_became_a_directory(tmp_path):
    start, app = _start(tmp_path)
    for root in (start, app):
        (root / "dir-to-file").mkdir()
        (root / "dir-to-file" / "x.txt").write_text("x\n")
        (root / "file-to-dir").write_text("f\n")
    base = ts.tree_stats(app)
    (app / "dir-to-file" / "x.txt").unlink()
    (app / "dir-to-file").rmdir()
    (app / "dir-to-file").write_text("now a file\n")
    (app / "file-to-dir").unlink()
    (app / "file-to-dir").mkdir()
    (app / "file-to-dir" / "y.txt").write_text("y\n")
    ts.take_snapshot(app, base, tmp_path / "snap")
    ts.materialize(start, tmp_path / "snap", tmp_path / "out")
    assert tree(tmp_path / "out") == tree(app)


def _post(url: str, body: dict, token: str | None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json",
                                          **({ts.TOKEN_HEADER: token} if token is not None else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_2_the_endpoint_checks_the_token_and_names_snapshots_by_call(tmp_path):
    _, app = _start(tmp_path)
    states = ts.TurnStates("hold", "secret")
    url = states.start()
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith(ts.ANNOUNCE_PATH)
        sample = states.register("run/t/0/0", app, tmp_path / "states")
        assert _post(url, {"session": "run/t/0/0", "call_id": "c1"}, None)[0] == 401
        assert _post(url, {"session": "run/t/0/0", "call_id": "c1"}, "wrong")[0] == 403
        assert _post(url, {"session": "other", "call_id": "c1"}, "secret")[0] == 202 and states.unknown == 1
        assert _post(url, {"call_id": "c1"}, "secret")[0] == 400
        code, meta = _post(url, {"session": "run/t/0/0", "call_id": "c1", "hold_s": 30}, "secret")
        assert code == 200 and meta["late"] is False
        (app / "keep.txt").write_text("changed\n")
        assert _post(url, {"session": "run/t/0/0", "call_id": "c2", "hold_s": 1e-9}, "secret")[1]["late"] is True
        assert list(sample.calls) == ["c1", "c2"]
        assert tree(Path(sample.calls["c1"]["path"]) / "files") == {}
        assert tree(Path(sample.calls["c2"]["path"]) / "files") == {"keep.txt": "changed\n"}
        states.finish("run/t/0/0")
        assert not (tmp_path / "states").exists() and states.budget.used == 0
    finally:
        states.close()


def test_3_past_the_run_s_disk_budget_calls_are_not_snapshotted(tmp_path):
    _, app = _start(tmp_path)
    states = ts.TurnStates("async", "t", max_bytes=500)
    sample = states.register("s", app, tmp_path / "states")
    (app / "big.bin").write_bytes(b"x" * 1000)
    assert sample.snapshot("c1", 0.0, states.budget)["bytes"] == 1000
    assert "skipped" in sample.snapshot("c2", 0.0, states.budget)
    states.finish("s")
    assert states.budget.room()


def test_4_scores_per_boundary_and_the_final_state_or_null(tmp_path):
    start, app = _start(tmp_path)
    states = ts.TurnStates("hold", "t")
    sample = states.register("s", app, tmp_path / "states")
    for k, call in enumerate(["c1", "side", "c2", "c3"]):
        if k == 3:
            (app / "half.txt").write_text("1")
        sample.snapshot(call, 0.0, states.budget)
    (app / "done.txt").write_text("1")

    def score(state: Path) -> float:  # the share of the two result files present
        return sum((state / f).exists() for f in ("half.txt", "done.txt")) / 2

    got = ts.turn_scores(["c1", "c2", "c3"], sample, score, app, 2, start, tmp_path / "work")
    assert got == {"calls": [{"call_id": "c1", "score": 0.0}, {"call_id": "c2", "score": 0.0},
                             {"call_id": "c3", "score": 0.5}], "final": 1.0}
    assert not list((tmp_path / "work").iterdir())  # the materialized states are gone
    assert ts.turn_scores(["c1", "c9"], sample, score, app, 2, start, tmp_path / "work") is None  # no snapshot
    assert ts.turn_scores(["c1"], sample, lambda p: None, app, 2, start, tmp_path / "work") is None  # no score


def test_5_a_state_is_an_overlay_view_where_the_samples_working_directory_was_one(tmp_path):
    """As root: the sample's own working directory an overlay over the start state (rollout/sample.py), each state
    the snapshot laid over the start state as a layer, deletions as whiteouts — the same tree as the copy, with
    nothing of the start state copied; every view and layer gone after scoring."""
    from polar.rollout import overlay
    from tests.support.need import need

    need(overlay.why_no_overlay(str(tmp_path)))
    start, _ = _start(tmp_path)
    (start / "dir-to-file").mkdir()
    (start / "dir-to-file" / "x.txt").write_text("x\n")
    (start / "file-to-dir").write_text("f\n")
    work = tmp_path / "run" / ".work" / "t-0-0"
    app = overlay.mount_view([start], work)
    try:
        states = ts.TurnStates("hold", "t")
        sample = states.register("s", app, work / "turn-states")
        (app / "src" / "a.py").write_text("a = 2\n")
        (app / "new" / "deep").mkdir(parents=True)
        (app / "new" / "deep" / "b.txt").write_text("b\n")
        (app / "gone.txt").unlink()
        os.symlink("keep.txt", app / "link")
        (app / "dir-to-file" / "x.txt").unlink()
        (app / "dir-to-file").rmdir()
        (app / "dir-to-file").write_text("now a file\n")
        (app / "file-to-dir").unlink()
        (app / "file-to-dir").mkdir()
        (app / "file-to-dir" / "y.txt").write_text("y\n")
        sample.snapshot("c1", 0.0, states.budget)
        (app / "after.txt").write_text("later\n")  # after the call: in the final state only
        copy = tmp_path / "copy"
        ts.materialize(start, Path(sample.calls["c1"]["path"]), copy)
        seen: dict[str, tuple[bool, dict]] = {}

        def score(state: Path) -> float:
            seen[state.name] = (overlay.is_view(state), tree(state))
            (state / "scorer-wrote.txt").write_text("scratch\n")  # the scorer's writes stay in its own layer
            return 1.0

        got = ts.turn_scores(["c1"], sample, score, app, 1, start, work)
        assert got == {"calls": [{"call_id": "c1", "score": 1.0}], "final": 1.0}
        assert seen["turn-0000"] == (True, tree(copy)) and "gone.txt" not in seen["turn-0000"][1]
        assert seen["turn-0000"][1]["dir-to-file"] == "now a file\n" and "dir-to-file/x.txt" not in seen["turn-0000"][1]
        assert seen["turn-final"] == (True, {**tree(copy), "after.txt": "later\n"})
        assert not (app / "scorer-wrote.txt").exists() and (start / "gone.txt").read_text() == "gone\n"
        assert not (start / "scorer-wrote.txt").exists()
        assert {p.name for p in work.iterdir()} == {"app", "turn-states", ".overlay"}
        assert sorted(p.name for p in (work / ".overlay").iterdir()) == ["app"]
        assert str(work / "turn-0000") not in {m for m, _ in overlay._overlay_mounts()}
    finally:
        overlay.remove_work(work)
