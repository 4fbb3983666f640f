"""Building a stand-in's root filesystem (rollout/images/standins.py's rules 3 and 4): the debian one by mmdebstrap from
Debian's mirror, the python one by copying the host's CPython onto it and installing the libraries it NEEDs with apt.

The builders are `build_debian_root` and `build_python_root`; each fills `work/root` and returns the json facts
(builder, packages installed, what was excluded) that the caller records beside the tarball. Every failure is a
`StandinError` whose text is one line naming the fix; every command's output is appended to the build log.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PY_MINOR = "3.12"
PY = f"python{PY_MINOR}"

# The real slim images drop these from every package (debuerreotype's slimify); dpkg keeps doing so in the image.
DPKG_EXCLUDES = ("path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
                 "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*",
                 "path-exclude=/usr/share/locale/*", "path-exclude=/usr/share/groff/*",
                 "path-exclude=/usr/share/lintian/*", "path-exclude=/usr/share/linda/*")
# The apt settings the real image carries: no caches or translations kept in a layer.
APT_CONF = {
    "docker-clean": 'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n',
    "docker-gzip-indexes": 'Acquire::GzipIndexes "true";\n',
    "docker-no-languages": 'Acquire::Languages "none";\n',
    "docker-autoremove-suggests": 'Apt::AutoRemove::SuggestsImportant "false";\n',
}
# What the official python image installs besides the libraries: /etc/services and /etc/protocols, and zoneinfo.
PYTHON_BASE_PACKAGES = ("ca-certificates", "netbase", "tzdata")
# bookworm's package for each library a CPython build may NEED; an unknown one is looked up in the host's dpkg.
SONAME_PACKAGES = {
    "libc.so.6": "libc6", "libm.so.6": "libc6", "libpthread.so.0": "libc6", "libdl.so.2": "libc6",
    "libutil.so.1": "libc6", "librt.so.1": "libc6", "ld-linux-x86-64.so.2": "libc6",
    "ld-linux-aarch64.so.1": "libc6", "libcrypt.so.1": "libcrypt1", "libssl.so.3": "libssl3",
    "libcrypto.so.3": "libssl3", "libffi.so.8": "libffi8", "libsqlite3.so.0": "libsqlite3-0", "libz.so.1": "zlib1g",
    "libbz2.so.1.0": "libbz2-1.0", "liblzma.so.5": "liblzma5", "libreadline.so.8": "libreadline8",
    "libncursesw.so.6": "libncursesw6", "libpanelw.so.6": "libncursesw6", "libformw.so.6": "libncursesw6",
    "libmenuw.so.6": "libncursesw6", "libtinfo.so.6": "libtinfo6", "libuuid.so.1": "libuuid1",
    "libgdbm.so.6": "libgdbm6", "libgdbm_compat.so.4": "libgdbm-compat4", "libexpat.so.1": "libexpat1",
    "libmpdec.so.3": "libmpdec3", "libnsl.so.2": "libnsl2", "libtirpc.so.3": "libtirpc3", "libdb-5.3.so": "libdb5.3",
    "libedit.so.2": "libedit2", "libgcc_s.so.1": "libgcc-s1", "libstdc++.so.6": "libstdc++6",
}
SMOKE_IMPORTS = "sys, ssl, sqlite3, ctypes, lzma, bz2, zlib, readline, decimal, uuid, hashlib, venv, ensurepip"
PIP_SCRIPT = f"""#!/usr/local/bin/{PY}
# -*- coding: utf-8 -*-
import re
import sys
from pip._internal.cli.main import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""
PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy")
MMDEBSTRAP_TIMEOUT_S = 1800  # a slow mirror, not a hang: a minbase is ~40 MB of packages
APT_TIMEOUT_S = 1200


