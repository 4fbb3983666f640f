"""Stand-in base images for air-gapped builds: `debian:bookworm-slim` and `python:3.12-slim`, built from Debian's
mirror (no image registry is reachable here) and mapped in with `polar-rollout --image-map @FILE` (`image_map_lines`).

    python -m polar.rollout.standins build [--cache DIR] [--mirror URI] [--python PREFIX]   # scripts/build-standins
    python -m polar.rollout.standins load [--cache DIR]     # docker import into $DOCKER_HOST's daemon
    python -m polar.rollout.standins map                    # the --image-map lines

Rules. Each violation is a `StandinError` whose text is one line naming the fix.
1. STANDINS are `debian:bookworm-slim` → `polar-standin/debian:bookworm-slim` and `python:3.12-slim` →
   `polar-standin/python:3.12-slim`. Each is a rootfs tarball `NAME.tar` in the cache (default
   `<repo>/.cache/images/`), a `NAME.json` saying what it really is (reference, builder, Debian packages with
   versions, CPython version and the prefix it came from, the CA bundle's and the tarball's sha256, the build time)
   and a stamp `NAME.key`, written last.
2. The mirror is the `mirror` argument, else the URI of the host's apt source for the suite
   (/etc/apt/sources.list.d/*.sources, then *.list and /etc/apt/sources.list), else http://deb.debian.org/debian.
   It is an http, https or file URI, and its `dists/bookworm/InRelease` answers before anything is built. The host's
   `bookworm-security` source is added only when the mirror is the host's own (an override may not carry it).
3. The debian stand-in is `mmdebstrap --variant=minbase` of bookworm plus ca-certificates, merged /usr the
   debootstrap way (usr-is-merged, not usrmerge, which pulls perl), docs, man pages and locales path-excluded as
   the real slim image's dpkg config does; then the host CA bundle's exact bytes at
   /etc/ssl/certs/ca-certificates.crt (its certificates that Debian lacks also go to /usr/local/share/ca-certificates,
   so a later update-ca-certificates keeps them), /etc/apt/sources.list.d/debian.sources pointing at the same
   mirror, and apt lists, caches, logs, /dev, /etc/hostname and /etc/resolv.conf emptied as the real image has them.
4. The python stand-in is the debian stand-in's tarball, extracted, plus netbase, tzdata and the Debian packages
   that provide every library the CPython's ELF files NEED (SONAME_PACKAGES, else the host's dpkg), installed with
   apt-get in the root; plus the host's CPython 3.12 (the `python_prefix` argument, else $POLAR_STANDIN_PYTHON, else
   the newest /root/.pyenv/versions/3.12.N) copied into /usr/local without lib/python3.12/{test, idlelib, tkinter,
   turtledemo}, _tkinter, the static libpython, idle and every site-packages entry but pip and its dist-info. Its
   host prefix is rewritten to /usr/local in sysconfig data, pkg-config files and script shebangs; pip, pip3 and
   pip3.12 are written fresh; /etc/pip.conf names the CA bundle; ldconfig runs in the root. Every ELF file resolves
   under `ldd` in the root and `python3` imports ssl, sqlite3, ctypes, lzma, bz2, zlib and readline there, or the
   build fails naming what is missing. CPython is never built from source.
5. A stand-in's key is the sha256 of its inputs: BUILDER_VERSION, the reference, the suite, the apt sources, the CA
   bundle's sha256, and for python the debian key, the prefix's path and version and whether strip and patchelf
   were used. A build whose stamp, json and tarball agree with the key is a no-op; building needs root, mmdebstrap,
   tar and unshare, and holds `.lock` in the cache so two builders do not interleave.
6. `load_standins` runs `docker import` on each tarball (the daemon is $DOCKER_HOST's) with ENV PATH, LANG (and
   PYTHON_VERSION), CMD, and labels org.polar.standin.for / .is / .key; a tag that already carries the same key is
   left alone. It returns {reference: local tag}.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Bump when the build changes what a tarball holds, so every cached stand-in is rebuilt once.
BUILDER_VERSION = 1
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "images"
PYENV_VERSIONS = Path("/root/.pyenv/versions")
PYTHON_ENV = "POLAR_STANDIN_PYTHON"
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
PATH_DEBIAN = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PATH_PYTHON = "/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LABEL_FOR, LABEL_IS, LABEL_KEY = "org.polar.standin.for", "org.polar.standin.is", "org.polar.standin.key"
MMDEBSTRAP_TIMEOUT_S = 1800  # a slow mirror, not a hang: a minbase is ~40 MB of packages
APT_TIMEOUT_S = 1200
IMPORT_TIMEOUT_S = 600  # a ~200 MB tarball into a vfs daemon


class StandinError(RuntimeError):
    """A stand-in that cannot be built or loaded; str() is one line naming the fix."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class StandinSpec:
    """One base image we stand in for."""

    reference: str  # what task Dockerfiles name
    local: str  # the local tag it is imported as
    what: str  # one line: what the stand-in is made of
    python: bool = False  # the python stand-in: the debian one plus a CPython in /usr/local

    @property
    def name(self) -> str:
        """The cache file stem: `debian-bookworm-slim`."""
        return re.sub(r"[^A-Za-z0-9._-]", "-", self.reference)


