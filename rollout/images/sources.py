"""Task images, read by the project itself (pure: no docker calls, standard library only; the caller passes image ids).

Harbor tasks name their environment three ways: `environment/Dockerfile` (built with environment/ as the build
context), a compose file with one service (built like a Dockerfile, or run as its `image`), or task.toml's
`[environment] docker_image` (run as given). No image registry is reachable here, so base images are mapped to local
ones with `polar-rollout --image-map REF=LOCAL` (repeatable, or `@FILE`).

Rules. Each violation is an `ImageError` (a ValueError) whose text is one line naming the item (or line) and the fix.
Rules 1–4 live with the code that implements them (import them from there):
1–2. image references and the image map: polar.rollout.image_refs (`ImageRef`, `ImageMap`, `parse_image_map`,
   `ImageError`).
3. Dockerfile rewriting: polar.rollout.dockerfile (`rewrite_dockerfile`, `Rewritten`, `Substitution`, `Base`).
4. a compose file's one service: polar.rollout.compose (`compose_service`, `ComposeService`).
5. `environment_key` is the sha256 of: every entry under environment/ (excluding nothing), walked depth-first with
   names sorted, as (type, relative path, mode bits, and the file's bytes or the symlink's target; symlinks are not
   followed), then the rewritten Dockerfile, then the mapped bases' image ids sorted by reference. Every part is
   length-prefixed, so no two different inputs share a byte stream.
6. `choose_environment` — the precedence, first present wins: `--image` on the command line (the user asked), then
   task.toml's `[environment] docker_image`, then `environment/Dockerfile`, then a compose file in environment/
   (compose.yaml, compose.yml, docker-compose.yaml, docker-compose.yml: the first present; a Dockerfile beside one is
   used instead, noted), then our extension `environment/workdir/` (in the default sandbox image), else an empty /app.
   Every source present but not used gets a note saying why. `environment/workdir/` is the start state copied into
   /app only with the default image or `--image` (a runtime the user chose, as before); an image the task names
   carries its own start state, so workdir/ is then noted and not copied (a Dockerfile may COPY it: the build context
   is environment/).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from polar.rollout.images.compose import compose_service
from polar.rollout.images.refs import ImageError, ImageRef

# ---------------------------------------------------------------------------------------------------------------------
# 5. the cache key

KEY_VERSION = b"polar-environment-key 1\n"


def environment_key(env_dir: str | Path, rewritten_dockerfile: str, base_ids: Mapping[str, str]) -> str:
    """Rule 5: the sha256 hex that names a built environment image."""
    digest = hashlib.sha256(KEY_VERSION)

    def put(data: bytes) -> None:
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)

    root = os.fspath(env_dir)

    def walk(rel: bytes) -> None:
        here = os.path.join(os.fsencode(root), rel) if rel else os.fsencode(root)
        try:
            names = sorted(os.listdir(here))
        except OSError as exc:
            raise ImageError(f"environment/{os.fsdecode(rel)}: cannot be listed ({exc.strerror}); make it readable") \
                from None
        for name in names:
            child = os.path.join(rel, name) if rel else name
            path = os.path.join(os.fsencode(root), child)
            info = os.lstat(path)
            mode = stat.S_IMODE(info.st_mode).to_bytes(4, "big")
            shown = os.fsdecode(child)
            if stat.S_ISLNK(info.st_mode):
                put(b"L"), put(child), put(mode), put(os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                put(b"D"), put(child), put(mode)
                walk(child)
            elif stat.S_ISREG(info.st_mode):
                put(b"F"), put(child), put(mode)
                try:
                    with open(path, "rb") as fh:
                        size = os.fstat(fh.fileno()).st_size
                        digest.update(size.to_bytes(8, "big"))
                        read = 0
                        while chunk := fh.read(1 << 20):
                            digest.update(chunk)
                            read += len(chunk)
                except OSError as exc:
                    raise ImageError(f"environment/{shown}: cannot be read ({exc.strerror}); make it readable") \
                        from None
                if read != size:
                    raise ImageError(f"environment/{shown}: changed while it was hashed ({size} bytes, then {read}); "
                                     f"leave environment/ alone while tasks start")
            else:
                put(b"O"), put(child), put(stat.S_IFMT(info.st_mode).to_bytes(4, "big") + mode)

    walk(b"")
    put(b"Dockerfile")
    put(rewritten_dockerfile.encode("utf-8", "surrogateescape"))
    put(b"bases")
    for ref, image_id in sorted(base_ids.items()):
        put(ref.encode()), put(image_id.encode())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------------------------
# 6. the choice

COMPOSE_ORDER = ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml")


@dataclass(frozen=True)
class Choice:
    """Where a task's container comes from (rule 6)."""

    kind: str  # "image" (run `image`), "build" (build `dockerfile` in `context`), "workdir" or "empty" (default image)
    source: str  # which one: "--image", "task.toml docker_image", "environment/Dockerfile", "environment/<compose>",
    #              "environment/workdir/", or "none"
    image: str | None = None  # kind "image": the reference as given (map it with ImageMap.lookup before running)
    context: Path | None = None  # kind "build": the build context (environment/, or the compose file's context)
    dockerfile: Path | None = None  # kind "build": the Dockerfile to build
    workdir: Path | None = None  # the start state copied into /app; None = what the image holds (or an empty /app)
    notes: tuple[str, ...] = field(default=())  # why each source present but not used was ignored


