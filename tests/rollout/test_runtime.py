"""The sandbox runtime (rollout/images/runtime.py), for real: the prefix is built once for this module, then run under bwrap
over an EMPTY root (nothing of the host but the prefix) and over a root whose loader, libc and ld.so.cache are
decoys; then reused from the cache, raced by two builders, and refused with one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from polar.rollout.images import runtime as rt
from tests.support.need import CLIS, SYSTEM, need

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
PYTHON = Path(os.path.realpath(sys.executable))  # the real interpreter behind .venv/bin/python
NODE = shutil.which("node")
XY = f"{sys.version_info[0]}.{sys.version_info[1]}"
# native-extension packages of the venv: libstdc++/libgcc_s users (greenlet, tokenizers, numpy) and Rust ones
NATIVE = ("orjson", "pydantic_core", "greenlet", "tokenizers", "numpy", "msgpack")

# run inside: every shared object this process maps, after importing what the wrapper and agents use
MAPS = """
def mapped():
    out = set()
    for line in open("/proc/self/maps"):
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and ".so" in fields[5]:
            out.add(fields[5].strip())
    return sorted(out)
"""

STDLIB = r"""
import asyncio, bz2, ctypes, decimal, json, lzma, os, sqlite3, ssl, subprocess, sys, uuid, zlib
out = {"usr": os.path.exists("/usr"), "executable": sys.executable, "prefix": sys.prefix}
ctx = ssl.create_default_context()  # no CA file anywhere in this root: a context without certs, not an error
out["ssl"] = [ssl.OPENSSL_VERSION.split()[0], ctx.verify_mode == ssl.CERT_REQUIRED, ctx.cert_store_stats()["x509"]]
out["sqlite"] = sqlite3.connect(":memory:").execute("select 6 * 7").fetchone()[0]
out["ctypes"] = ctypes.CDLL("libc.so.6").getpid() == os.getpid()  # a dlopen by name, through the prefix's RPATH
data = b"polar " * 1000
out["codecs"] = [m.decompress(m.compress(data)) == data for m in (zlib, lzma, bz2)]
out["json"] = json.loads('{"a": [1, 2.5]}')
out["asyncio"] = asyncio.run(asyncio.sleep(0, result="slept"))
out["decimal"] = str(decimal.Decimal("0.1") + decimal.Decimal("0.2"))
out["uuid"] = uuid.uuid4().version
child_code = "import os; print(6*7, sorted(k for k in os.environ if k.startswith('LD_')))"
child = subprocess.run([sys.executable, "-c", child_code], capture_output=True, text=True)
out["child"] = [child.returncode, child.stdout.strip(), child.stderr]
out["mapped"] = mapped()
"""
STDLIB_PROBE = MAPS + STDLIB + "print(json.dumps(out))\n"
# a program of the root's own (/bin/true), started by the prefix's python: the root's loader runs it
IMAGE_PROGRAM = """
import errno
try:
    out["image"] = subprocess.run(["/bin/true"]).returncode
except OSError as e:
    out["image"] = errno.errorcode.get(e.errno, str(e.errno))
