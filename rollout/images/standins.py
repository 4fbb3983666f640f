"""Stand-in base images for air-gapped builds: `debian:bookworm-slim` and `python:3.12-slim`, built from Debian's
mirror (no image registry is reachable here) and mapped in with `polar-rollout --image-map @FILE` (`image_map_lines`).

    python -m polar.rollout.images.standins build [--cache DIR] [--mirror URI] [--python PREFIX]   # scripts/build-standins
    python -m polar.rollout.images.standins load [--cache DIR]     # docker import into $DOCKER_HOST's daemon
    python -m polar.rollout.images.standins map                    # the --image-map lines

Rules. Each violation is a `StandinError` whose text is one line naming the fix.
1. STANDINS are `debian:bookworm-slim` → `polar-standin/debian:bookworm-slim` and `python:3.12-slim` →
   `polar-standin/python:3.12-slim`. Each is a rootfs tarball `NAME.tar` in the cache, a `NAME.json` saying what it
   really is (reference, builder, Debian packages with versions, CPython version and the prefix it came from, the CA
   bundle's and the tarball's sha256, the build time) and a stamp `NAME.key`, written last. The cache is
   $POLAR_IMAGES_DIR, else the checkout's .cache/images (never committed), else ~/.cache/polar/images.
2. The mirror is the `mirror` argument, else the URI of the host's apt source for the suite
   (/etc/apt/sources.list.d/*.sources, then *.list and /etc/apt/sources.list), else http://deb.debian.org/debian.
   It is an http or https URI, and its `dists/bookworm/InRelease` answers before anything is built. The host's
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
   turtledemo}, _tkinter, the static libpython, -O/-OO bytecode, idle and every site-packages entry but pip and its
   dist-info. Debug info is stripped and the host RUNPATH replaced by $ORIGIN/../lib (when strip and patchelf are
   there); the host prefix is rewritten to /usr/local in sysconfig data, pkg-config files and script shebangs; pip,
   pip3 and pip3.12 are written fresh; /etc/pip.conf names the CA bundle; ldconfig runs in the root. Every ELF file
   resolves under `ldd` in the root and `python3` imports ssl, sqlite3, ctypes, lzma, bz2, zlib and readline there,
   or the build fails naming what is missing. CPython is never built from source.
5. A stand-in's key is the sha256 of its inputs: BUILDER_VERSION, the reference, the suite, the apt sources, the CA
   bundle's sha256, and for python the debian key, the prefix's path and version and whether strip and patchelf
   were used. A build whose stamp, json and tarball agree with the key is a no-op; building needs root, mmdebstrap,
   tar and unshare, and holds `.lock` in the cache so two builders do not interleave.
6. `load_standins` runs `docker import` on each tarball (the daemon is $DOCKER_HOST's) with ENV PATH, LANG (and
   PYTHON_VERSION), CMD, and labels org.polar.standin.for / .is / .key; a tag that already carries the same key is
   left alone. It returns {reference: local tag}.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from polar.records.cliargs import OneLineParser
from polar.records.files import write_json_atomic
from polar.rollout.images.standin_roots import (CA_BUNDLE, PY, PY_MINOR, SUITE, Sources, StandinError, build_debian_root,
                                         build_python_root, installed_packages, read_text, remove_tree,
                                         tar_root)

# Bump when the build changes what a tarball holds, so every cached stand-in is rebuilt once.
BUILDER_VERSION = 2
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PYENV_VERSIONS = Path("/root/.pyenv/versions")
PYTHON_ENV = "POLAR_STANDIN_PYTHON"

PATH_DEBIAN = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PATH_PYTHON = "/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the official one, twice
LABEL_FOR, LABEL_IS, LABEL_KEY = "org.polar.standin.for", "org.polar.standin.is", "org.polar.standin.key"
IMPORT_TIMEOUT_S = 600  # a ~200 MB tarball into a vfs daemon


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


def default_cache() -> Path:
    """The project's image cache (launch.paths.images_dir): $POLAR_IMAGES_DIR, else the checkout's .cache/images
    (ignored by git), else ~/.cache/polar/images for an installed package."""
    from polar.launch import paths

    return paths.images_dir()


def host_apt_sources(root: Path = Path("/")) -> list[tuple[str, str, str]]:
    """(uri, suite, file) for each enabled `deb` source of the host's apt: deb822 files first, then one-line ones."""
    out: list[tuple[str, str, str]] = []
    d = root / "etc/apt/sources.list.d"
    for f in sorted(d.glob("*.sources")) if d.is_dir() else []:
        for stanza in re.split(r"\n\s*\n", read_text(f)):
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
        for line in read_text(f).splitlines():
            words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()  # drop [options]
            if len(words) >= 3 and words[0] == "deb":
                out.append((words[1], words[2], str(f)))
    return out


def resolve_sources(mirror: str | None = None) -> Sources:
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
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        # apt also runs inside the python root, where a file: mirror of the host is not visible
        raise StandinError(f"mirror {uri!r} is not an http or https URI; pass --mirror http://deb.debian.org/debian "
                           f"or another Debian mirror")
    return Sources(uri, security.rstrip("/") if security else None, origin)


def check_mirror(uri: str, timeout: float = 20.0) -> None:
    """The mirror answers for dists/SUITE/InRelease (rule 2), so a bad URI fails here, not minutes into apt."""
    url = f"{uri}/dists/{SUITE}/InRelease"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return
    except urllib.error.HTTPError as e:
        if e.code in (405, 501):  # a server that refuses HEAD still answered
            return
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


def _plans(sources: Sources, ca_sha: str, prefix: Path | None, version: str | None,
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
    cache = Path(cache) if cache is not None else default_cache()
    out = []
    for spec in STANDINS:
        found = _cached(cache, spec)
        if found is None:
            raise StandinError(f"stand-in {spec.reference} is not built in {cache}; run scripts/build-standins "
                               f"(or python -m polar.rollout.images.standins build --cache {cache})")
        out.append(found)
    return out


@contextlib.contextmanager
def _locked(cache: Path):
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


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
    cache = Path(cache) if cache is not None else default_cache()
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


def _build_one(cache: Path, plan: _Plan, sources: Sources, bundle: bytes, prefix: Path, version: str,
               tools: dict[str, bool], built: list[Standin], log: Callable[[str], object]) -> Standin:
    spec = plan.spec
    tar, meta_path, stamp = _paths(cache, spec)
    work = cache / f".build-{spec.name}"
    logfile = cache / f"{spec.name}.build.log"
    remove_tree(work)
    work.mkdir()
    logfile.write_text("")
    started, clock = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    how = f"the debian stand-in + CPython {version}" if spec.python else f"mmdebstrap minbase {SUITE}"
    log(f"{spec.reference}: building ({how}, {sources.mirror}; log {logfile})")
    try:
        if spec.python:
            debian = built[0]
            meta = build_python_root(work, debian.tarball, sources, bundle, prefix, version, tools, logfile)
            meta["base_builder"] = debian.meta["builder"]
            meta["base_key"] = debian.key
        else:
            meta = build_debian_root(work, sources, bundle, logfile)
        meta["packages"] = installed_packages(work / "root", logfile)
        out = work / "out.tar"
        tar_root(work / "root", out, logfile)
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
        write_json_atomic(meta_path, meta, indent=2)
        stamp.write_text(plan.key + "\n")
    finally:
        remove_tree(work)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m polar.rollout.images.standins", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the stand-in tarballs (a no-op when current)")
    b.add_argument("--cache", type=Path, default=None, help=f"cache directory (default {default_cache()})")
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