STANDINS: tuple[StandinSpec, ...] = (
    StandinSpec("debian:bookworm-slim", "polar-standin/debian:bookworm-slim",
                "Debian bookworm minbase from the configured mirror + the host CA bundle"),
    StandinSpec("python:3.12-slim", "polar-standin/python:3.12-slim",
                "the debian stand-in + the host's CPython 3.12 in /usr/local and its runtime libraries", python=True),
)


@dataclass(frozen=True)
class Standin:
    """A built stand-in: its tarball in the cache and what it really is."""

    reference: str
    local: str
    tarball: Path
    meta: dict = field(hash=False, compare=False)  # NAME.json
    key: str = ""  # the stamp key (rule 5)


# ---------------------------------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class _Sources:
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


def host_apt_sources(root: Path = Path("/")) -> list[tuple[str, str, str]]:
    """(uri, suite, file) for each enabled `deb` source of the host's apt: deb822 files first, then one-line ones."""
    out: list[tuple[str, str, str]] = []
    d = root / "etc/apt/sources.list.d"
    for f in sorted(d.glob("*.sources")) if d.is_dir() else []:
        for stanza in re.split(r"\n\s*\n", _read(f)):
            fields: dict[str, str] = {}
            last = None
            for line in stanza.splitlines():
                if line.startswith("#") or not line.strip():
                    continue
                if line[:1].isspace() and last:  # a continuation line
                    fields[last] += " " + line.strip()
                elif ":" in line:
                    last, _, value = line.partition(":")
                    last = last.strip().lower()
                    fields[last] = value.strip()
            if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
                continue
            for uri in fields.get("uris", "").split():
                out += [(uri, suite, str(f)) for suite in fields.get("suites", "").split()]
    lists = sorted(d.glob("*.list")) if d.is_dir() else []
    for f in [root / "etc/apt/sources.list", *lists]:
        for line in _read(f).splitlines():
            words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()  # drop [options]
            if len(words) >= 3 and words[0] == "deb":
                out.append((words[1], words[2], str(f)))
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def resolve_sources(mirror: str | None = None) -> _Sources:
    """Rule 2, without the reachability check."""
    host = host_apt_sources()
    main = next(((u, f) for u, s, f in host if s == SUITE), None)
    security = next((u for u, s, _ in host if s == f"{SUITE}-security"), None)
    if mirror is not None:
        uri, origin = mirror.strip().rstrip("/"), "argument"
        if main is not None and uri == main[0].rstrip("/"):
            origin = main[1]
        else:
            security = None  # an override may be a local mirror that carries no security suite
    elif main is not None:
        uri, origin = main[0].rstrip("/"), main[1]
    else:
        uri, origin, security = DEFAULT_MIRROR, "default", "http://deb.debian.org/debian-security"
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme not in ("http", "https", "file") or not urllib.parse.urlsplit(uri).path and scheme == "file":
        raise StandinError(f"mirror {uri!r} is not an http, https or file URI; pass --mirror "
                           f"http://deb.debian.org/debian or another Debian mirror")
    return _Sources(uri, security.rstrip("/") if security else None, origin)


