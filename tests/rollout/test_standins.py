"""Stand-in base images (polar.rollout.standins), for real: built with mmdebstrap into the repository's cache
(.cache/images/, so a second run reuses them; `scripts/setup --images` builds them too) and imported into the private
dockerd (tests/rollout/conftest.py). Every container runs with `--network none`; nothing here needs the network in a
container.

1.x  the build: a second build is a no-op (same key, same tarball), the json says what each stand-in really is
2.x  in docker: python 3.12 with its C modules, pip from /usr/local with a fresh shebang, venv; debian is bookworm
     without python; both carry the host CA bundle's exact bytes and the labels; a second load imports nothing
3.x  bad input: a missing python prefix, an unreachable mirror, a stand-in that is not built — one-line errors
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from polar.rollout.images import standins
from polar.rollout.images.refs import ImageRef, parse_image_map
from polar.rollout.images.standins import STANDINS, StandinError
from tests.support.need import IMAGES, need

pytestmark = pytest.mark.integration

PYTHON, DEBIAN = "polar-standin/python:3.12-slim", "polar-standin/debian:bookworm-slim"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
UNREACHABLE = "http://127.0.0.1:9/debian"  # the discard port: nothing listens, the connection is refused at once


def _quiet(line: str) -> None:
    return None


@pytest.fixture(scope="module")
def built():
    """The stand-ins in the default cache: built here once when they are not current (a minute), reused after."""
    try:
        return standins.build_standins(log=_quiet)
    except StandinError as e:
        need(f"the stand-in images are not built and cannot be built here: {e}", setup=IMAGES)


@pytest.fixture(scope="module")
def loaded(built, dockerd):
    return standins.load_standins(built)


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def run_in(image: str, *cmd: str) -> subprocess.CompletedProcess:
    return docker("run", "--rm", "--network", "none", image, *cmd)


def ok(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 0, (p.stdout + p.stderr).decode(errors="replace")
    return p.stdout.decode()


def image_id(tag: str) -> str:
    return ok(docker("image", "inspect", "--format", "{{.Id}}", tag)).strip()


def by_reference(items) -> dict:
    return {s.reference: s for s in items}


# ---------------------------------------------------------------------------------------------------------------------
# 1.x the build


def test_1_1_a_second_build_is_a_noop(built, monkeypatch):
    """A no-op: the stamps match, so nothing is built or locked and no mirror is asked (what made it fast; the time
    itself is not asserted)."""
    before = {s.reference: (s.key, s.tarball.stat().st_mtime_ns) for s in built}

    def no(*_a, **_k):
        raise AssertionError("a current stand-in was rebuilt, locked or its mirror asked")

    for name in ("_build_one", "_locked", "check_mirror", "_check_builder"):
        monkeypatch.setattr(standins, name, no)
    lines: list[str] = []
    again = standins.build_standins(log=lines.append)
    assert {s.reference: (s.key, s.tarball.stat().st_mtime_ns) for s in again} == before
    assert [s.reference for s in again] == [s.reference for s in STANDINS]
    assert lines == [f"{s.reference}: cached ({s.tarball.name}, key {s.key[:12]})" for s in again]


def test_1_2_the_json_says_what_each_really_is(built):
    host_ca = hashlib.sha256(HOST_CA.read_bytes()).hexdigest()
    s = by_reference(built)
    deb, py = s["debian:bookworm-slim"], s["python:3.12-slim"]
    for standin in built:
        meta = standin.meta
        assert (meta["reference"], meta["local"], meta["key"]) == (standin.reference, standin.local, standin.key)
        assert meta["ca_bundle"]["sha256"] == host_ca
        assert meta["tarball"]["sha256"] == hashlib.sha256(standin.tarball.read_bytes()).hexdigest()
        assert meta["built_at"] and "\n" not in meta["is"]
        assert {"ca-certificates", "usr-is-merged", "base-files"} <= set(meta["packages"])
        assert "perl" not in meta["packages"] and "usrmerge" not in meta["packages"]  # merged /usr without perl
        assert json.loads(Path(standin.tarball).with_suffix(".json").read_text()) == meta
    b = deb.meta["builder"]
    assert (b["tool"], b["variant"], b["suite"]) == ("mmdebstrap", "minbase", "bookworm")
    assert b["version"] and b["mirror"].startswith(("http", "file:"))
    assert deb.meta["python"] is None and "python3" not in deb.meta["packages"]
    p = py.meta["python"]
    assert p["version"].startswith("3.12.") and Path(p["prefix"]).is_absolute()
    assert {"libssl3", "libffi8", "libsqlite3-0", "zlib1g", "libbz2-1.0", "liblzma5", "libreadline8",
            "libncursesw6", "netbase", "tzdata"} <= set(py.meta["packages"])
    assert py.meta["base_key"] == deb.key
    assert py.meta["is"].endswith(f"+ CPython {p['version']} from {p['prefix']}")


# ---------------------------------------------------------------------------------------------------------------------
# 2.x in docker
# Each `docker run` copies the whole root under vfs (seconds for 160 MB), so each image's facts are gathered by one
# container, in sections, and the tests below read them.

PYTHON_FACTS = {
    "prefixes": "for p in python python3 python3.12; do $p -c 'import sys; print(sys.prefix)'; done",
    "zoneinfo": "python3 -c \"import zoneinfo; print(zoneinfo.ZoneInfo('Europe/Paris'))\"",
    "pip": "pip --version; pip3 --version",
    "pip_shebangs": "head -qn1 /usr/local/bin/pip /usr/local/bin/pip3 /usr/local/bin/pip3.12",
    "pip_conf": "cat /etc/pip.conf",
    "site_packages": "ls /usr/local/lib/python3.12/site-packages",
    "venv": "python3 -m venv /tmp/v && /tmp/v/bin/python -c 'import sys; print(sys.prefix)' && "
            "/tmp/v/bin/pip --version",
}
COMMON_FACTS = {
    "ca": "command -v update-ca-certificates >/dev/null && base64 -w0 /etc/ssl/certs/ca-certificates.crt",
    "apt_lists": "ls /var/lib/apt/lists",
    "sources": "cat /etc/apt/sources.list.d/debian.sources",
}
DEBIAN_FACTS = {
    "release": "cat /etc/debian_version; . /etc/os-release; echo $VERSION_CODENAME",
    "python": "command -v python3 python python3.11 || echo none",
}


def facts(image: str, sections: dict[str, str]) -> dict[str, str]:
    """{section: its stdout} from one container; a section that fails fails here, with its output."""
    script = "".join(f"echo '@@{name}'; ( {cmd} ) 2>&1 || echo '@@FAILED {name}'\n" for name, cmd in sections.items())
    out = ok(run_in(image, "sh", "-c", script))
    assert "@@FAILED" not in out, out
    parts = out.split("@@")[1:]
    return {part.split("\n", 1)[0]: part.split("\n", 1)[1] for part in parts}


@pytest.fixture(scope="module")
def python_facts(loaded):
    return facts(PYTHON, {**PYTHON_FACTS, **COMMON_FACTS})


@pytest.fixture(scope="module")
def debian_facts(loaded):
    return facts(DEBIAN, {**DEBIAN_FACTS, **COMMON_FACTS})


def test_2_1_python_runs_with_its_c_modules(loaded, python_facts):
    assert loaded == {"python:3.12-slim": PYTHON, "debian:bookworm-slim": DEBIAN}
    out = ok(run_in(PYTHON, "python", "-c",
                    "import sys, ssl, sqlite3, ctypes, lzma, bz2, zlib, readline; print(sys.version)"))
    assert out.startswith("3.12.")
    assert python_facts["prefixes"].splitlines() == ["/usr/local"] * 3
    assert python_facts["zoneinfo"] == "Europe/Paris\n"  # tzdata is there, as in the real image


def test_2_2_pip_is_from_usr_local_with_a_fresh_shebang(python_facts):
    versions = python_facts["pip"].splitlines()
    assert len(versions) == 2 and all("/usr/local/lib/python3.12/site-packages/pip" in v for v in versions), versions
    assert python_facts["pip_shebangs"].splitlines() == ["#!/usr/local/bin/python3.12"] * 3
    assert python_facts["pip_conf"] == "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"
    # only pip is in site-packages; the host's .pth files and packages stay on the host
    listing = python_facts["site_packages"].split()
    assert listing and all(x == "pip" or (x.startswith("pip-") and x.endswith(".dist-info")) for x in listing)


def test_2_3_venv_works(python_facts):
    out = python_facts["venv"]
    assert out.splitlines()[0] == "/tmp/v" and "/tmp/v/lib/python3.12/site-packages/pip" in out


def test_2_4_debian_is_bookworm_without_python(built, debian_facts):
    version, codename = debian_facts["release"].split()
    assert version.startswith("12.") and codename == "bookworm"
    assert debian_facts["python"] == "none\n"
    assert by_reference(built)["debian:bookworm-slim"].meta["builder"]["mirror"] in debian_facts["sources"]


@pytest.mark.parametrize("image", [PYTHON, DEBIAN])
def test_2_5_the_host_ca_bundle_exact_bytes_and_clean_apt_lists(request, image):
    found = request.getfixturevalue("python_facts" if image == PYTHON else "debian_facts")
    assert base64.b64decode(found["ca"]) == HOST_CA.read_bytes()
    # apt lists are empty, as in the real slim image; `apt-get update` in a build with the network fills them
    assert set(found["apt_lists"].split()) <= {"lock", "partial"}
    assert "Suites: bookworm bookworm-updates" in found["sources"]


@pytest.mark.parametrize("reference", [s.reference for s in STANDINS])
def test_2_6_labels_env_and_cmd(built, loaded, reference):
    standin = by_reference(built)[reference]
    config = json.loads(ok(docker("image", "inspect", "--format", "{{json .Config}}", standin.local)))
    labels = config["Labels"]
    assert labels["org.polar.standin.for"] == reference
    assert labels["org.polar.standin.key"] == standin.key
    assert labels["org.polar.standin.is"] == standin.meta["is"]
    assert labels["org.polar.standin.is"].startswith("Debian bookworm minbase (mmdebstrap ")
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["LANG"] == "C.UTF-8"
    if reference.startswith("python"):
        assert env["PATH"].startswith("/usr/local/bin:")
        assert env["PYTHON_VERSION"] == standin.meta["python"]["version"]
        assert config["Cmd"] == ["python3"]
    else:
        assert config["Cmd"] == ["bash"] and "PYTHON_VERSION" not in env


def test_2_7_a_second_load_imports_nothing(built, loaded, capsys):
    ids = {tag: image_id(tag) for tag in loaded.values()}
    assert standins.load_standins(built) == loaded
    assert standins.main(["load"]) == 0  # the CLI reads the same cache
    assert capsys.readouterr().out.splitlines() == [f"{r}={t}" for r, t in loaded.items()]
    assert {tag: image_id(tag) for tag in loaded.values()} == ids


def test_2_8_the_image_map(built, capsys):
    lines = standins.image_map_lines(built)
    assert lines == ["debian:bookworm-slim=polar-standin/debian:bookworm-slim",
                     "python:3.12-slim=polar-standin/python:3.12-slim"]
    assert standins.main(["map"]) == 0 and capsys.readouterr().out.splitlines() == lines
    image_map = parse_image_map(lines)
    pinned = ImageRef.parse("python:3.12-slim@sha256:" + "a" * 64)
    assert image_map.lookup(pinned) == PYTHON


# ---------------------------------------------------------------------------------------------------------------------
# 3.x bad input


def _one_line(e: StandinError) -> str:
    text = str(e)
    assert text and "\n" not in text
    return text


def test_3_1_a_missing_python_prefix(tmp_path, capsys):
    missing = tmp_path / "no-python"
    with pytest.raises(StandinError) as e:
        standins.build_standins(tmp_path / "cache", python_prefix=missing, log=_quiet)
    text = _one_line(e.value)
    assert str(missing) in text and "--python" in text
    assert not (tmp_path / "cache").exists()  # refused before anything was built
    assert standins.main(["build", "--cache", str(tmp_path / "cache"), "--python", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(missing) in err


def test_3_2_an_unreachable_mirror(tmp_path):
    # a prefix that is there (the venv's own CPython), so the mirror is what fails
    prefix = Path(sys.base_prefix) if sys.version_info[:2] == (3, 12) else standins.default_python_prefix()
    need(None if prefix else "no CPython 3.12 prefix here (pyenv 3.12 or POLAR_STANDIN_PYTHON)", setup=IMAGES)
    with pytest.raises(StandinError) as e:
        standins.build_standins(tmp_path / "cache", mirror=UNREACHABLE, python_prefix=prefix, log=_quiet)
    text = _one_line(e.value)
    assert UNREACHABLE in text and "--mirror" in text
    assert not list((tmp_path / "cache").glob("*.tar"))
    with pytest.raises(StandinError) as e:
        standins.build_standins(tmp_path / "cache", mirror="ftp:/nowhere", python_prefix=prefix, log=_quiet)
    assert "--mirror" in _one_line(e.value)


def test_3_3_a_standin_that_is_not_built(tmp_path):
    with pytest.raises(StandinError) as e:
        standins.cached_standins(tmp_path)
    assert "scripts/build-standins" in _one_line(e.value)
    ghost = standins.Standin("python:3.12-slim", PYTHON, tmp_path / "missing.tar", {}, "k")
    with pytest.raises(StandinError) as e:
        standins.load_standins([ghost], docker="/nonexistent/docker")
    assert "scripts/build-standins" in _one_line(e.value)