"""


# ---------------------------------------------------------------------------------------------- helpers


def _need_patchelf() -> None:
    need(None if shutil.which("patchelf") else "patchelf is not on PATH (apt-get install patchelf)", setup=SYSTEM)


def _need_tools() -> None:
    need(None if shutil.which("bwrap") else "bwrap is not on PATH", setup=SYSTEM)
    _need_patchelf()


def _need_node() -> None:
    need(None if NODE else "node is not on PATH", setup=CLIS)


def bwrap(runtime: rt.Runtime, argv: list[str], *, root: Path | None = None, binds: tuple = (),
          timeout: float = 120) -> subprocess.CompletedProcess:
    """`argv` in a sandbox holding only the runtime at INSIDE (and `binds`): over an empty tmpfs root, or `root`."""
    cmd = [shutil.which("bwrap"), "--unshare-all", "--die-with-parent"]
    cmd += ["--ro-bind", str(root), "/"] if root is not None else ["--tmpfs", "/"]
    cmd += ["--ro-bind", str(runtime.root), rt.INSIDE]
    for src, dst in binds:
        cmd += ["--ro-bind", str(src), dst]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp", "--", *argv]
    # a bare environment: nothing of the host's (no LD_*, no NODE_EXTRA_CA_CERTS naming a host file)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env={"PATH": f"{rt.INSIDE}/bin", "HOME": "/tmp"})


def run_json(runtime: rt.Runtime, argv: list[str], **kw) -> dict:
    p = bwrap(runtime, argv, **kw)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def outside(mapped: list[str]) -> list[str]:
    return [path for path in mapped if not path.startswith(rt.INSIDE + "/")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The runtime of this machine's interpreter (and node when there is one), built once for the module."""
    _need_tools()
    cache = tmp_path_factory.mktemp("runtime-cache")
    start = time.monotonic()
    runtime = rt.build_runtime(cache, python=PYTHON, node=Path(NODE) if NODE else None)
    print(f"runtime built in {time.monotonic() - start:.1f}s at {runtime.root}")
    yield runtime
    shutil.rmtree(cache, ignore_errors=True)  # ~200 MB: not kept with pytest's last three temp dirs


# ---------------------------------------------------------------------------------------------- the prefix's layout


def test_the_runtime_names_inside_paths_and_lives_under_its_key(built):
    assert built.root == built.root.parent / built.key and len(built.key) == 64
    assert int(built.key, 16) >= 0  # hex
    assert built.python == f"{rt.INSIDE}/bin/python3"
    assert built.node == (f"{rt.INSIDE}/bin/node" if NODE else None)
    assert built.venv_python == f"{rt.INSIDE}/venv/bin/python"
    assert built.site_packages == f"{rt.INSIDE}/venv/lib/python{XY}/site-packages"
    with pytest.raises(AttributeError):
        built.key = "other"  # frozen


def test_the_layout_holds_the_interpreter_its_libraries_and_a_venv_view(built):
    root = built.root
    assert os.readlink(root / "bin" / "python3") == f"python{XY}"
    assert os.readlink(root / "bin" / "python") == f"python{XY}"
    assert (root / "bin" / "node").is_file() == bool(NODE)
    assert os.readlink(root / "venv" / "bin" / "python") == f"../../bin/python{XY}"
    assert os.readlink(root / "venv" / "bin" / "python3") == f"../../bin/python{XY}"
    cfg = (root / "venv" / "pyvenv.cfg").read_text().splitlines()
    assert f"home = {rt.INSIDE}/bin" in cfg and "include-system-site-packages = false" in cfg
    assert f"version = {'.'.join(map(str, sys.version_info[:3]))}" in cfg
    assert list((root / "venv" / "lib" / f"python{XY}" / "site-packages").iterdir()) == []  # the mount point

    lib = root / "lib"
    host_interp = rt._elf_interp(PYTHON)
    assert (lib / os.path.basename(host_interp)).is_file()
    assert rt._elf_interp(root / "bin" / f"python{XY}") == f"{rt.INSIDE}/lib/{os.path.basename(host_interp)}"
    for name in ("libc.so.6", "libssl.so.3", "libcrypto.so.3", "libffi.so.8", "libz.so.1", "libsqlite3.so.0"):
        assert (lib / name).is_file(), name
    for name in rt.EXTRA_LIBS:  # what native wheels NEED, whenever the host has it
        host = [d for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64")
                if os.path.isfile(os.path.join(d, name))]
        assert (lib / name).is_file() or not host, name


