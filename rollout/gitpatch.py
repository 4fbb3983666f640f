"""final.diff as a patch SWE-bench's harness applies: the agent's working directory against a base commit, new
untracked files included (`git apply` / `patch -p1` take it), computed so that nothing the agent wrote runs here.

The agent owns its working directory, its `.git` included: a `.git/config` can name hooks, an fsmonitor, diff and
textconv drivers and clean filters (commands git runs), `.gitattributes` can switch them on, and refs/replace can
swap the base commit's content. So the agent's `.git` is never read. git runs with a repository of our own in a
temporary directory: its config is empty (no system or global config, hooks at /dev/null, no fsmonitor), its
objects borrow the *start state's* object store (read only; the start state is the task's image or workdir, which
the agent never wrote) through `objects/info/alternates`, its `info/attributes` (which outranks every
`.gitattributes`) unsets every filter, text, eol, ident and encoding attribute, and diffs run with `--no-ext-diff
--no-textconv`. The steps: the base commit's tree read into a private index, `add -A` over the agent's directory,
`diff --cached --binary` against the base. The agent's commits, branches and resets do not matter: the patch is
its files against the base.

Left out (info/exclude, untracked files only: a file the base commit tracks is always compared): the agents' own
directories AGENT_DIRS and Python's caches.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

# The CLI agents' state and caches: Claude Code, Codex, Gemini CLI, Qwen Code, Pi, npm installs, Python's caches.
AGENT_DIRS = (".claude/", ".codex/", ".gemini/", ".qwen/", ".pi/", ".polar/", "node_modules/", "__pycache__/",
              ".pytest_cache/", "*.pyc")
# Every attribute that makes git run a command or rewrite content on add; `!diff` leaves diff detection to git.
NEUTRAL_ATTRIBUTES = "* -filter -text -eol -ident -working-tree-encoding !diff !merge\n"
# Command-line config outranks any file; safe.directory: the agent's files may belong to the sandbox's uid.
NEUTRAL_CONFIG = ("core.fsmonitor=false", "core.hooksPath=/dev/null", "core.untrackedCache=false",
                  "core.attributesFile=/dev/null", "core.excludesFile=/dev/null", "core.autocrlf=false",
                  "core.safecrlf=false", "core.symlinks=true", "core.fileMode=true", "core.quotePath=false",
                  "diff.noprefix=false", "diff.mnemonicPrefix=false", "diff.external=", "safe.directory=*",
                  "submodule.recurse=false", "protocol.allow=never")
GIT_TIMEOUT = 300.0


class PatchError(RuntimeError):
    """git could not make the patch (a base commit missing from the start state, a git failure)."""


def git_dir(start: Path | None) -> Path | None:
    """The start state's git directory, when the start state is a git repository (a `.git` directory)."""
    if start is None:
        return None
    d = start / ".git"
    return d if d.is_dir() and (d / "objects").is_dir() else None


def _env(scratch: Path, extra: dict[str, str]) -> dict[str, str]:
    """A clean environment: nothing of ours (GIT_* variables, HOME's config) reaches git."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(scratch), "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ATTR_NOSYSTEM": "1",
            "GIT_NO_REPLACE_OBJECTS": "1", "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0",
            "GIT_CEILING_DIRECTORIES": str(scratch.parent), **extra}


def _git(args: list[str], env: dict[str, str], cwd: Path) -> bytes:
    argv = ["git", *(x for c in NEUTRAL_CONFIG for x in ("-c", c)), *args]
    try:
        res = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=GIT_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise PatchError(f"git {args[0]} did not finish within {GIT_TIMEOUT:g} s") from exc
    if res.returncode != 0:
        raise PatchError(f"git {args[0]}: {res.stderr.decode(errors='replace').strip()[-300:]}")
    return res.stdout


def start_head(start_git: Path) -> str:
    """The start state's HEAD commit (read with the same neutral git, in the start state's own repository)."""
    with tempfile.TemporaryDirectory(prefix="polar-patch-") as tmp:
        env = _env(Path(tmp), {"GIT_DIR": str(start_git)})
        return _git(["rev-parse", "--verify", "HEAD^{commit}"], env, Path(tmp)).decode().strip()


def git_patch(workdir: Path, start_git: Path, base: str | None = None,
              exclude: tuple[str, ...] = AGENT_DIRS) -> bytes:
    """The agent's change in `workdir` against `base` (a commit of the start state's repository; its HEAD when
    None) as a binary-safe git patch (bytes: a file's text is the agent's, in whatever encoding); b"" when nothing
    changed. PatchError when git cannot make it."""
    base = base or start_head(start_git)
    with tempfile.TemporaryDirectory(prefix="polar-patch-") as tmp:
        scratch = Path(tmp)
        gdir = scratch / "git"
        _git(["init", "-q", "--template=", str(gdir)], _env(scratch, {}), scratch)
        gdir = gdir / ".git"
        (gdir / "objects" / "info").mkdir(parents=True, exist_ok=True)
        (gdir / "objects" / "info" / "alternates").write_text(f"{(start_git / 'objects').resolve()}\n")
        (gdir / "info").mkdir(exist_ok=True)
        (gdir / "info" / "attributes").write_text(NEUTRAL_ATTRIBUTES)
        (gdir / "info" / "exclude").write_text("".join(f"{p}\n" for p in exclude))
        env = _env(scratch, {"GIT_DIR": str(gdir), "GIT_WORK_TREE": str(workdir.resolve()),
                             "GIT_INDEX_FILE": str(scratch / "index")})
        try:
            _git(["cat-file", "-e", f"{base}^{{commit}}"], env, scratch)
        except PatchError:
            raise PatchError(f"the base commit {base} is not in the start state's repository") from None
        _git(["read-tree", base], env, scratch)
        _git(["add", "-A", "--ignore-errors", "--", "."], env, workdir)
        out = _git(["diff", "--cached", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames",
                    "--full-index", base, "--"], env, workdir)
    return out
