"""A compose file's one service, rule 4 of polar.rollout.images (pure: standard library only, no YAML library).

What to build (its context and Dockerfile) or the image to run; each refusal is a one-line `ImageError` naming the
file, its line and the fix.

4. `compose_service` reads the subset of a compose file that names one service's image, without a YAML dependency:
   block mappings, plain and quoted scalars, comments. `services` holds exactly one service (more are refused, naming
   them); that service has `build` (a context string, or a mapping of `context`, default `.`, and `dockerfile`, default
   `Dockerfile`, relative to the context; any other build key is refused) or, without `build`, `image`. Keys we do not
   read (environment, volumes, command…) are skipped whatever they hold. Refused: `include`, `extends`, `<<` merge
   keys, anchors/aliases/tags/flow collections/block scalars where we read a value, variables in a value we use,
   absolute, URL or `..`-escaping build paths, and more than one YAML document.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from typing import NamedTuple

from polar.rollout.images.refs import ImageError, ImageRef


@dataclass(frozen=True)
class ComposeService:
    """The one service of a compose file (rule 4): built (context, dockerfile) or run as `image`."""

    name: str
    context: str | None  # the build context, relative to the compose file's folder, normalized ("." for itself)
    dockerfile: str | None  # the Dockerfile, relative to that folder (context joined with build.dockerfile)
    image: str | None  # `image`: what to run when there is no build (with a build, the name compose tags it with)

    @property
    def builds(self) -> bool:
        return self.context is not None


class _YamlLine(NamedTuple):
    number: int
    indent: int
    content: str  # without indentation, trailing whitespace or a whole-line comment


# a block mapping line: a quoted key, a plain key (not starting with a YAML indicator), or `<<`; then `:` and the value
_KEY = re.compile(r"(?P<key>\"(?:[^\"\\]|\\.)*\"|'(?:[^']|'')*'|[^\s#'\"\-?:{}\[\]&*!|>%@`][^#]*?|<<)"
                  r"\s*:(?:\s+(?P<value>.*))?")
BUILD_KEYS = frozenset({"context", "dockerfile"})


def compose_service(text: str, name: str = "compose file") -> ComposeService:
    """Rule 4: the one service of a compose file's text (`name` is used in errors)."""
    return _Reader(text, name).service()


_Entry = tuple[_YamlLine, str | None, int, int]  # a mapping's key: (its line, inline value, child lo, child hi)