def test_the_stdlib_is_copied_without_tests_site_packages_or_pth(built):
    stdlib = built.root / "lib" / f"python{XY}"
    assert (stdlib / "os.py").is_file() and (stdlib / "lib-dynload").is_dir()
    assert any(p.name.startswith("_ssl.") for p in (stdlib / "lib-dynload").iterdir())
    for gone in ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3/tests"):
        assert not (stdlib / gone).exists(), gone
    assert list((stdlib / "site-packages").iterdir()) == []
    assert not list(built.root.rglob("*.pth"))
    assert not list((stdlib / "lib-dynload").glob("_tkinter.*"))


def test_everything_is_readable_by_any_uid(built):
    assert stat.S_IMODE(built.root.stat().st_mode) == 0o755
    for here, dirs, files in os.walk(built.root):
        for d in dirs:
            path = Path(here, d)
            assert path.is_symlink() or stat.S_IMODE(path.stat().st_mode) == 0o755, path
        for name in files:
            path = Path(here, name)
            if not path.is_symlink():
                assert stat.S_IMODE(path.lstat().st_mode) in (0o644, 0o755), path
    assert stat.S_IMODE((built.root / "bin" / f"python{XY}").stat().st_mode) == 0o755


def test_site_packages_of_names_the_venvs_site_packages(tmp_path):
    assert rt.site_packages_of(VENV) == VENV / "lib" / f"python{XY}" / "site-packages"
    with pytest.raises(rt.RuntimeBuildError) as err:
        rt.site_packages_of(tmp_path)
    assert "\n" not in str(err.value) and "not a venv" in str(err.value)


# ---------------------------------------------------------------------------------------- it runs with nothing else


def test_python_runs_over_an_empty_root_with_its_stdlib(built):
    out = run_json(built, [built.python, "-c", STDLIB_PROBE])
    assert out["usr"] is False  # nothing of the host's system is there
    assert out["executable"] == built.python and out["prefix"] == rt.INSIDE
    assert out["ssl"][0] == "OpenSSL" and out["ssl"][1] is True and out["ssl"][2] == 0
    assert out["sqlite"] == 42 and out["ctypes"] is True and out["codecs"] == [True, True, True]
    assert out["json"] == {"a": [1, 2.5]} and out["asyncio"] == "slept" and out["decimal"] == "0.3"
    assert out["uuid"] == 4
    assert outside(out["mapped"]) == []
    assert f"{rt.INSIDE}/lib/libssl.so.3" in out["mapped"] and f"{rt.INSIDE}/lib/libc.so.6" in out["mapped"]


def test_children_re_exec_the_prefixs_interpreter_without_ld_variables(built):
    out = run_json(built, [built.python, "-c", STDLIB_PROBE])
    assert out["child"] == [0, "42 []", ""]


def test_node_runs_over_an_empty_root(built):
    _need_node()
    host = subprocess.run([NODE, "-p", "process.version"], capture_output=True, text=True, timeout=60).stdout.strip()
    p = bwrap(built, [built.node, "-e", 'require("https"); require("crypto").createHash("sha256").update("x"); '
                                        'console.log(process.version)'])
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == host and host.startswith("v")
    assert p.stderr == ""


def test_the_venv_view_imports_the_host_venvs_native_packages(built):
    import importlib.util

    present = [m for m in NATIVE if importlib.util.find_spec(m) is not None]
    assert len(present) >= 2, f"the venv has too few native packages to test with: {present}"
    code = MAPS + f"import json, sys, httpx\nimport {', '.join(present)}\n" + \
        "print(json.dumps({'prefix': sys.prefix, 'base': sys.base_prefix, 'mapped': mapped()}))"
    out = run_json(built, [built.venv_python, "-c", code],
                   binds=[(rt.site_packages_of(VENV), built.site_packages)])
    assert out["prefix"] == f"{rt.INSIDE}/venv" and out["base"] == rt.INSIDE
    assert outside(out["mapped"]) == []  # the wheels' libstdc++, libgcc_s, … came from the prefix too
    from_venv = [p for p in out["mapped"] if p.startswith(built.site_packages + "/")]
    assert len(from_venv) >= len(present)