def check_mirror(uri: str, timeout: float = 20.0) -> None:
    """The mirror answers for dists/SUITE/InRelease (rule 2), so a bad URI fails here, not minutes into apt."""
    url = f"{uri}/dists/{SUITE}/InRelease"
    if uri.startswith("file:"):
        if not Path(urllib.parse.urlsplit(url).path).is_file():
            raise StandinError(f"mirror {uri} has no dists/{SUITE}/InRelease; pass --mirror with a Debian mirror")
        return
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return
    except urllib.error.HTTPError as e:
        why = f"HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = str(getattr(e, "reason", e))
    raise StandinError(f"mirror {uri} is unreachable ({why} for dists/{SUITE}/InRelease); pass --mirror URI of a "
                       f"reachable Debian mirror")


def default_python_prefix() -> Path | None:
    """$POLAR_STANDIN_PYTHON, else the newest /root/.pyenv/versions/3.12.N, else None."""
    if os.environ.get(PYTHON_ENV):
        return Path(os.environ[PYTHON_ENV])
    found = []
    with contextlib.suppress(OSError):
        for p in PYENV_VERSIONS.iterdir():
            m = re.fullmatch(rf"{re.escape(PY_MINOR)}\.(\d+)", p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
    return max(found)[1] if found else None


def python_version(prefix: Path) -> str:
    """The prefix's CPython version (3.12.N), checked to run; StandinError naming the fix otherwise."""
    exe = prefix / "bin" / PY
    fix = f"pass --python PREFIX (or set {PYTHON_ENV}) naming a CPython {PY_MINOR} install prefix"
    if not exe.is_file() or not (prefix / "lib" / PY).is_dir():
        raise StandinError(f"no CPython {PY_MINOR} at {prefix} (no bin/{PY} or lib/{PY}); {fix}")
    try:
        p = subprocess.run([str(exe), "-I", "-S", "-c", "import sys; print(sys.version.split()[0])"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StandinError(f"{exe} does not run ({e}); {fix}") from None
    version = p.stdout.strip()
    if p.returncode != 0 or not re.fullmatch(rf"{re.escape(PY_MINOR)}\.\d+", version):
        raise StandinError(f"{exe} is not CPython {PY_MINOR} (it says {version or p.stderr.strip()[-200:]!r}); {fix}")
    return version


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _key(parts: dict) -> str:
    return hashlib.sha256(json.dumps({"builder": BUILDER_VERSION, **parts}, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class _Plan:
    spec: StandinSpec
    key: str
    inputs: dict


def _plans(sources: _Sources, ca_sha: str, prefix: Path | None, version: str | None,
           tools: dict[str, bool]) -> list[_Plan]:
    base = {"suite": SUITE, "sources": sources.lines(), "ca_sha256": ca_sha}
    out: list[_Plan] = []
    debian_key = ""
    for spec in STANDINS:
        if spec.python:
            inputs = {"reference": spec.reference, "base": debian_key,
                      "python": {"prefix": str(prefix), "version": version}, "tools": tools}
        else:
            inputs = {"reference": spec.reference, **base}
        key = _key(inputs)
        debian_key = debian_key or key
        out.append(_Plan(spec, key, inputs))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# the cache


def _paths(cache: Path, spec: StandinSpec) -> tuple[Path, Path, Path]:
    return cache / f"{spec.name}.tar", cache / f"{spec.name}.json", cache / f"{spec.name}.key"


def _cached(cache: Path, spec: StandinSpec, key: str | None = None) -> Standin | None:
    """The stand-in in the cache when stamp, json and tarball agree (and the key is `key`, when given)."""
    tar, meta_path, stamp = _paths(cache, spec)
    try:
        stamped = stamp.read_text().strip()
        meta = json.loads(meta_path.read_text())
        size = tar.stat().st_size
    except (OSError, ValueError):
        return None
    if (key is not None and stamped != key) or meta.get("key") != stamped or meta.get("tarball", {}).get("bytes") \
            != size:
        return None
    return Standin(spec.reference, spec.local, tar, meta, stamped)


def cached_standins(cache: Path | None = None) -> list[Standin]:
    """The stand-ins built into `cache`, as `build_standins` left them; StandinError naming the build otherwise."""
    cache = Path(cache) if cache is not None else DEFAULT_CACHE
    out = []
    for spec in STANDINS:
        found = _cached(cache, spec)
        if found is None:
            raise StandinError(f"stand-in {spec.reference} is not built in {cache}; run scripts/build-standins "
                               f"(or python -m polar.rollout.standins build --cache {cache})")
        out.append(found)
    return out


@contextlib.contextmanager
def _locked(cache: Path):
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _mounts_under(base: Path) -> list[str]:
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
    except OSError:
        return []
    prefix = str(base).rstrip("/") + "/"
    return sorted((p for p in points if p.startswith(prefix) or p == str(base)), key=len, reverse=True)


def _remove_tree(path: Path) -> None:
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


def _run(cmd: Sequence[str], *, what: str, log: Path, timeout: float, env: dict | None = None,
         fix: str = "") -> str:
    """Run a build step, appending its output to `log`; StandinError with its first error line otherwise."""
    try:
        p = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace", timeout=timeout,
                           stdin=subprocess.DEVNULL, env=env)
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
    inner = ('set -e; mount -t proc proc "$1/proc"; mount --rbind /dev "$1/dev"; '
             'exec chroot "$1" /usr/bin/env -i PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 '
             'HOME=/root DEBIAN_FRONTEND=noninteractive /bin/sh -ec "$2"')
    return _run(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", inner, "sh", str(root),
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
    debian = _pem_bodies(_read(target))
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


def _finish_root(root: Path, sources: _Sources) -> None:
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
                _remove_tree(child)
            else:
                child.unlink()
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    for pattern in ("var/log/*.log", "var/cache/debconf/*-old", "var/lib/dpkg/*-old"):
        for f in root.glob(pattern):
            f.unlink()


def _packages(root: Path, log: Path) -> dict[str, str]:
    out = _run(["chroot", str(root), "dpkg-query", "-W", "-f", "${Package}\\t${Version}\\n"],
               what="dpkg-query -W in the root", log=log, timeout=120)
    return dict(line.split("\t", 1) for line in sorted(out.splitlines()) if "\t" in line)


def _tar(root: Path, out: Path, log: Path) -> None:
    _run(["tar", "--create", "--file", str(out), "--directory", str(root), "--numeric-owner", "--sort=name", "."],
         what="tar of the root", log=log, timeout=1200, fix="check the cache's free space")


def _mmdebstrap_version(log: Path) -> str:
    out = _run(["mmdebstrap", "--version"], what="mmdebstrap --version", log=log, timeout=60,
               fix="install mmdebstrap (scripts/setup --system)")
    return out.split()[-1] if out.split() else "unknown"


def _build_debian(work: Path, sources: _Sources, bundle: bytes, log: Path) -> dict:
    root = work / "root"
    version = _mmdebstrap_version(log)
    cmd = ["mmdebstrap", "--variant=minbase", "--mode=root", "--format=directory", "--include=ca-certificates",
           # debootstrap's merged /usr: usr-is-merged; apt would otherwise pick usrmerge, which needs perl
           "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
           *(f"--dpkgopt={o}" for o in DPKG_EXCLUDES), SUITE, str(root), *sources.lines()]
    _run(cmd, what="mmdebstrap", log=log, timeout=MMDEBSTRAP_TIMEOUT_S,
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
                                   f"Debian package provides; add it to SONAME_PACKAGES in polar.rollout.standins")
            out[soname] = package
    return dict(sorted(out.items()))


def _build_python(work: Path, debian_tar: Path, sources: _Sources, bundle: bytes, prefix: Path, version: str,
                  tools: dict[str, bool], log: Path) -> dict:
    root = work / "root"
    root.mkdir()
    _run(["tar", "--extract", "--file", str(debian_tar), "--directory", str(root), "--numeric-owner",
          "--same-permissions"], what="extracting the debian stand-in", log=log, timeout=600)
    local = root / "usr/local"
    staging = work / "local"  # copied and checked here first: the package list depends on what the ELF files NEED
    staging.mkdir()
    elves = _copy_python(prefix, staging)
    libs = _python_packages(elves, staging, prefix)
    packages = sorted({*PYTHON_BASE_PACKAGES, *libs.values()})
    shutil.copy2("/etc/resolv.conf", root / "etc/resolv.conf")  # apt in the root resolves the mirror's name
    _in_root(root, "apt-get update -qq\n"
                   f"apt-get install -y -qq --no-install-recommends {' '.join(packages)} >/dev/null\n"
                   "apt-get clean\n", what="apt-get install in the python root", log=log)
    if tools["strip"]:  # the official image links with --strip-all; this drops the debug info only (~40 MB)
        _run(["strip", "--strip-debug", *map(str, elves)], what="strip --strip-debug", log=log, timeout=300)
    if tools["patchelf"]:  # the host prefix's RUNPATH would leak into the image; $ORIGIN finds libpython anywhere
        for f in elves:
            rpath = "$ORIGIN/../lib" if f.parent.name == "bin" else ""
            args = ["--set-rpath", rpath] if rpath else ["--remove-rpath"]
            _run(["patchelf", *args, str(f)], what=f"patchelf {f.name}", log=log, timeout=120)
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
                           f"package to SONAME_PACKAGES in polar.rollout.standins")
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    _install_ca(root, bundle, log)  # a package's trigger may have regenerated the bundle
    _finish_root(root, sources)
    return {"builder": {"tool": "apt-get in the debian stand-in's root", "installed": packages},
            "python": {"version": version, "prefix": str(prefix), "into": "/usr/local", "libraries": libs,
                       "stripped": tools["strip"], "rpath": "$ORIGIN/../lib" if tools["patchelf"] else "unchanged",
                       "excluded": [f"lib/{PY}/{x}" for x in ("test", "idlelib", "tkinter", "turtledemo")]
                       + [f"lib/{PY}/lib-dynload/_tkinter*", f"lib/{PY}/config-*/libpython*.a", "bin/idle*",
                          f"lib/{PY}/site-packages/* but pip and pip-*.dist-info"],
                       "pip_conf": "/etc/pip.conf"}}


def _is_line(spec: StandinSpec, meta: dict) -> str:
    b = meta["builder"] if not spec.python else meta["base_builder"]
    host = urllib.parse.urlsplit(b["mirror"]).netloc or b["mirror"]
    line = f"Debian {SUITE} minbase (mmdebstrap {b['version']}, {host}) + host CA bundle"
    if spec.python:
        line += f" + CPython {meta['python']['version']} from {meta['python']['prefix']}"
    return line


def build_standins(cache: Path | None = None, *, mirror: str | None = None, python_prefix: Path | None = None,
                   log: Callable[[str], object] = print) -> list[Standin]:
    """Build every stand-in whose stamp does not match its inputs (rules 2–5); a no-op when all match."""
    cache = Path(cache) if cache is not None else DEFAULT_CACHE
    sources = resolve_sources(mirror)
    try:
        bundle = CA_BUNDLE.read_bytes()
    except OSError as e:
        raise StandinError(f"the host CA bundle {CA_BUNDLE} cannot be read ({e.strerror}); install ca-certificates")
    prefix = Path(python_prefix) if python_prefix is not None else default_python_prefix()
    if prefix is None:
        raise StandinError(f"no CPython {PY_MINOR} found under {PYENV_VERSIONS}; pass --python PREFIX or set "
                           f"{PYTHON_ENV}")
    prefix = prefix.absolute()
    version = python_version(prefix)
    tools = {"strip": shutil.which("strip") is not None, "patchelf": shutil.which("patchelf") is not None}
    plans = _plans(sources, hashlib.sha256(bundle).hexdigest(), prefix, version, tools)
    done = [_cached(cache, p.spec, p.key) for p in plans]
    if all(done):
        for s in done:
            log(f"{s.reference}: cached ({s.tarball.name}, key {s.key[:12]})")
        return done  # type: ignore[return-value]
    check_mirror(sources.mirror)
    _check_builder()
    with _locked(cache):
        out = []
        for plan in plans:
            found = _cached(cache, plan.spec, plan.key)  # another builder may have finished it meanwhile
            if found is None:
                found = _build_one(cache, plan, sources, bundle, prefix, version, tools, out, log)
            else:
                log(f"{plan.spec.reference}: cached ({found.tarball.name}, key {found.key[:12]})")
            out.append(found)
    return out


def _check_builder() -> None:
    if os.geteuid() != 0:
        raise StandinError("building stand-ins needs root (mmdebstrap --mode=root, chroot); run scripts/build-standins "
                           "as root")
    for tool in ("mmdebstrap", "tar", "unshare", "chroot"):
        if shutil.which(tool) is None:
            raise StandinError(f"{tool} is not installed; run scripts/setup --system (it installs mmdebstrap)")


def _build_one(cache: Path, plan: _Plan, sources: _Sources, bundle: bytes, prefix: Path, version: str,
               tools: dict[str, bool], built: list[Standin], log: Callable[[str], object]) -> Standin:
    spec = plan.spec
    tar, meta_path, stamp = _paths(cache, spec)
    work = cache / f".build-{spec.name}"
    logfile = cache / f"{spec.name}.build.log"
    _remove_tree(work)
    work.mkdir()
    logfile.write_text("")
    started, clock = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    how = f"the debian stand-in + CPython {version}" if spec.python else f"mmdebstrap minbase {SUITE}"
    log(f"{spec.reference}: building ({how}, {sources.mirror}; log {logfile})")
    try:
        if spec.python:
            debian = built[0]
            meta = _build_python(work, debian.tarball, sources, bundle, prefix, version, tools, logfile)
            meta["base_builder"] = debian.meta["builder"]
            meta["base_key"] = debian.key
        else:
            meta = _build_debian(work, sources, bundle, logfile)
        meta["packages"] = _packages(work / "root", logfile)
        out = work / "out.tar"
        _tar(work / "root", out, logfile)
        meta = {"reference": spec.reference, "local": spec.local, "key": plan.key, "inputs": plan.inputs, **meta,
                "ca_bundle": {"path": str(CA_BUNDLE), "sha256": hashlib.sha256(bundle).hexdigest()},
                "tarball": {"file": tar.name, "sha256": _sha256_file(out), "bytes": out.stat().st_size},
                "built_at": started.isoformat(timespec="seconds"),
                "build_seconds": round(time.monotonic() - clock, 1)}
        if not spec.python:
            meta["python"] = None
        meta["is"] = _is_line(spec, meta)
        stamp.unlink(missing_ok=True)  # the stamp goes last: a crash in between leaves no stamp
        os.replace(out, tar)
        tmp = meta_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n")
        os.replace(tmp, meta_path)
        stamp.write_text(plan.key + "\n")
    finally:
        _remove_tree(work)
    log(f"{spec.reference}: built {tar} ({meta['tarball']['bytes'] / 2**20:.0f} MiB) in {meta['build_seconds']} s")
    return Standin(spec.reference, spec.local, tar, meta, plan.key)


# ---------------------------------------------------------------------------------------------------------------------
# docker


def _docker(docker: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([docker, *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise StandinError(f"docker {args[0]} took over {timeout:g} s; check the daemon at "
                           f"{os.environ.get('DOCKER_HOST', 'the default socket')}") from None
    except OSError as e:
        raise StandinError(f"{docker}: {e.strerror}; install docker.io (scripts/setup --system)") from None


def _label(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # a Dockerfile double-quoted word: \" and \\ escaped


def import_changes(standin: Standin) -> list[str]:
    """The `docker import --change` instructions for a stand-in (rule 6)."""
    python = standin.meta.get("python")
    changes = [f"ENV PATH={PATH_PYTHON if python else PATH_DEBIAN}", "ENV LANG=C.UTF-8"]
    if python:
        changes.append(f"ENV PYTHON_VERSION={python['version']}")
    changes.append(f'CMD ["{"python3" if python else "bash"}"]')
    changes += [f"LABEL {LABEL_FOR}={_label(standin.reference)}",
                f"LABEL {LABEL_IS}={_label(standin.meta.get('is', ''))}", f"LABEL {LABEL_KEY}={_label(standin.key)}"]
    return changes


def load_standins(standins: Iterable[Standin], *, docker: str = "docker") -> dict[str, str]:
    """docker import each stand-in into $DOCKER_HOST's daemon, unless its tag already carries the same key."""
    out = {}
    for s in standins:
        if not Path(s.tarball).is_file():
            raise StandinError(f"stand-in {s.reference} has no tarball at {s.tarball}; run scripts/build-standins")
        p = _docker(docker, "image", "inspect", "--format", f'{{{{index .Config.Labels "{LABEL_KEY}"}}}}', s.local)
        if p.returncode != 0 or p.stdout.strip() != s.key:
            args = [a for c in import_changes(s) for a in ("--change", c)]
            p = _docker(docker, "import", *args, str(s.tarball), s.local, timeout=IMPORT_TIMEOUT_S)
            if p.returncode != 0:
                raise StandinError(f"docker import {s.local} failed: {p.stderr.strip()[-300:]}; check the daemon at "
                                   f"{os.environ.get('DOCKER_HOST', 'the default socket')}")
        out[s.reference] = s.local
    return out


def image_map_lines(standins: Iterable[StandinSpec | Standin]) -> list[str]:
    """The lines of an `--image-map @FILE`: REF=LOCAL for each stand-in."""
    return [f"{s.reference}={s.local}" for s in standins]


# ---------------------------------------------------------------------------------------------------------------------
# the command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like a StandinError
        self.exit(2, f"{self.prog}: {message}; see --help\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m polar.rollout.standins", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the stand-in tarballs (a no-op when current)")
    b.add_argument("--cache", type=Path, default=None, help=f"cache directory (default {DEFAULT_CACHE})")
    b.add_argument("--mirror", default=None, help="Debian mirror URI (default: the host's apt source)")
    b.add_argument("--python", type=Path, default=None,
                   help=f"CPython {PY_MINOR} prefix (default ${PYTHON_ENV}, else the newest pyenv {PY_MINOR}.N)")
    ld = sub.add_parser("load", help="docker import the built stand-ins into $DOCKER_HOST's daemon")
    ld.add_argument("--cache", type=Path, default=None)
    ld.add_argument("--docker", default="docker")
    sub.add_parser("map", help="print the --image-map lines")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build_standins(args.cache, mirror=args.mirror, python_prefix=args.python)
        elif args.command == "load":
            for ref, local in load_standins(cached_standins(args.cache), docker=args.docker).items():
                print(f"{ref}={local}")
        else:
            print("\n".join(image_map_lines(STANDINS)))
    except StandinError as e:
        print(f"standins: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