def choose_environment(task_dir: str | Path, docker_image: str | None, cli_image: str | None) -> Choice:
    """Rule 6 for one task directory; docker_image is task.toml's [environment] docker_image, cli_image --image."""
    task_dir = Path(task_dir)
    env = task_dir / "environment"
    dockerfile = env / "Dockerfile" if (env / "Dockerfile").is_file() else None
    composes = [env / name for name in COMPOSE_ORDER if (env / name).is_file()]
    workdir = env / "workdir" if (env / "workdir").is_dir() else None
    for given, what in ((cli_image, "--image"), (docker_image, "task.toml [environment] docker_image")):
        if given:
            try:
                ImageRef.parse(given)
            except ImageError as exc:
                raise ImageError(f"{what}: {exc}") from None
    present = []  # (source, label) in precedence order
    if cli_image:
        present.append(("--image", f"--image {cli_image}"))
    if docker_image:
        present.append(("task.toml docker_image", f"task.toml's docker_image {docker_image}"))
    if dockerfile:
        present.append(("environment/Dockerfile", "environment/Dockerfile"))
    for compose in composes:
        present.append((f"environment/{compose.name}", f"environment/{compose.name}"))
    if workdir:
        present.append(("environment/workdir/", "environment/workdir/"))
    others = sorted(entry.name for entry in env.iterdir() if entry.is_file() and entry.name != "Dockerfile"
                    and (entry.name.lower().startswith("dockerfile") or entry.name.lower().endswith(".dockerfile"))) \
        if env.is_dir() else []
    notes = [f"environment/{name} is not built: only environment/Dockerfile is" for name in others]
    if not present:
        return Choice("empty", "none", notes=tuple(notes))
    source, label = present[0]
    winner_reason = {
        "--image": "--image was given on the command line",
        "task.toml docker_image": "task.toml names docker_image",
        "environment/Dockerfile": "environment/Dockerfile is built",
    }.get(source, f"{label} is used")
    keep_workdir = source in ("--image", "environment/workdir/")
    for other, other_label in present[1:]:
        if other == "environment/workdir/":
            if keep_workdir:
                continue
            notes.append(f"environment/workdir/ is not copied into /app: {winner_reason}, and the image holds the "
                         f"start state (the build context is environment/, so a Dockerfile may COPY workdir/)")
        elif other.startswith("environment/") and other != "environment/Dockerfile" and source.startswith(
                "environment/") and source != "environment/Dockerfile":
            notes.append(f"{other_label} is not read: {label} comes first ({', '.join(COMPOSE_ORDER)})")
        else:
            verb = "run" if other == "task.toml docker_image" else "read" if "compose" in other else "built"
            notes.append(f"{other_label} is not {verb}: {winner_reason}, which comes first")
    if source in ("--image", "task.toml docker_image"):
        return Choice("image", source, image=cli_image if source == "--image" else docker_image,
                      workdir=workdir if keep_workdir else None, notes=tuple(notes))
    if source == "environment/Dockerfile":
        return Choice("build", source, context=env, dockerfile=dockerfile, notes=tuple(notes))
    if source == "environment/workdir/":
        return Choice("workdir", source, workdir=workdir, notes=tuple(notes))
    compose = env / source.removeprefix("environment/")
    try:
        text = compose.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ImageError(f"{source}: cannot be read ({getattr(exc, 'strerror', None) or exc}); make it a readable "
                         f"UTF-8 file") from None
    service = compose_service(text, source)
    if service.builds:
        return Choice("build", source, context=env / service.context, dockerfile=env / service.dockerfile,
                      notes=tuple(notes))
    return Choice("image", source, image=service.image, notes=tuple(notes))