def test_python_ignores_the_roots_loader_libc_and_ld_so_cache(built, tmp_path):
    """Over a root whose /lib64 loader, libc, libssl and /etc/ld.so.cache are garbage, the prefix still runs, and
    what it starts from the root uses the root's loader (so fails here, on the decoy)."""
    fake = tmp_path / "fake-root"
    for d in ("lib64", "lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "etc", "bin", "run/polar/rt", "proc",
              "dev", "tmp"):
        (fake / d).mkdir(parents=True)
    interp = os.path.basename(rt._elf_interp(PYTHON))
    for decoy in (f"lib64/{interp}", f"lib/x86_64-linux-gnu/{interp}", "lib/x86_64-linux-gnu/libc.so.6",
                  "usr/lib/x86_64-linux-gnu/libssl.so.3", "usr/lib/x86_64-linux-gnu/libstdc++.so.6", "etc/ld.so.cache"):
        (fake / decoy).write_text("decoy: not a library\n")
        (fake / decoy).chmod(0o755)  # executable: what makes an exec through it fail is its content
    true = shutil.which("true")
    shutil.copy(true, fake / "bin" / "true")  # a program of the root's: it runs on the root's (decoy) loader
    code = MAPS + STDLIB + IMAGE_PROGRAM + "print(json.dumps(out))\n"
    out = run_json(built, [built.python, "-c", code], root=fake)
    assert out["usr"] is True and out["sqlite"] == 42 and out["child"][:2] == [0, "42 []"]
    assert outside(out["mapped"]) == []
    # the root's /bin/true is there, and exec fails on the root's decoy loader: the prefix's lib/ is not in its way
    # (the errno says the loader is bad: EIO for a decoy shorter than an ELF header, ELIBBAD/ENOEXEC otherwise)
    assert isinstance(out["image"], str) and out["image"] not in ("ENOENT", "EACCES"), out["image"]


# ---------------------------------------------------------------------------------------------- the cache


def test_a_second_call_reuses_the_runtime_without_rebuilding(built, monkeypatch):
    before = built.root.stat().st_mtime_ns

    def no(*_a, **_k):
        raise AssertionError("rebuilt or re-hashed")

    monkeypatch.setattr(rt, "_plan", no)
    monkeypatch.setattr(rt, "_assemble", no)
    again = rt.build_runtime(built.root.parent, python=PYTHON, node=Path(NODE) if NODE else None)
    assert again == built and built.root.stat().st_mtime_ns == before


def test_the_key_is_content_addressed(built, monkeypatch):
    """Without its stamp the inputs are hashed again: the same content gives the same key, and nothing is built."""
    cache = built.root.parent
    shutil.rmtree(cache / ".stamps")

    def no(*_a, **_k):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(rt, "_assemble", no)
    again = rt.build_runtime(cache, python=PYTHON, node=Path(NODE) if NODE else None)
    assert again == built
    assert len(list((cache / ".stamps").glob("*.json"))) == 1  # the stamp is written again


def test_two_concurrent_builders_both_get_one_complete_runtime(built, tmp_path, monkeypatch):
    """Forced to build at the same time (a barrier inside the build): one publishes, the other discards its copy.
    Without node: another input, so another key than the module's runtime."""
    cache = tmp_path / "cache"
    barrier = threading.Barrier(2, timeout=120)
    assemble = rt._assemble
    calls = []

    def racing(*args, **kw):
        calls.append(1)
        barrier.wait()
        assemble(*args, **kw)
        barrier.wait()  # both copies complete before either publishes

    monkeypatch.setattr(rt, "_assemble", racing)
    results: list = [None, None]

    def build(i: int) -> None:
        try:
            results[i] = rt.build_runtime(cache, python=PYTHON, node=None)
        except BaseException as e:  # noqa: BLE001 - reported by the assert below
            results[i] = e

    threads = [threading.Thread(target=build, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(isinstance(r, rt.Runtime) for r in results), results
    assert len(calls) == 2 and results[0] == results[1]
    runtime = results[0]
    assert runtime.node is None and not (runtime.root / "bin" / "node").exists()
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".stamps")] == [runtime.key]  # no .build-*
    if NODE:
        assert runtime.key != built.key
    p = bwrap(runtime, [runtime.python, "-c", "import ssl, sqlite3; print(6*7)"])
    shutil.rmtree(cache, ignore_errors=True)  # ~100 MB
    assert (p.returncode, p.stdout) == (0, "42\n"), p.stderr


