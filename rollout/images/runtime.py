"""The sandbox runtime: one read-only host prefix, mounted at /run/polar/rt (INSIDE) in a sandbox whose root is an
arbitrary image's, that runs Python (the wrapper, python agents on the host venv) and Node.js (CLI agents) without
using anything of the image's userland — not its loader, its libc, its libraries or its /etc/ld.so.cache.

Rules. Each failure is a `RuntimeBuildError` whose text is one line naming the fix.
1. `build_runtime(cache, python=, node=)` makes `cache/<key>/`, where `key` is the sha256 of the inputs: every file
   copied (by its place in the prefix and its content), the Python version, INSIDE and FORMAT. A complete
   `cache/<key>` is reused as it is; it is never modified after it is published.
2. A build happens in `cache/.build-*` and is published with one atomic rename; of two concurrent builders of one key
   the loser discards its copy and both return the winner's. Nothing is ever written outside `cache`.
3. So that a cached call does not hash ~200 MB, `cache/.stamps/` maps the executables' (path, size, mtime_ns) to
   the key and to the (path, size, mtime_ns) of every input file; the stamp is used only while all of them hold.
4. Layout: `bin/pythonX.Y` (with `python3`, `python` symlinks), `bin/node` when node is given; `lib/` holds the ELF
   interpreter (the host's PT_INTERP basename), the shared-library closure (per `ldd`) of every copied ELF, and
   libpthread, libdl, librt, libutil, libgcc_s and libstdc++ when the host has them (native wheels NEED them);
   `lib/pythonX.Y/` is the interpreter's standard library with lib-dynload, without the contents of site-packages,
   test/, idlelib/, tkinter/ (and _tkinter), turtledemo/, ensurepip/, lib2to3/tests, any `*.pth` and the static
   libpython archive.
5. Every copied ELF is patched: executables get the interpreter `INSIDE/lib/<ld>`; executables and every shared
   object but the loader and libc get DT_RPATH (not RUNPATH) `INSIDE/lib` — the executable's DT_RPATH is also
   searched for what extension modules dlopen later. No LD_LIBRARY_PATH anywhere: what the agent starts (the
   image's bash, python, …) keeps the image's loader and libraries.
6. `venv/` is a venv view of the same interpreter: `pyvenv.cfg` (home = INSIDE/bin), `bin/python` and
   `bin/python3` linking to `../../bin/pythonX.Y`, and an empty `lib/pythonX.Y/site-packages/` on which the
   sandbox bind-mounts the host venv's site-packages (`site_packages_of`).
7. Everything is readable by any uid (dirs 0755, files 0644 or 0755): the sandboxed agent runs as uid 1000.
8. Refused: patchelf or ldd missing, a python that is not a CPython executable or whose stdlib is not found, a node
   given but missing, an input that is not an ELF file.

Limits: the image's /etc/ld.so.preload, if it has one, is still honoured by the loader; a library that a native
wheel NEEDs, that is not in `lib/` and whose ELF has DT_RUNPATH is looked up in the image's directories.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from polar.records.files import write_json_atomic

INSIDE = "/run/polar/rt"
# part of every key: bump it when the layout or the patching changes, so that no old prefix is reused
FORMAT = "polar-runtime/1"
# glibc's compatibility stubs and the GCC runtimes: native wheels in the venv NEED them, python itself does not
EXTRA_LIBS = ("libpthread.so.0", "libdl.so.2", "librt.so.1", "libutil.so.1", "libgcc_s.so.1", "libstdc++.so.6")
# top-level stdlib directories never used by an agent (the test suite alone is ~130 MB)
SKIP_TOP = frozenset({"test", "idlelib", "tkinter", "turtledemo", "ensurepip"})
SKIP_PATHS = frozenset({"lib2to3/tests"})
SITE_DIRS = frozenset({"site-packages", "dist-packages"})
# a build dir this old was left by a killed builder (a build takes seconds)
STALE_BUILD_S = 3600.0
PATCHELF_FIX = "apt-get install patchelf, or scripts/setup --system"
_PROBE = ("import json, os, sys\n"
          "dyn = [p for p in sys.path if os.path.basename(p) == 'lib-dynload' and os.path.isdir(p)]\n"
          "print(json.dumps({'impl': sys.implementation.name, 'version': '%d.%d.%d' % sys.version_info[:3],\n"
          "                  'stdlib': os.path.dirname(os.__file__), 'dynload': dyn[0] if dyn else None}))\n")


class RuntimeBuildError(RuntimeError):
    """The runtime cannot be built here; str() is one line naming the fix."""


@dataclass(frozen=True)
class Runtime:
    """A built prefix: `root` on the host, mounted read-only at INSIDE. Every other path is an inside path."""

    root: Path  # the built host directory (complete, never modified after it is published)
    key: str  # sha256 hex of its inputs (content-addressed)
    python: str  # f"{INSIDE}/bin/python3"
    node: str | None  # f"{INSIDE}/bin/node"; None when built without node
    venv_python: str  # f"{INSIDE}/venv/bin/python": the interpreter seen as a venv
    site_packages: str  # the venv view's site-packages: empty in root, the host venv's is bind-mounted on it


def build_runtime(cache: Path, *, python: Path, node: Path | None) -> Runtime:
    """Rules 1–8: the runtime for these inputs, from `cache` when it is there, else built and published there."""
    cache = Path(os.path.abspath(cache))
    exes = {"python": _input(python, "python", "pass a CPython executable, e.g. the one behind .venv/bin/python")}
    if node is not None:
        exes["node"] = _input(node, "node", "install Node.js (apt-get install nodejs) or pass node=None")
    stamp_file = cache / ".stamps" / f"{_stamp_id(exes)}.json"
    found = _read_stamp(stamp_file, cache)
    if found is not None:
        return _runtime(cache, found["key"], found["version"], "node" in exes)

    patchelf = shutil.which("patchelf")
    if patchelf is None:
        raise RuntimeBuildError(f"patchelf is not on PATH (the sandbox runtime is patched with it): {PATCHELF_FIX}")
    version, plan, inputs = _plan(exes)
    key = _key(version, plan)
    root = cache / key
    if not root.is_dir():
        _build(cache, root, version, plan, patchelf)
    _write_stamp(stamp_file, {"key": key, "version": version, "inputs": inputs})
    return _runtime(cache, key, version, "node" in exes)


def native_launcher(rt: Runtime, exe: Path) -> list[str] | None:
    """How a sandbox runs a host ELF executable it is given read-only (a CLI that npm installs as a native binary,
    e.g. Claude Code's bin/claude.exe): through the runtime's loader with the runtime's libraries
    (`INSIDE/lib/<ld> --library-path INSIDE/lib`), so that the image's loader and libc are not needed — the same rule
    as node and python. None when `exe` is not a dynamically linked ELF executable (a script: node runs it).
    RuntimeBuildError, one line, when the runtime lacks its loader or a library it needs."""
    found = _native_launcher(str(rt.root), str(exe), os.stat(exe).st_mtime_ns)
    if isinstance(found, str):
        raise RuntimeBuildError(found)
    return list(found) if found else None


@functools.lru_cache(maxsize=64)
def _native_launcher(root: str, exe: str, _mtime_ns: int) -> tuple[str, ...] | str | None:
    """native_launcher's answer once per runtime and executable version (ldd runs once): the argv prefix, None, or
    the error's line."""
    interp = _elf_interp(Path(exe))
    if not interp:
        return None
    loader = os.path.basename(interp)
    have = set(os.listdir(Path(root) / "lib"))
    libs, missing = _closure([Path(exe)])
    lacking = sorted(({loader} | set(libs) | set(missing.values())) - have)
    if lacking:
        return (f"the sandbox runtime lacks {', '.join(lacking)}, which {os.path.basename(exe)} needs: run that "
                f"agent outside an image task, or build the runtime with those libraries")
    return (f"{INSIDE}/lib/{loader}", "--library-path", f"{INSIDE}/lib")


def site_packages_of(venv: Path) -> Path:
    """The host venv's site-packages directory (lib/pythonX.Y/site-packages), what the sandbox mounts on
    Runtime.site_packages."""
    venv = Path(os.path.abspath(venv))
    cfg = venv / "pyvenv.cfg"
    if not cfg.is_file():
        raise RuntimeBuildError(f"{venv} is not a venv (no pyvenv.cfg): pass the project's venv (.venv, from "
                                f"scripts/setup)")
    version = ""
    for line in cfg.read_text(errors="replace").splitlines():
        name, _, value = line.partition("=")
        if name.strip() in ("version", "version_info") and value.strip():
            version = ".".join(value.strip().split(".")[:2])
            break
    candidates = [venv / "lib" / f"python{version}" / "site-packages"] if version else []
    candidates += sorted((venv / "lib").glob("python*/site-packages"))
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise RuntimeBuildError(f"{venv} has no lib/pythonX.Y/site-packages: recreate the venv (scripts/setup)")


# ---------------------------------------------------------------------------------------------- inputs


def _input(path: Path | str, what: str, fix: str) -> Path:
    """An executable input, resolved (a venv's bin/python is a symlink to the real interpreter), checked as ELF."""
    real = Path(os.path.realpath(path))
    if not real.is_file():
        raise RuntimeBuildError(f"{what} {path} does not exist or is not a file: {fix}")
    if _elf_interp(real) is False:
        raise RuntimeBuildError(f"{what} {path} is not an ELF executable: {fix}")
    return real


def _elf_interp(path: Path) -> str | None | bool:
    """False when `path` is not an ELF file; else its PT_INTERP (None for a shared object or a static executable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
                return False
            end = "<" if head[5] == 1 else ">"
            if head[4] == 2:  # ELFCLASS64
                phoff, = struct.unpack_from(end + "Q", head, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
                entry = end + "IIQ"  # p_type, p_flags, p_offset
                size_at, size_fmt = 32, end + "Q"  # p_filesz
            else:
                phoff, = struct.unpack_from(end + "I", head, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
                entry = end + "II"  # p_type, p_offset
                size_at, size_fmt = 16, end + "I"
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum):
                fields = struct.unpack_from(entry, table, i * phentsize)
                if fields[0] == 3:  # PT_INTERP
                    size, = struct.unpack_from(size_fmt, table, i * phentsize + size_at)
                    f.seek(fields[-1])
                    return f.read(size).split(b"\0", 1)[0].decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return False
    return None


def _stamp_id(exes: dict[str, Path]) -> str:
    """Rule 3: what names a stamp — cheap (stats only), so that a cached call is a few thousand stats."""
    parts = [FORMAT, INSIDE]
    for role, path in sorted(exes.items()):
        st = path.stat()
        parts.append([role, str(path), st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _read_stamp(stamp_file: Path, cache: Path) -> dict | None:
    """The stamp's record when it is readable, its runtime is published and every input it lists is unchanged."""
    try:
        found = json.loads(stamp_file.read_text())
        if not (cache / found["key"]).is_dir():
            return None
        for path, size, mtime_ns in found["inputs"]:
            st = os.stat(path)
            if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
                return None
        return found
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_stamp(stamp_file: Path, record: dict) -> None:
    stamp_file.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(stamp_file, record, indent=None, mode=0o644)  # a concurrent reader sees the old or the new


# ---------------------------------------------------------------------------------------------- the plan


class _File:
    """One file of the prefix: where it comes from, its content hash, and how it is patched."""

    def __init__(self, source: Path):
        self.source = source
        self.patch: str | None = None  # "exe": interpreter and rpath; "rpath"; None: copied as it is
        self.interp = ""  # for "exe": the basename of its PT_INTERP, which lib/ holds
        digest = hashlib.sha256()
        with open(source, "rb") as f:
            head = f.read(18)
            digest.update(head)
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        self.sha256 = digest.hexdigest()
        # a loadable ELF (ET_EXEC or ET_DYN) is patched and has a closure; an object file (config-*/python.o) not
        self.elf = len(head) == 18 and head[:4] == b"\x7fELF" and head[5] in (1, 2) and \
            int.from_bytes(head[16:18], "little" if head[5] == 1 else "big") in (2, 3)
        self.mode = 0o755 if self.elf or source.stat().st_mode & 0o111 else 0o644


def _probe(python: Path) -> tuple[str, Path, Path | None]:
    """The interpreter's version, stdlib directory and lib-dynload directory, from the interpreter itself."""
    fix = "pass a CPython executable, e.g. the one behind .venv/bin/python"
    try:  # -I -S: no PYTHON* variables, no site: the bare interpreter's own paths; -B: it writes no .pyc
        p = subprocess.run([str(python), "-I", "-S", "-B", "-c", _PROBE], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        info = json.loads(p.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        raise RuntimeBuildError(f"python {python} does not run as CPython: {fix}") from None
    if not isinstance(info, dict) or info.get("impl") != "cpython":
        raise RuntimeBuildError(f"python {python} is not CPython: {fix}")
    stdlib = Path(os.path.realpath(info["stdlib"]))
    if not (stdlib / "os.py").is_file():
        raise RuntimeBuildError(f"the standard library of python {python} is not found ({stdlib}/os.py is missing): "
                                f"{fix}, installed with its standard library")
    return info["version"], stdlib, Path(os.path.realpath(info["dynload"])) if info["dynload"] else None


def _plan(exes: dict[str, Path]) -> tuple[str, dict[str, _File], list]:
    """Every file of the prefix (its path in root → _File) and the stamp's inputs: (path, size, mtime_ns) of every
    file read and directory walked."""
    version, stdlib, dynload = _probe(exes["python"])
    xy = ".".join(version.split(".")[:2])
    sources: dict[str, Path] = {f"bin/python{xy}": exes["python"]}
    if "node" in exes:
        sources["bin/node"] = exes["node"]
    walked: list[Path] = []
    _walk_stdlib(stdlib, f"lib/python{xy}", sources, walked, skip=dynload)
    if dynload is not None:
        _walk_stdlib(dynload, f"lib/python{xy}/lib-dynload", sources, walked, skip=None)
    plan = {dest: _File(src) for dest, src in sources.items()}

    loaders: dict[str, Path] = {}
    for dest in ("bin/node", f"bin/python{xy}"):
        if dest in plan:
            interp = _elf_interp(plan[dest].source)
            if not interp:
                raise RuntimeBuildError(f"{plan[dest].source} is not a dynamically linked ELF executable: pass the "
                                        f"{'node' if dest == 'bin/node' else 'python'} executable itself")
            plan[dest].patch, plan[dest].interp = "exe", os.path.basename(interp)
            loaders[os.path.basename(interp)] = Path(os.path.realpath(interp))
    elfs = {dest: f for dest, f in plan.items() if f.elf}
    libs, missing = _closure([f.source for f in elfs.values()])
    for dest, f in elfs.items():
        if f.source in missing:
            if dest.startswith("bin/"):
                raise RuntimeBuildError(f"{f.source} needs {missing[f.source]}, which is not installed here: install "
                                        f"it (scripts/setup --system) or pass another executable")
            del plan[dest]  # an extension module the host cannot load either: its import fails there as here
    extras = _find_extras(libs)
    if extras:
        more, _ = _closure(list(extras.values()))
        for name, path in {**extras, **more}.items():
            libs.setdefault(name, path)
    for name, path in {**libs, **loaders}.items():
        plan[f"lib/{name}"] = _File(path)
    # the loader is the loader, and libc is loaded by it before any RPATH matters; patching either can break it
    unpatched = {f"lib/{name}" for name in loaders} | {"lib/libc.so.6"}
    for dest, f in plan.items():
        if f.elf and f.patch is None and dest not in unpatched:
            f.patch = "rpath"

    inputs = {str(f.source) for f in plan.values()} | {str(d) for d in walked}
    stats = []
    for path in sorted(inputs):
        st = os.stat(path)
        stats.append([path, st.st_size, st.st_mtime_ns])
    return version, plan, stats


def _walk_stdlib(top: Path, dest: str, sources: dict[str, Path], walked: list[Path], *, skip: Path | None) -> None:
    """Rule 4's stdlib copy: every file under `top` but the excluded ones, symlinks followed to their files."""
    for here, dirs, files in os.walk(top):
        rel = os.path.relpath(here, top)
        rel = "" if rel == "." else rel
        walked.append(Path(here))
        kept = []
        for d in sorted(dirs):
            if (not rel and d in SKIP_TOP) or os.path.join(rel, d) in SKIP_PATHS:
                continue
            if skip is not None and Path(os.path.realpath(os.path.join(here, d))) == skip:
                continue  # lib-dynload is walked on its own (it need not be under the stdlib)
            if d in SITE_DIRS and not rel:  # the venv's packages are mounted, never copied: the dir stays empty
                continue
            kept.append(d)
        dirs[:] = kept
        for name in sorted(files):
            if name.endswith(".pth"):  # a .pth would run code or add host paths at every start
                continue
            if not rel and dest.endswith("lib-dynload") and name.startswith("_tkinter."):
                continue  # tkinter/ is not copied; _tkinter would only drag in X11, Tcl and Tk
            if rel.startswith("config-") and name.startswith("libpython") and name.endswith(".a"):
                continue  # the static libpython links embedders at build time; nothing reads it at run time
            real = Path(os.path.realpath(os.path.join(here, name)))
            if real.is_file():  # a dangling symlink (Debian's sitecustomize without /etc/pythonX.Y) is skipped
                sources[f"{dest}/{rel}/{name}" if rel else f"{dest}/{name}"] = real


def _closure(files: list[Path]) -> tuple[dict[str, Path], dict[Path, str]]:
    """The shared libraries the loader would load for `files` (per ldd: DT_NEEDED, transitively, resolved through
    each object's RPATH/RUNPATH, ld.so.cache and the default directories): needed name → real path; and, per file,
    a needed name that resolves nowhere."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise RuntimeBuildError("ldd is not on PATH (it finds the libraries to copy): apt-get install libc-bin")
    # the host's resolution, not the caller's: LD_LIBRARY_PATH or LD_PRELOAD would change what ldd reports
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    libs: dict[str, Path] = {}
    missing: dict[Path, str] = {}
    batch = 64  # several files per ldd: one process start each costs more than the tracing itself
    for i in range(0, len(files), batch):
        chunk = files[i:i + batch]
        try:
            p = subprocess.run([ldd, *map(str, chunk)], capture_output=True, text=True, timeout=120, env=env,
                               stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeBuildError(f"ldd failed ({e}): check that ldd runs here (apt-get install libc-bin)") from None
        current = chunk[0]
        for line in p.stdout.splitlines():
            if not line.startswith("\t"):  # "FILE:" heads each file's list when ldd is given several
                current = Path(line.rstrip(":")) if line.endswith(":") else current
                continue
            name, arrow, rest = line.strip().partition(" => ")
            if not arrow:
                continue  # linux-vdso (no file), the loader (copied from PT_INTERP), "statically linked"
            target = rest.rsplit(" (", 1)[0].strip()
            if target == "not found":
                missing.setdefault(current, name)
            elif target.startswith("/"):
                # the first resolution wins: a name is one file in lib/, as the loader keeps one object per name
                libs.setdefault(name, Path(os.path.realpath(target)))
    return libs, missing


def _find_extras(libs: dict[str, Path]) -> dict[str, Path]:
    """EXTRA_LIBS the closure lacks, from the host's library directories (libc's first)."""
    dirs: list[Path] = []
    for name in ("libc.so.6", *sorted(libs)):
        if name in libs and libs[name].parent not in dirs:
            dirs.append(libs[name].parent)
    found = {}
    for name in EXTRA_LIBS:
        if name in libs:
            continue
        for d in dirs:
            if (d / name).is_file():
                found[name] = Path(os.path.realpath(d / name))
                break
    return found


def _key(version: str, plan: dict[str, _File]) -> str:
    """Rule 1: content-addressed — the same files in the same places give the same key, wherever they came from."""
    record = [FORMAT, INSIDE, version, sorted([dest, f.sha256, f.mode, f.patch, f.interp] for dest, f in plan.items())]
    return hashlib.sha256(json.dumps(record).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------- the build


def _build(cache: Path, root: Path, version: str, plan: dict[str, _File], patchelf: str) -> None:
    """Rules 2, 4–7: assemble in a temp dir under cache, publish it as `root` with one rename."""
    cache.mkdir(parents=True, exist_ok=True)
    _sweep(cache)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".build-"))
    try:
        _assemble(tmp, version, plan, patchelf)
        try:
            os.rename(tmp, root)
        except OSError:
            if not root.is_dir():
                raise
            # another builder published the same key first: its copy is identical (same inputs), ours goes
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _sweep(cache: Path) -> None:
    """Build dirs left by killed builders (a live build is seconds old)."""
    now = time.time()
    for entry in cache.glob(".build-*"):
        try:
            if now - entry.stat().st_mtime > STALE_BUILD_S:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass


def _assemble(tmp: Path, version: str, plan: dict[str, _File], patchelf: str) -> None:
    """The prefix's whole content, in `tmp`."""
    xy = ".".join(version.split(".")[:2])
    for d in ("bin", f"lib/python{xy}/site-packages", f"lib/python{xy}/lib-dynload", "venv/bin",
              f"venv/lib/python{xy}/site-packages"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    for dest, f in plan.items():
        target = tmp / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        # copy2 keeps the mtime: the stdlib's __pycache__ records its sources' mtimes, and the prefix is read-only
        shutil.copy2(f.source, target)
    for link in ("python3", "python"):
        os.symlink(f"python{xy}", tmp / "bin" / link)
        os.symlink(f"../../bin/python{xy}", tmp / "venv" / "bin" / link)
    (tmp / "venv" / "pyvenv.cfg").write_text(
        f"home = {INSIDE}/bin\ninclude-system-site-packages = false\nversion = {version}\n")

    for dest, f in sorted(plan.items()):
        if f.patch == "exe":
            _patchelf(patchelf, ["--set-interpreter", f"{INSIDE}/lib/{f.interp}", "--force-rpath", "--set-rpath",
                                 f"{INSIDE}/lib"], [tmp / dest])
    shared = [tmp / dest for dest, f in sorted(plan.items()) if f.patch == "rpath"]
    for i in range(0, len(shared), 64):
        _patchelf(patchelf, ["--force-rpath", "--set-rpath", f"{INSIDE}/lib"], shared[i:i + 64])

    modes = {tmp / dest: f.mode for dest, f in plan.items()}
    for here, dirs, files in os.walk(tmp):
        os.chmod(here, 0o755)
        for name in files:
            path = Path(here, name)
            if not path.is_symlink():
                os.chmod(path, modes.get(path, 0o644))


def _patchelf(patchelf: str, args: list[str], files: list[Path]) -> None:
    try:
        p = subprocess.run([patchelf, *args, *map(str, files)], capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeBuildError(f"patchelf did not run ({e}): {PATCHELF_FIX}") from None
    if p.returncode != 0:
        why = " ".join((p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1:])
        raise RuntimeBuildError(f"patchelf failed on {len(files)} file(s) ({why}): upgrade it ({PATCHELF_FIX})")


def _runtime(cache: Path, key: str, version: str, with_node: bool) -> Runtime:
    xy = ".".join(version.split(".")[:2])
    return Runtime(root=cache / key, key=key, python=f"{INSIDE}/bin/python3",
                   node=f"{INSIDE}/bin/node" if with_node else None, venv_python=f"{INSIDE}/venv/bin/python",
                   site_packages=f"{INSIDE}/venv/lib/python{xy}/site-packages")