class StandinError(RuntimeError):
    """A stand-in that cannot be built or loaded; str() is one line naming the fix."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class Sources:
    mirror: str
    security: str | None  # the host's security URI, when the mirror is the host's own
    origin: str  # where the mirror came from: "argument", a host file, or "default"

    def lines(self) -> list[str]:
        out = [f"deb {self.mirror} {SUITE} main", f"deb {self.mirror} {SUITE}-updates main"]
        if self.security:
            out.append(f"deb {self.security} {SUITE}-security main")
        return out

    def deb822(self) -> str:
        key = "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        text = f"Types: deb\nURIs: {self.mirror}\nSuites: {SUITE} {SUITE}-updates\nComponents: main\n{key}"
        if self.security:
            text += f"\nTypes: deb\nURIs: {self.security}\nSuites: {SUITE}-security\nComponents: main\n{key}"
        return text


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _mounts_under(base: Path) -> list[str]:
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
    except OSError:
        return []
    prefix = str(base).rstrip("/") + "/"
    return sorted((p for p in points if p.startswith(prefix) or p == str(base)), key=len, reverse=True)


def remove_tree(path: Path) -> None:
    """rm -rf that never descends through a mount (a killed mmdebstrap can leave /proc or /dev mounted in a root)."""
    if not path.exists() and not path.is_symlink():
        return
    for point in _mounts_under(path):
        subprocess.run(["umount", "-l", point], capture_output=True)
    left = _mounts_under(path)
    if left:
        raise StandinError(f"{left[0]} is still mounted; unmount it and remove {path}")
    shutil.rmtree(path)


# ---------------------------------------------------------------------------------------------------------------------
# building


def run_step(cmd: Sequence[str], *, what: str, log: Path, timeout: float, fix: str = "") -> str:
    """Run a build step, appending its output to `log`; StandinError with its first error line otherwise."""
    try:
        p = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace", timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise StandinError(f"{what} took over {timeout:g} s (log: {log}); {fix or 'check the mirror and retry'}") \
            from None
    except OSError as e:
        raise StandinError(f"{what}: {e}; {fix or 'install it (scripts/setup --system)'}") from None
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)[:2000]}\n{p.stdout}{p.stderr}\n[exit {p.returncode}]\n")
    if p.returncode != 0:
        lines = (p.stdout + "\n" + p.stderr).splitlines()
        err = next((x for x in lines if x.startswith(("E:", "ERROR", "error:"))), None) \
            or next((x for x in reversed(lines) if x.strip()), f"exit {p.returncode}")
        raise StandinError(f"{what} failed: {err.strip()[:300]} (log: {log}); {fix or 'see the log'}")
    return p.stdout


def _in_root(root: Path, script: str, *, what: str, log: Path, timeout: float = APT_TIMEOUT_S) -> str:
    """`script` under /bin/sh in the root, with /proc and /dev mounted in a private mount namespace: the mounts die
    with the process, so a failure or a kill leaves none behind in the cache."""
    # the host's proxy settings reach apt in the root, as they reach mmdebstrap; nothing else of its environment
    proxies = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items()) if k.lower() in PROXY_VARS)
    inner = ('set -e; mount -t proc proc "$1/proc"; mount --rbind /dev "$1/dev"; '
             'exec chroot "$1" /usr/bin/env -i PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 '
             f'HOME=/root DEBIAN_FRONTEND=noninteractive {proxies} /bin/sh -ec "$2"')
    return run_step(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", inner, "sh", str(root),
                 script], what=what, log=log, timeout=timeout)


def _pem_bodies(text: str) -> dict[str, str]:
    """{normalized base64 body: the PEM block} for each certificate in a bundle."""
    out = {}
    for m in re.finditer(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", text, re.S):
        out.setdefault("".join(m.group(1).split()), m.group(0))
    return out


def _install_ca(root: Path, bundle: bytes, log: Path) -> int:
    """Rule 3's CA: the host's certificates Debian lacks go to /usr/local/share/ca-certificates (so a later
    update-ca-certificates keeps them), then the host bundle's exact bytes replace the generated one. Returns how
    many extra certificates there were."""
    target = root / "etc/ssl/certs/ca-certificates.crt"
    debian = _pem_bodies(read_text(target))
    extra = [pem for body, pem in _pem_bodies(bundle.decode("ascii", "replace")).items() if body not in debian]
    local = root / "usr/local/share/ca-certificates"
    local.mkdir(parents=True, exist_ok=True)
    for i, pem in enumerate(extra):
        (local / f"polar-host-{i:03d}.crt").write_text(pem + "\n")
    if extra:
        _in_root(root, "update-ca-certificates >/dev/null", what="update-ca-certificates in the root", log=log)
    target.unlink(missing_ok=True)
    target.write_bytes(bundle)
    target.chmod(0o644)
    return len(extra)


def _finish_root(root: Path, sources: Sources) -> None:
    """What the real slim image looks like after debuerreotype: sources, apt config, nothing cached or host-specific."""
    apt = root / "etc/apt"
    (apt / "sources.list").unlink(missing_ok=True)
    (apt / "sources.list.d").mkdir(parents=True, exist_ok=True)
    (apt / "sources.list.d/debian.sources").write_text(sources.deb822())
    for name, text in APT_CONF.items():
        (apt / "apt.conf.d" / name).write_text(text)
    # docker mounts its own /dev, /etc/hostname and /etc/resolv.conf; the build host's must not ship
    for rel in ("etc/hostname", "etc/resolv.conf"):
        (root / rel).unlink(missing_ok=True)
    for rel in ("dev", "tmp", "run", "var/lib/apt/lists", "var/cache/apt", "var/log/apt"):
        d = root / rel
        for child in list(d.iterdir()) if d.is_dir() else []:
            if rel == "run" and child.name == "lock" or rel == "var/lib/apt/lists" and child.name == "partial":
                continue
            if rel == "var/cache/apt" and child.name == "archives":
                for deb in child.glob("*.deb"):
                    deb.unlink()
                continue
            if child.is_dir() and not child.is_symlink():
                remove_tree(child)
            else:
                child.unlink()
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    for pattern in ("var/log/*.log", "var/cache/debconf/*-old", "var/lib/dpkg/*-old"):
        for f in root.glob(pattern):
            f.unlink()


def installed_packages(root: Path, log: Path) -> dict[str, str]:
    out = run_step(["chroot", str(root), "dpkg-query", "-W", "-f", "${Package}\\t${Version}\\n"],
               what="dpkg-query -W in the root", log=log, timeout=120)
    return dict(line.split("\t", 1) for line in sorted(out.splitlines()) if "\t" in line)


def tar_root(root: Path, out: Path, log: Path) -> None:
    run_step(["tar", "--create", "--file", str(out), "--directory", str(root), "--numeric-owner", "--sort=name", "."],
         what="tar of the root", log=log, timeout=1200, fix="check the cache's free space")


def _mmdebstrap_version(log: Path) -> str:
    out = run_step(["mmdebstrap", "--version"], what="mmdebstrap --version", log=log, timeout=60,
               fix="install mmdebstrap (scripts/setup --system)")
    return out.split()[-1] if out.split() else "unknown"


def build_debian_root(work: Path, sources: Sources, bundle: bytes, log: Path) -> dict:
    root = work / "root"
    version = _mmdebstrap_version(log)
    cmd = ["mmdebstrap", "--variant=minbase", "--mode=root", "--format=directory", "--include=ca-certificates",
           # debootstrap's merged /usr: usr-is-merged; apt would otherwise pick usrmerge, which needs perl
           "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
           *(f"--dpkgopt={o}" for o in DPKG_EXCLUDES), SUITE, str(root), *sources.lines()]
    run_step(cmd, what="mmdebstrap", log=log, timeout=MMDEBSTRAP_TIMEOUT_S,
         fix=f"check that {sources.mirror} serves {SUITE} (pass --mirror URI)")
    extra = _install_ca(root, bundle, log)
    _finish_root(root, sources)
    return {"builder": {"tool": "mmdebstrap", "version": version, "variant": "minbase", "mode": "root",
                        "suite": SUITE, "mirror": sources.mirror, "mirror_from": sources.origin,
                        "sources": sources.lines(), "include": ["ca-certificates"], "merged_usr": "usr-is-merged",
                        "dpkg": list(DPKG_EXCLUDES)},
            "ca_extra_certificates": extra}


def _is_elf(path: Path) -> bool:
    """An ELF executable or shared object (not python.o, a relocatable object that links nothing)."""
    with open(path, "rb") as f:
        head = f.read(18)
    return head[:4] == b"\x7fELF" and len(head) == 18 and int.from_bytes(head[16:18], "little") in (2, 3)


def _elf_needed(path: Path) -> list[str]:
    """DT_NEEDED of an ELF64 little-endian file, read from its section headers (no binutils needed)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[4] != 2 or data[5] != 1:
        raise StandinError(f"{path} is not a 64-bit little-endian ELF; use an x86_64 or arm64 CPython")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    needed = []
    for s in sections:
        if s[1] != 6:  # SHT_DYNAMIC
            continue
        strtab = sections[s[6]][4]
        for off in range(s[4], s[4] + s[5], 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab + val)
                needed.append(data[strtab + val:end].decode())
    return needed


