"""final.diff as a patch (polar.rollout.gitpatch): the agent's files against the base commit, new untracked files
and binary files included, the agents' own directories left out — and nothing the agent's `.git` names runs here.

1.x  the patch: applied to a checkout of the base it gives the agent's files back; an explicit base; an agent's
     commits on a new branch do not matter
2.x  the traps: an fsmonitor, hooks, a diff/textconv driver and a clean filter in the agent's .git/config and
     .gitattributes, each writing a marker file: armed for a plain git, silent for the patch
3.x  errors: a base the start state lacks; a start state that is not a repository
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from polar.rollout.gitpatch import PatchError, git_dir, git_patch

pytestmark = pytest.mark.unit

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}


def git(cwd: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def start(tmp_path) -> Path:
    """A repository with two commits: pkg/a.py, pkg/b.py, tests/test_a.py, data.bin."""
    root = tmp_path / "start"
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "a.py").write_text("def f(x):\n    return x + 1\n")
    (root / "pkg" / "b.py").write_text("B = 1\n")
    (root / "tests" / "test_a.py").write_text("from pkg.a import f\n\ndef test_f():\n    assert f(1) == 2\n")
    (root / "data.bin").write_bytes(bytes(range(256)))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    (root / "pkg" / "b.py").write_text("B = 2\n")
    git(root, "commit", "-q", "-am", "second")
    return root


def agent_work(start: Path, tmp_path: Path) -> Path:
    """The agent's directory after its work: an edit, a deletion, new text and binary files, its own dirs."""
    work = tmp_path / "work"
    shutil.copytree(start, work, symlinks=True)
    (work / "pkg" / "a.py").write_text("def f(x):\n    return x + 2\n")
    (work / "tests" / "test_a.py").unlink()
    (work / "pkg" / "c.py").write_text("def g():\n    return 'new'\n")
    (work / "blob.bin").write_bytes(b"\0\1\2\3" * 100)
    (work / ".gitattributes").write_text("*.txt text\n")  # would turn CRLF into LF on a plain add
    (work / "notes.txt").write_bytes(b"one\r\ntwo\r\n")
    for own in (".claude/settings.json", ".codex/log", "node_modules/x/index.js", "pkg/__pycache__/a.cpython.pyc"):
        (work / own).parent.mkdir(parents=True, exist_ok=True)
        (work / own).write_text("agent state\n")
    return work


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts}


def apply_to_base(start: Path, base: str, patch: bytes, tmp_path: Path) -> Path:
    fresh = tmp_path / "fresh"
    git(tmp_path, "clone", "-q", str(start), str(fresh))
    git(fresh, "checkout", "-q", base)
    (tmp_path / "p.diff").write_bytes(patch)
    git(fresh, "apply", "--binary", str(tmp_path / "p.diff"))
    return fresh


def test_1_1_the_patch_applied_to_the_base_gives_the_agents_files_back(start, tmp_path):
    work = agent_work(start, tmp_path)
    patch = git_patch(work, git_dir(start))
    assert b"+++ b/pkg/c.py" in patch and b"GIT binary patch" in patch and b"deleted file mode" in patch
    assert not any(d in patch for d in (b".claude", b".codex", b"node_modules", b"__pycache__"))
    fresh = apply_to_base(start, "HEAD", patch, tmp_path)
    own = (".claude/", ".codex/", "node_modules/", "pkg/__pycache__/")
    assert files(fresh) == {k: v for k, v in files(work).items() if not k.startswith(own)}


def test_1_2_an_explicit_base_commit_and_the_agents_own_commits(start, tmp_path):
    work = agent_work(start, tmp_path)
    first = git(start, "rev-parse", "HEAD~1")
    git(work, "checkout", "-q", "-b", "fix")  # the agent commits its fix on a branch of its own: HEAD moves
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "agent's fix")
    patch = git_patch(work, git_dir(start), base=first)
    assert b"-B = 1\n+B = 2\n" in patch  # the second commit's change is part of the work against the first
    fresh = apply_to_base(start, first, patch, tmp_path)
    assert (fresh / "pkg" / "a.py").read_text() == "def f(x):\n    return x + 2\n"
    assert git_patch(start, git_dir(start)) == b""  # the start state itself: nothing changed


def plant_traps(work: Path, marker: Path) -> None:
    """Every command an agent can make git run here writes `marker/<kind>`."""
    marker.mkdir()
    hooks = work / ".git" / "evil-hooks"
    hooks.mkdir()
    for hook in ("post-index-change", "pre-commit", "post-checkout", "reference-transaction"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {marker}/hook-{hook}\n")
        (hooks / hook).chmod(0o755)
    scripts = {"fsmonitor": "", "filter": "cat\n", "textconv": 'cat "$1"\n', "diff-driver": ""}
    for kind, tail in scripts.items():
        (work / ".git" / kind).write_text(f"#!/bin/sh\ntouch {marker}/{kind}\n{tail}")
        (work / ".git" / kind).chmod(0o755)
    g = work / ".git"
    with open(g / "config", "a") as fh:
        fh.write(f"[core]\n\tfsmonitor = {g}/fsmonitor\n\thooksPath = {hooks}\n"
                 f"[filter \"evil\"]\n\tclean = {g}/filter\n\trequired = true\n"
                 f"[diff \"evil\"]\n\ttextconv = {g}/textconv\n\tcommand = {g}/diff-driver\n")
    (work / ".gitattributes").write_text("* filter=evil diff=evil\n")


def test_2_1_nothing_the_agents_git_names_runs_while_the_patch_is_made(start, tmp_path):
    work = agent_work(start, tmp_path)
    marker = tmp_path / "marker"
    plant_traps(work, marker)
    # armed: a plain git in the agent's repository runs them
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}
    for args in (["status"], ["add", "-A"], ["diff", "--cached"], ["diff", "HEAD"]):
        subprocess.run(["git", *args], cwd=work, env=env, capture_output=True, timeout=60)
    assert {"fsmonitor", "filter", "diff-driver"} <= {p.name for p in marker.iterdir()}
    shutil.rmtree(work / ".git")
    shutil.copytree(start / ".git", work / ".git")  # a fresh index, then the traps again
    shutil.rmtree(marker)
    plant_traps(work, marker)
    patch = git_patch(work, git_dir(start))
    assert sorted(p.name for p in marker.iterdir()) == []
    assert b"+++ b/.gitattributes" in patch and b"+    return x + 2" in patch  # the attributes did not rewrite it


def test_3_1_a_base_the_start_state_lacks_is_a_patch_error(start, tmp_path):
    with pytest.raises(PatchError, match="the base commit 0123456789abcdef0123456789abcdef01234567 is not in"):
        git_patch(agent_work(start, tmp_path), git_dir(start), base="0123456789abcdef0123456789abcdef01234567")


def test_3_2_a_start_state_without_a_repository_has_no_git_dir(tmp_path):
    (tmp_path / "plain").mkdir()
    assert git_dir(tmp_path / "plain") is None and git_dir(None) is None
