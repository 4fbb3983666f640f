"""`polar-rollout --pull missing|never`: whether an image a task names (its `docker_image`, or a Dockerfile's base)
that is neither mapped (--image-map) nor in the local docker daemon is pulled.

- `missing` (the default): the daemon pulls it (`docker pull`, with the daemon's and the docker client's own
  credentials: the runner never sees or logs them), within PULL_TIMEOUT; the pull's progress is not logged, only a
  failure's last line (the registry's answer). A failed pull is the task's error, so its samples end as
  `infra_error` naming the image and that answer — never a reward.
- `never`: nothing is pulled; a missing image is the task's error (an air-gapped machine, or the test suite, which
  sets POLAR_ROLLOUT_PULL=never so that no test reaches a registry it did not start).

The environment variable POLAR_ROLLOUT_PULL, when set, is the default of --pull.
"""

from __future__ import annotations

import os
import signal
import subprocess

PULL_POLICIES = ("missing", "never")
PULL_ENV = "POLAR_ROLLOUT_PULL"
PULL_TIMEOUT = 900.0


class PullError(RuntimeError):
    """The daemon could not pull the image: the message names it and the registry's answer."""


def default_policy() -> str:
    """--pull's default: POLAR_ROLLOUT_PULL when set to a policy, else `missing`."""
    value = os.environ.get(PULL_ENV, "").strip()
    return value if value in PULL_POLICIES else "missing"


def _answer(stderr: bytes) -> str:
    """The last line the docker client printed: the daemon's account of the registry's answer."""
    lines = [ln.strip() for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:400] if lines else "no answer"


def pull(docker_exe: str, ref: str, timeout: float = PULL_TIMEOUT) -> None:
    """`docker pull --quiet REF` through the daemon; PullError naming the image and the registry's answer."""
    try:
        proc = subprocess.Popen([docker_exe, "pull", "--quiet", ref], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise PullError(f"image {ref} could not be pulled: docker cannot start ({exc.strerror})") from None
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise PullError(f"image {ref} could not be pulled within {timeout:g} s (--pull missing); load it (docker "
                        f"load) or map it with --image-map") from None
    if proc.returncode != 0:
        raise PullError(f"image {ref} could not be pulled (--pull missing): {_answer(err)}")
