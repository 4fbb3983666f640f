"""Image references and the image map, rules 1–2 of polar.rollout.images (pure: standard library only).

`polar-rollout --image-map REF=LOCAL` (repeatable, or `@FILE`) maps the base images a task names to local ones, since
no image registry is reachable here. Each violation of a rule below, or of the rules of polar.rollout.dockerfile,
polar.rollout.compose and polar.rollout.images, is an `ImageError` (a ValueError) whose text is one line naming the
item (or line) and the fix.

1. An image reference is `[REGISTRY/]REPOSITORY[:TAG][@DIGEST]`, normalized as Docker does (`ImageRef.parse`): the
   first `/`-separated component is the registry when it holds a `.` or `:`, is `localhost`, or holds an upper-case
   letter; otherwise the registry is docker.io. `index.docker.io` is docker.io, and a docker.io repository without a
   `/` gets `library/` (`python` is docker.io/library/python). The repository is lower-case path components
   ([a-z0-9]+ joined by `.`, `_`, `__` or dashes), at most 255 characters with the registry; the tag is
   `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; the digest is `sha256:` + 64 lower-case hex. Tag and digest may both be given.
   `canonical()` is `registry/repository[:tag][@digest]`, with `:latest` when neither tag nor digest is given, and
   two references are equal when their canonical forms are.
2. The image map (`parse_image_map`): items `REF=LOCAL` and `@FILE` (one `REF=LOCAL` a line; blank lines and `#`
   comments skipped; a relative FILE is read from the working directory). REF and LOCAL are references (rule 1);
   LOCAL is written into the Dockerfile as given. An entry matches a reference when registry and repository are equal,
   and the entry's tag (when REF gives one) equals the reference's tag (`latest` for a reference with neither tag nor
   digest), and the entry's digest (when REF gives one) equals the reference's digest. So `python:3.12-slim=L` matches
   `python:3.12-slim@sha256:…` and `docker.io/library/python:3.12-slim`, and a REF without tag or digest matches
   every tag and digest of its repository. The most specific matching entry wins: tag and digest > digest > tag >
   repository alone. Two entries of equal specificity that can match the same reference have the same REF: when
   their LOCALs differ the map is refused, naming both items; a repeat naming the same LOCAL is kept once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class ImageError(ValueError):
    """An image reference, image map, Dockerfile or compose file we cannot use; str() is one line naming the fix."""


# ---------------------------------------------------------------------------------------------------------------------
# 1. image references

DEFAULT_REGISTRY = "docker.io"
LEGACY_REGISTRY = "index.docker.io"
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
REGISTRY = re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?")
REPOSITORY = re.compile(rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
NAME_MAX = 255


@dataclass(frozen=True, eq=False)
class ImageRef:
    """A parsed image reference (rule 1). `tag` and `digest` are None when not given; equality is on canonical()."""

    registry: str  # e.g. docker.io, ghcr.io, localhost:5000
    repository: str  # e.g. library/python
    tag: str | None = None
    digest: str | None = None  # sha256:<64 hex>

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        def bad(problem: str) -> ImageError:
            return ImageError(f"image reference {text!r}: {problem}; write "
                              f"[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST], e.g. python:3.12-slim")

        if not isinstance(text, str) or not text:
            raise bad("it is empty")
        if any(ch.isspace() for ch in text):
            raise bad("it holds whitespace")
        name, at, digest = text.partition("@")
        if at and not DIGEST.fullmatch(digest):
            raise bad(f"the digest {digest!r} is not sha256: followed by 64 lower-case hex digits")
        tag = None
        colon = name.rfind(":")
        if colon > name.rfind("/"):
            name, tag = name[:colon], name[colon + 1:]
            if not TAG.fullmatch(tag):
                raise bad(f"the tag {tag!r} is not [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}")
        if not name:
            raise bad("it names no repository")
        if re.fullmatch(r"[a-f0-9]{64}", name):
            raise bad("64 hex digits are an image id, not a reference")
        slash = name.find("/")
        first = name[:slash]
        if slash == -1 or (not any(ch in first for ch in ".:") and first != "localhost" and first == first.lower()):
            registry, repository = DEFAULT_REGISTRY, name
        else:
            registry, repository = first, name[slash + 1:]
        if registry == LEGACY_REGISTRY:
            registry = DEFAULT_REGISTRY
        if not REGISTRY.fullmatch(registry):
            raise bad(f"the registry {registry!r} is not a host name with an optional :port")
        if registry == DEFAULT_REGISTRY and "/" not in repository:
            repository = "library/" + repository
        if repository != repository.lower():
            raise bad("the repository must be lower case")
        if not REPOSITORY.fullmatch(repository):
            raise bad(f"the repository {repository!r} is not /-separated components of [a-z0-9] joined by . _ __ or -")
        if len(registry) + 1 + len(repository) > NAME_MAX:
            raise bad(f"the name is longer than {NAME_MAX} characters")
        return cls(registry, repository, tag, digest or None)

    @property
    def effective_tag(self) -> str | None:
        """The tag Docker pulls: the one given, `latest` when neither tag nor digest is given, else None."""
        return self.tag if self.tag is not None else ("latest" if self.digest is None else None)

    def canonical(self) -> str:
        tag = self.effective_tag
        return f"{self.registry}/{self.repository}" + (f":{tag}" if tag else "") + \
            (f"@{self.digest}" if self.digest else "")

    def familiar(self) -> str:
        """The short form Docker prints: docker.io/ and library/ dropped (`python:latest`), except that docker.io/ is
        kept where the first component would read as a registry (`docker.io/a.b/c`), so that familiar() parses back."""
        name = f"{self.registry}/{self.repository}"
        first = self.repository.split("/", 1)[0]
        if self.registry == DEFAULT_REGISTRY and not any(ch in first for ch in ".:") and first != "localhost":
            name = self.repository.removeprefix("library/") if self.repository.count("/") == 1 else self.repository
        tag = self.effective_tag
        return name + (f":{tag}" if tag else "") + (f"@{self.digest}" if self.digest else "")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageRef) and self.canonical() == other.canonical()

    def __hash__(self) -> int:
        return hash(self.canonical())

    def __str__(self) -> str:
        return self.canonical()


# ---------------------------------------------------------------------------------------------------------------------
# 2. the image map

@dataclass(frozen=True)
class MapEntry:
    ref: ImageRef  # REF, as parsed (tag/digest None when REF does not give them)
    local: str  # LOCAL, as given
    item: str  # where it came from, for errors: "'REF=LOCAL'" or "FILE line N"

    @property
    def specificity(self) -> tuple[bool, bool]:
        """Rule 2: tag and digest > digest > tag > repository alone."""
        return (self.ref.digest is not None, self.ref.tag is not None)

    def matches(self, ref: ImageRef) -> bool:
        mine = self.ref
        return (mine.registry, mine.repository) == (ref.registry, ref.repository) \
            and (mine.tag is None or mine.tag == ref.effective_tag) \
            and (mine.digest is None or mine.digest == ref.digest)


@dataclass(frozen=True)
class ImageMap:
    """REF=LOCAL entries (rule 2); checked on construction. The empty map maps nothing."""

    entries: tuple[MapEntry, ...] = ()

    def __post_init__(self) -> None:
        kept: dict[tuple, MapEntry] = {}
        for entry in self.entries:
            key = (entry.ref.registry, entry.ref.repository, entry.ref.tag, entry.ref.digest)
            other = kept.get(key)
            if other is None:
                kept[key] = entry
            elif other.local != entry.local:
                raise ImageError(f"--image-map {other.item} and {entry.item} map the same image to different local "
                                 f"images ({other.local} and {entry.local}); keep one of them")
        object.__setattr__(self, "entries", tuple(kept.values()))

    def lookup(self, ref: ImageRef | str) -> str | None:
        """The LOCAL of the most specific entry matching `ref`, or None."""
        if isinstance(ref, str):
            ref = ImageRef.parse(ref)
        found = [entry for entry in self.entries if entry.matches(ref)]
        return max(found, key=lambda entry: entry.specificity).local if found else None

    def __bool__(self) -> bool:
        return bool(self.entries)


def parse_image_map(items: Iterable[str], cwd: str | Path = ".") -> ImageMap:
    """`--image-map` items, in order: `REF=LOCAL`, or `@FILE` holding one REF=LOCAL a line (rule 2)."""
    entries: list[MapEntry] = []
    for item in items:
        if item.startswith("@"):
            entries.extend(_map_file(item[1:], Path(cwd)))
        else:
            entries.append(_map_entry(item, f"{item!r}"))
    return ImageMap(tuple(entries))


def _map_file(name: str, cwd: Path) -> list[MapEntry]:
    if not name:
        raise ImageError("--image-map '@' names no file; write @FILE (one REF=LOCAL a line)")
    path = Path(name) if os.path.isabs(name) else cwd / name
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ImageError(f"--image-map @{name}: not UTF-8 ({exc.reason} at byte {exc.start}); save it as UTF-8") \
            from None
    except OSError as exc:
        raise ImageError(f"--image-map @{name}: cannot be read ({exc.strerror}); pass a readable file of REF=LOCAL "
                         f"lines") from None
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"@{name} line {number}"
        if line.startswith("@"):
            raise ImageError(f"--image-map {where}: {line!r} names another file; list REF=LOCAL lines only")
        out.append(_map_entry(line, where))
    return out


def _map_entry(text: str, where: str) -> MapEntry:
    ref, eq, local = text.partition("=")
    if not eq or not ref.strip() or not local.strip():
        raise ImageError(f"--image-map {where}: not REF=LOCAL; write e.g. python:3.12-slim=local/python:3.12-slim")
    ref, local = ref.strip(), local.strip()
    try:
        parsed = ImageRef.parse(ref)
        ImageRef.parse(local)
    except ImageError as exc:
        raise ImageError(f"--image-map {where}: {exc}") from None
    return MapEntry(parsed, local, where)