class _Reader:
    """The subset of YAML rule 4 reads (block mappings, plain and quoted scalars, comments) over one file's lines."""

    def __init__(self, text: str, name: str):
        self.name = name
        self.lines: list[_YamlLine] = []
        documents = 0
        for number, raw in enumerate(text.split("\n"), 1):
            body = raw.rstrip()
            stripped = body.lstrip(" ")
            if not stripped or stripped.startswith("#"):
                continue
            if stripped.startswith("\t") or body[:len(body) - len(stripped)].count("\t"):
                raise self.fail(number, "it is indented with a tab", "indent with spaces")
            if len(body) == len(stripped) and (stripped == "---" or stripped.startswith("--- ")):
                documents += 1
                if documents > 1 or self.lines:
                    raise self.fail(number, "it holds more than one YAML document", "keep one document, one service")
                continue
            if len(body) == len(stripped) and stripped.startswith("%"):
                raise self.fail(number, "YAML directives are not read", "remove the directive line")
            self.lines.append(_YamlLine(number, len(body) - len(stripped), stripped))

    def fail(self, line: int | None, problem: str, fix: str) -> ImageError:
        where = f"{self.name} line {line}" if line else self.name
        return ImageError(f"{where}: {problem}; {fix}")

    def entries(self, lo: int, hi: int, what: str) -> dict[str, _Entry]:
        """The mapping in lines[lo:hi] (all at one indent): key → (line, inline value, child lo, child hi)."""
        lines = self.lines
        out: dict[str, _Entry] = {}
        if lo >= hi:
            return out
        indent = lines[lo].indent
        i = lo
        while i < hi:
            line = lines[i]
            if line.indent != indent:
                raise self.fail(line.number, f"its indentation does not match the rest of {what}",
                                "indent the keys of one mapping alike")
            match = _KEY.fullmatch(line.content)
            if not match:
                raise self.fail(line.number, f"{line.content[:40]!r} in {what} is not a `key: value` line of the "
                                             f"subset polar-rollout reads", "write block mappings (key: value)")
            key = _unquote(match.group("key"))
            i += 1
            child = i
            while i < hi and (lines[i].indent > indent or (lines[i].indent == indent
                                                           and lines[i].content.startswith("-"))):
                i += 1
            if key in out:
                raise self.fail(line.number, f"{what} holds the key {key!r} twice", "keep one")
            out[key] = (line, match.group("value"), child, i)
        return out

    def scalar(self, line: _YamlLine, value: str | None, what: str) -> str:
        if value is None:
            raise self.fail(line.number, f"{what} is empty", f"give {what} a value")
        value = value.strip()
        if value[0] in "{[&*!|>":
            raise self.fail(line.number, f"{what} uses YAML beyond the subset polar-rollout reads (flow collections, "
                                         f"anchors, aliases, tags, block scalars)", f"write {what} as a plain string")
        if value[0] in "\"'":
            match = re.match(r"\"((?:[^\"\\]|\\.)*)\"|'((?:[^']|'')*)'", value)
            rest = value[match.end():].strip() if match else "?"
            if not match or (rest and not rest.startswith("#")):
                raise self.fail(line.number, f"{what}'s quoted string is not closed on its line",
                                "quote it on one line")
            return _unquote(match.group())
        return re.split(r"\s+#", value, maxsplit=1)[0].strip()

    def service(self) -> ComposeService:
        """The file's one service: run as its image, or built (`build`)."""
        fail = self.fail
        top = self.entries(0, len(self.lines), "the file")
        if "include" in top:
            raise fail(top["include"][0].number, "`include` is not read", "put the one service in this file")
        if "services" not in top:
            raise fail(None, "it has no `services`", "name one service with build or image")
        line, value, lo, hi = top["services"]
        if value is not None and value.strip() and not value.strip().startswith("#"):
            raise fail(line.number, "`services` is not a block mapping", "write each service on its own indented line")
        services = self.entries(lo, hi, "services")
        if len(services) != 1:
            listed = ", ".join(services) or "none"
            raise fail(line.number, f"it has {len(services)} services ({listed}); polar-rollout runs one",
                       "reduce it to one service, or write environment/Dockerfile")
        [(service, (sline, svalue, lo, hi))] = services.items()
        if svalue is not None and svalue.strip() and not svalue.strip().startswith("#"):
            raise fail(sline.number, f"service {service} is not a block mapping", "write its keys on indented lines")
        keys = self.entries(lo, hi, f"service {service}")
        for refused in ("<<", "extends"):
            if refused in keys:
                raise fail(keys[refused][0].number, f"service {service} uses `{refused}`",
                           "write build or image in the service itself")
        image = None
        if "image" in keys:
            iline, ivalue, _, _ = keys["image"]
            image = self.scalar(iline, ivalue, f"service {service}'s image")
        if "build" in keys:
            return self.build(service, keys["build"], image)
        if image is None:
            raise fail(sline.number, f"service {service} has neither build nor image", "give it one of them")
        if "$" in image:
            raise fail(keys["image"][0].number, f"service {service}'s image {image!r} uses a variable",
                       "write the image name itself")
        try:
            ImageRef.parse(image)
        except ImageError as exc:
            raise fail(keys["image"][0].number, str(exc).split(";")[0], "write a valid image reference") from None
        return ComposeService(service, None, None, image)

    def build(self, service: str, entry: _Entry, image: str | None) -> ComposeService:
        """A service with `build`: its context and Dockerfile, relative paths inside environment/."""
        fail = self.fail
        bline, bvalue, lo, hi = entry
        if bvalue is not None and bvalue.strip() and not bvalue.strip().startswith("#"):
            context, dockerfile, where = self.scalar(bline, bvalue, f"service {service}'s build"), "Dockerfile", bline
        else:
            build = self.entries(lo, hi, f"service {service}'s build")
            for key, (kline, _, _, _) in build.items():
                if key not in BUILD_KEYS:
                    raise fail(kline.number, f"build.{key} is not read (only build.context and build.dockerfile)",
                               f"remove build.{key}, or write environment/Dockerfile")
            context = self.scalar(*build["context"][:2], "build.context") if "context" in build else "."
            dockerfile = self.scalar(*build["dockerfile"][:2], "build.dockerfile") if "dockerfile" in build \
                else "Dockerfile"
            where = build.get("context", build.get("dockerfile", (bline,)))[0]
        for label, path in (("build context", context), ("build dockerfile", dockerfile)):
            if "$" in path:
                raise fail(where.number, f"the {label} {path!r} uses a variable", "write the path itself")
            if "://" in path or path.startswith("git@") or os.path.isabs(path) or path.startswith("~"):
                raise fail(where.number, f"the {label} {path!r} is not a relative path",
                           "make it relative to environment/")
        context = posixpath.normpath(context)
        joined = posixpath.normpath(posixpath.join(context, dockerfile))
        for label, path in (("build context", context), ("build dockerfile", joined)):
            if path == ".." or path.startswith("../"):
                raise fail(where.number, f"the {label} {path!r} lies outside environment/",
                           "keep it inside environment/")
        return ComposeService(service, context, joined, image)


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), text[1:-1])
    return text
