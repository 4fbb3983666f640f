"""The python: agent of tests/rollout/test_writable_root.py (`--agent python:rootprobe:run`, copied into the test
task's agent/): one model call through the proxy, then what an agent does to an image's root outside its working
directory — a tool in /usr/local/bin, a wheel pip-installed into the image's site-packages, a root-owned file in
/etc edited (in place, and replaced as `sed -i` does), a write to the runtime the sandbox mounts from the host —
each outcome printed as one `PROBE {json}` line. No tool of the image is needed but its python3 and pip."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import subprocess
import zipfile

TOOL = "/usr/local/bin/polar-probe-tool"
ETC = "/etc/debian_version"
WHEEL_FILES = {
    "polarprobe/__init__.py": b"VALUE = 42\n",
    "polarprobe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: polarprobe\nVersion: 1.0\n",
    "polarprobe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: polar-test\nRoot-Is-Purelib: true\n"
                                      b"Tag: py3-none-any\n",
}


def _wheel(path: str) -> None:
    record = []
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in WHEEL_FILES.items():
            zf.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append("polarprobe-1.0.dist-info/RECORD,,")
        zf.writestr("polarprobe-1.0.dist-info/RECORD", "\n".join(record) + "\n")


def _sh(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120)


def _errno(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc))


def run(instruction: str, workdir: str, env: dict[str, str]) -> int:
    from openai import OpenAI

    OpenAI(api_key="sk-polar-dummy", max_retries=0).chat.completions.create(
        model=env.get("POLAR_MODEL", "gpt-4o-mini"), messages=[{"role": "user", "content": instruction}])
    probe: dict = {"uid": os.getuid(), "tool_at_start": os.path.exists(TOOL),
                   "module_at_start": _sh("python3", "-c", "import polarprobe").returncode == 0}
    try:
        with open(TOOL, "w") as fh:
            fh.write("#!/bin/sh\necho polar-probe-ok\n")
        os.chmod(TOOL, 0o755)
        probe["tool"] = _sh(TOOL).stdout.strip()
    except OSError as exc:
        probe["tool"] = _errno(exc)
    _wheel("/tmp/polarprobe-1.0-py3-none-any.whl")
    pip = _sh("python3", "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir",
              "--disable-pip-version-check", "/tmp/polarprobe-1.0-py3-none-any.whl")
    probe["pip_exit"], probe["pip_err"] = pip.returncode, pip.stderr.strip()[-300:]
    probe["module"] = _sh("python3", "-c", "import polarprobe; print(polarprobe.__file__)").stdout.strip()
    try:
        with open(ETC, "a") as fh:
            fh.write("in place\n")
        probe["etc_in_place"] = "written"
    except OSError as exc:
        probe["etc_in_place"] = _errno(exc)
    probe["etc_sed"] = _sh("sed", "-i", "s/$/ polar-probe/", ETC).returncode == 0 and "polar-probe" in open(ETC).read()
    try:
        with open("/run/polar/rt/polar-probe", "w") as fh:
            fh.write("x")
        probe["runtime_write"] = "written"
    except OSError as exc:
        probe["runtime_write"] = _errno(exc)
    print("PROBE " + json.dumps(probe), flush=True)
    return 0