def _host_package(soname: str) -> str | None:
    """The host's Debian package holding `soname` (ldconfig -p, then dpkg-query -S), for a library the table lacks."""
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
        path = next((line.split("=>", 1)[1].strip() for line in cache.splitlines()
                     if line.strip().startswith(soname + " ") and "=>" in line), None)
        if path is None:
            return None
        out = subprocess.run(["dpkg-query", "-S", os.path.realpath(path)], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    package = out.split(":", 1)[0].strip()
    return package or None


def _skip_python_entry(rel: str) -> bool:
    """Rule 4's exclusions, for a path relative to the prefix."""
    lib = f"lib/{PY}/"
    if rel.startswith(lib):
        sub = rel[len(lib):]
        top = sub.split("/", 1)[0]
        if top in ("test", "idlelib", "tkinter", "turtledemo"):
            return True
        if top == "site-packages" and "/" in sub:
            entry = sub.split("/")[1]
            return not (entry == "pip" or re.fullmatch(r"pip-[^/]*\.dist-info", entry))
        if top == "lib-dynload" and sub.split("/")[-1].startswith("_tkinter"):
            return True  # tkinter is left out, and Tcl/Tk are not installed
        if re.fullmatch(r".*\.opt-[12]\.pyc", sub):
            return True  # -O/-OO bytecode (21 MB) that a plain python never reads
        if top.startswith("config-") and re.fullmatch(r"libpython.*\.a", sub.split("/")[-1]):
            return True  # 60 MB static library; the official image deletes libpython*.a too
    if rel.startswith("bin/"):
        name = rel[4:]
        return name.startswith(("idle", "pip"))  # idlelib is left out; pip scripts are written fresh
    return False


def _copy_python(prefix: Path, dest: Path) -> list[Path]:
    """Copy the prefix into dest (the root's /usr/local), rule 4's exclusions applied; returns the ELF files copied."""
    elves = []
    for dirpath, dirnames, filenames in os.walk(prefix):
        here = Path(dirpath)
        rel_dir = here.relative_to(prefix).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        keep_dirs = []
        for d in sorted(dirnames):
            rel = rel_dir + d
            src = here / d
            if _skip_python_entry(rel):
                continue
            if src.is_symlink():
                filenames.append(d)  # copied as the link it is
            else:
                keep_dirs.append(d)
                (dest / rel).mkdir(parents=True, exist_ok=True)
                shutil.copystat(src, dest / rel)
        dirnames[:] = keep_dirs
        for name in sorted(filenames):
            rel = rel_dir + name
            if _skip_python_entry(rel):
                continue
            src, dst = here / name, dest / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                target = os.readlink(src)
                if Path(target).is_absolute() and Path(target).is_relative_to(prefix):
                    # a link into the host prefix points at the same file under /usr/local, relatively
                    target = os.path.relpath(Path(target).relative_to(prefix), Path(rel).parent)
                os.symlink(target, dst)
            else:
                shutil.copy2(src, dst)
                if _is_elf(dst):
                    elves.append(dst)
    return elves


def _rewrite_prefix(local: Path, prefix: Path) -> None:
    """The host prefix → /usr/local in sysconfig data, pkg-config files, python-config and script shebangs."""
    old = str(prefix).rstrip("/").encode()
    texts = [*local.glob(f"lib/{PY}/_sysconfigdata_*.py"), *local.glob("lib/pkgconfig/*.pc"),
             *local.glob(f"lib/{PY}/config-*/Makefile"), *local.glob(f"lib/{PY}/config-*/python-config.py"),
             *local.glob(f"bin/{PY}-config")]
    for f in texts:
        if f.is_file() and not f.is_symlink():
            f.write_bytes(f.read_bytes().replace(old, b"/usr/local"))
    for f in local.glob(f"lib/{PY}/__pycache__/_sysconfigdata_*.pyc"):
        f.unlink()  # compiled from the old text
    for f in (local / "bin").iterdir():
        if f.is_file() and not f.is_symlink():
            data = f.read_bytes()
            if data.startswith(b"#!" + old):
                f.write_bytes(f"#!/usr/local/bin/{PY}".encode() + data[data.find(b"\n"):])


def _python_packages(elves: list[Path], local: Path, prefix: Path) -> dict[str, str]:
    """{soname: Debian package} for every library the ELF files NEED that /usr/local does not hold."""
    own = {p.name for p in local.rglob("*.so*")}
    out = {}
    for f in elves:
        for soname in _elf_needed(f):
            if soname in own or soname in out:
                continue
            package = SONAME_PACKAGES.get(soname) or _host_package(soname)
            if package is None:
                raise StandinError(f"CPython at {prefix} needs {soname} ({f.relative_to(local)}), which no known "
                                   f"Debian package provides; add it to SONAME_PACKAGES in polar.rollout.standin_roots")
            out[soname] = package
    return dict(sorted(out.items()))


def build_python_root(work: Path, debian_tar: Path, sources: Sources, bundle: bytes, prefix: Path, version: str,
                  tools: dict[str, bool], log: Path) -> dict:
    root = work / "root"
    root.mkdir()
    run_step(["tar", "--extract", "--file", str(debian_tar), "--directory", str(root), "--numeric-owner",
          "--same-permissions"], what="extracting the debian stand-in", log=log, timeout=600)
    local = root / "usr/local"
    staging = work / "local"  # copied and checked here first: the package list depends on what the ELF files NEED
    staging.mkdir()
    elves = _copy_python(prefix, staging)
    libs = _python_packages(elves, staging, prefix)
    packages = sorted({*PYTHON_BASE_PACKAGES, *libs.values()})
    if Path("/etc/resolv.conf").is_file():  # apt in the root resolves the mirror's name as the host does
        shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
    _in_root(root, "apt-get update -qq\n"
                   f"apt-get install -y -qq --no-install-recommends {' '.join(packages)} >/dev/null\n"
                   "apt-get clean\n", what="apt-get install in the python root", log=log)
    if tools["strip"]:  # the official image links with --strip-all; this drops the debug info only (~40 MB)
        run_step(["strip", "--strip-debug", *map(str, elves)], what="strip --strip-debug", log=log, timeout=300)
    if tools["patchelf"]:  # the host prefix's RUNPATH would leak into the image; $ORIGIN finds libpython anywhere
        for f in elves:
            rpath = "$ORIGIN/../lib" if f.parent.name == "bin" else ""
            args = ["--set-rpath", rpath] if rpath else ["--remove-rpath"]
            run_step(["patchelf", *args, str(f)], what=f"patchelf {f.name}", log=log, timeout=120)
    _rewrite_prefix(staging, prefix)
    for name in ("pip", "pip3", f"pip{PY_MINOR}"):
        (staging / "bin" / name).write_text(PIP_SCRIPT)
        (staging / "bin" / name).chmod(0o755)
    for link, target in (("python", "python3"), ("python3", PY)):
        if not (staging / "bin" / link).exists():
            os.symlink(target, staging / "bin" / link)
    # /usr/local's own skeleton (from the root) stays; the prefix is merged on top
    for item in sorted(staging.iterdir()):
        dst = local / item.name
        if dst.is_dir() and not dst.is_symlink() and item.is_dir():
            shutil.copytree(item, dst, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.move(str(item), str(dst))
    (root / "etc/pip.conf").write_text(f"[global]\ncert = {CA_BUNDLE}\n")
    ldd = " ".join(f"/usr/local/{f.relative_to(staging).as_posix()}" for f in elves)
    out = _in_root(root, f"ldconfig\nfor f in {ldd}; do echo \"== $f\"; ldd \"$f\"; done\n"
                         f"python3 -c 'import {SMOKE_IMPORTS}; print(sys.version)'\n"
                         "pip --version\n", what="checking CPython in the python root", log=log, timeout=300)
    missing = [line.split()[0] for line in out.splitlines() if "not found" in line]
    if missing:
        raise StandinError(f"in the python root, {missing[0]} is not found by ldd (log: {log}); add its Debian "
                           f"package to SONAME_PACKAGES in polar.rollout.standin_roots")
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    _install_ca(root, bundle, log)  # a package's trigger may have regenerated the bundle
    _finish_root(root, sources)
    return {"builder": {"tool": "apt-get in the debian stand-in's root", "installed": packages},
            "python": {"version": version, "prefix": str(prefix), "into": "/usr/local", "libraries": libs,
                       "stripped": tools["strip"], "rpath": "$ORIGIN/../lib" if tools["patchelf"] else "unchanged",
                       "excluded": [*(f"lib/{PY}/{x}" for x in ("test", "idlelib", "tkinter", "turtledemo")),
                                    f"lib/{PY}/lib-dynload/_tkinter*", f"lib/{PY}/config-*/libpython*.a",
                                    "*.opt-1.pyc", "*.opt-2.pyc", "bin/idle*",
                                    f"lib/{PY}/site-packages/* but pip and pip-*.dist-info"],
                       "pip_conf": "/etc/pip.conf"}}