# ---------------------------------------------------------------------------------------------- refusals


def _one_line(err: pytest.ExceptionInfo, *fix: str) -> str:
    text = str(err.value)
    assert "\n" not in text and text.strip() == text
    for part in fix:
        assert part in text, text
    return text


def test_a_missing_python_is_refused(tmp_path):
    with pytest.raises(rt.RuntimeBuildError) as err:
        rt.build_runtime(tmp_path / "cache", python=tmp_path / "no-python", node=None)
    _one_line(err, "does not exist", "pass a CPython executable")
    assert not (tmp_path / "cache").exists()


def test_a_non_cpython_executable_is_refused(tmp_path):
    _need_patchelf()  # checked first: the interpreter is probed only on the way to a build
    with pytest.raises(rt.RuntimeBuildError) as err:
        rt.build_runtime(tmp_path / "cache", python=Path(shutil.which("true")), node=None)
    _one_line(err, "CPython")


def test_a_node_that_is_missing_or_not_elf_is_refused(tmp_path):
    with pytest.raises(rt.RuntimeBuildError) as err:
        rt.build_runtime(tmp_path / "cache", python=PYTHON, node=tmp_path / "no-node")
    _one_line(err, "does not exist", "install Node.js")
    script = tmp_path / "node"
    script.write_text("#!/bin/sh\necho v20\n")
    script.chmod(0o755)
    with pytest.raises(rt.RuntimeBuildError) as err:
        rt.build_runtime(tmp_path / "cache", python=PYTHON, node=script)
    _one_line(err, "not an ELF executable", "install Node.js")


def test_a_missing_patchelf_is_refused(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(rt.RuntimeBuildError) as err:
        rt.build_runtime(tmp_path / "cache", python=PYTHON, node=None)
    _one_line(err, "patchelf", "apt-get install patchelf, or scripts/setup --system")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_native_cli_runs_on_the_runtimes_loader_and_libraries(tmp_path):
    """A CLI that npm installs as an ELF executable (Claude Code's bin/claude.exe) runs through the runtime's loader
    with the runtime's libraries; a script gets None (node runs it); a runtime without a library the executable
    needs is refused in one line naming it. (tests/rollout/test_swe_agents.py runs Claude Code so in an image.)"""
    exe = tmp_path / "native-cli"
    shutil.copyfile("/bin/true", exe)
    script = tmp_path / "cli.js"
    script.write_text("#!/usr/bin/env node\n")
    root = tmp_path / "rt"
    (root / "lib").mkdir(parents=True)
    loader = os.path.basename(rt._elf_interp(exe))
    (root / "lib" / loader).write_bytes(b"")
    runtime = rt.Runtime(root=root, key="k", python="", node=f"{rt.INSIDE}/bin/node", venv_python="", site_packages="")
    with pytest.raises(rt.RuntimeBuildError, match=r"lacks libc\.so\.6, which native-cli needs"):
        rt.native_launcher(runtime, exe)
    (root / "lib" / "libc.so.6").write_bytes(b"")
    exe.touch()  # a new version of the executable is looked at again
    os.utime(exe, ns=(time.time_ns(), time.time_ns() + 1))
    assert rt.native_launcher(runtime, exe) == [f"{rt.INSIDE}/lib/{loader}", "--library-path", f"{rt.INSIDE}/lib"]
    assert rt.native_launcher(runtime, script) is None
