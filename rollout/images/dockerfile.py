"""Dockerfile rewriting, rule 3 of polar.rollout.images (pure: no docker calls, standard library only).

The base images that the image map (polar.rollout.image_refs) matches are replaced by their local images and every
other byte is kept; each refusal is a one-line `ImageError` naming the Dockerfile's line and the fix.

3. `rewrite_dockerfile` replaces the image references that the map matches and keeps every other byte. It reads the
   Dockerfile as Docker does: parser directives at the top (`# syntax=`, `# escape=`, `# check=`), comment lines,
   `\\` (or the `escape` directive's character) continuing a line, instructions in any case. Images are named by
   `FROM [--flag…] IMAGE [AS NAME]`, `COPY --from=IMAGE` and (BuildKit) `RUN --mount=…,from=IMAGE`; a value that is
   `scratch`, names an earlier stage (case-insensitive), or (for --from) is a stage index is not an image. `ARG`s
   before the first `FROM` give FROM its variables (`$X`, `${X}`, `${X:-word}`, `${X-word}`, `${X:+word}`,
   `${X+word}`); a FROM that is one variable taking an ARG's default is rewritten in that ARG's default (so other
   uses of that ARG see the local image too), one that takes the `word` of `${X:-word}` is rewritten in the word, and
   any other FROM holding variables is rewritten whole, as its expanded value. A base whose value comes from an ARG
   without a default (or another expansion we do not follow) is reported in `unresolved`, not refused; a base no
   entry matches is reported in `unmapped`. Without BuildKit, BuildKit-only syntax is refused naming its line: the
   `# syntax=` directive, any `RUN --flag` (`--mount`, `--network`, `--security`), `COPY`/`ADD` `--chmod`, `--link`,
   `--parents`, `--exclude`, `--checksum`, `--keep-git-dir`, and heredocs (`<<EOF`, `<<-EOF`, quoted) in
   RUN/COPY/ADD. With BuildKit, heredoc bodies are skipped (a `FROM` inside one is not an instruction).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from polar.rollout.images.refs import ImageError, ImageMap, ImageRef


class Substitution(NamedTuple):
    original: str  # the reference as it resolved (an ARG's default, a FROM or --from value)
    local: str  # what replaced it
    line: int  # 1-based line of the replaced text


class Base(NamedTuple):
    text: str  # the image reference as written (variables expanded), or the unexpanded value when unresolved
    line: int


@dataclass(frozen=True)
class Rewritten:
    """rewrite_dockerfile's result (rule 3)."""

    text: str  # the Dockerfile with the mapped references replaced; every other byte as it was
    substitutions: tuple[Substitution, ...]  # one per replaced span, in file order
    unmapped: tuple[Base, ...]  # images (FROM, COPY --from, RUN --mount from=) no entry matched
    unresolved: tuple[Base, ...]  # image values we could not resolve (an ARG without a default, …)
    stages: tuple[str | None, ...]  # one per FROM: its AS name, None when unnamed

    @property
    def local_bases(self) -> tuple[str, ...]:
        """The local images substituted, sorted, once each: the bases whose ids go into environment_key."""
        return tuple(sorted({sub.local for sub in self.substitutions}))


BUILDKIT_DIRECTIVES = frozenset({"syntax"})
DIRECTIVES = frozenset({"syntax", "escape", "check"})
BUILDKIT_COPY_FLAGS = frozenset({"chmod", "link", "parents", "exclude", "checksum", "keep-git-dir"})
_DIRECTIVE = re.compile(r"#\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(.*?)\s*")
_HEREDOC = re.compile(r"\d*<<(-?)([\"']?)([^<\"'\s]+)\2")
_VAR = re.compile(r"\$(?:(?P<bare>[A-Za-z_][A-Za-z0-9_]*)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                  r"(?:(?P<op>:?[-+])(?P<word>[^}]*))?\})")
_ARG_ITEM = re.compile(r"(?P<name>[^\s=]+)(?:=(?P<value>(?:\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s\"']+)*))?")
_BUILDKIT_FIX = "build with BuildKit (DOCKER_BUILDKIT=1 or docker buildx) or rewrite the line without it"


@dataclass
class _Arg:
    value: str | None  # the default, expanded; None when declared without one (or not expandable)
    span: tuple[int, int] | None  # where the default's text lies in the file (inside quotes)
    line: int


@dataclass
class _Instruction:
    keyword: str  # upper case
    text: str  # the logical line: continuations joined, comment lines dropped, leading whitespace dropped
    origin: list[int]  # origin[i]: the file offset of text[i]
    line: int  # 1-based line of its first character


class _Rewriter:
    def __init__(self, text: str, image_map: ImageMap, buildkit: bool):
        self.text, self.map, self.buildkit = text, image_map, buildkit
        self.edits: dict[tuple[int, int], tuple[str, str]] = {}  # (start, end) → (original, local)
        self.unmapped: list[Base] = []
        self.unresolved: list[Base] = []
        self.stages: list[str | None] = []
        self.args: dict[str, _Arg] = {}  # the ARGs before the first FROM
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line_of(self, offset: int) -> int:
        lo, hi = 0, len(self.line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    def refuse(self, line: int, problem: str, fix: str = _BUILDKIT_FIX) -> ImageError:
        return ImageError(f"Dockerfile line {line}: {problem}; {fix}")

    # -- reading ------------------------------------------------------------------------------------------------------

    def run(self) -> Rewritten:
        lines = self.text.split("\n")
        escape = "\\"
        index = 0
        # parser directives: the leading lines that are `# name=value` with a known name
        while index < len(lines):
            body = lines[index].rstrip("\r")
            if index == 0:
                body = body.removeprefix("\ufeff")
            match = _DIRECTIVE.fullmatch(body.strip())
            if not match or match.group(1).lower() not in DIRECTIVES:
                break
            name, value = match.group(1).lower(), match.group(2)
            if name in BUILDKIT_DIRECTIVES and not self.buildkit:
                raise self.refuse(index + 1, f"the `# {name}=` parser directive needs BuildKit, which this builder "
                                             f"lacks")
            if name == "escape":
                if value not in ("\\", "`"):
                    raise self.refuse(index + 1, f"the escape directive's value {value!r} is neither \\ nor `",
                                      "write # escape=\\ or # escape=`")
                escape = value
            index += 1
        continuation = re.compile(re.escape(escape) + r"[ \t]*$")
        first_from_seen = False
        while index < len(lines):
            start = self.line_starts[index]
            body = lines[index].rstrip("\r")
            lead = 1 if index == 0 and body.startswith("\ufeff") else 0
            stripped = body[lead:].lstrip(" \t")
            if not stripped.strip() or stripped.startswith("#"):
                index += 1
                continue
            offset = start + len(body) - len(stripped)
            chars: list[str] = []
            origin: list[int] = []
            first_line = index + 1
            piece, piece_start = stripped, offset
            while True:
                match = continuation.search(piece)
                kept = piece[:match.start()] if match else piece
                chars.append(kept)
                origin.extend(range(piece_start, piece_start + len(kept)))
                index += 1
                if not match:
                    break
                # the next line that is neither a comment nor blank continues the instruction
                while index < len(lines):
                    nxt = lines[index].rstrip("\r")
                    if nxt.strip() and not nxt.lstrip(" \t").startswith("#"):
                        break
                    index += 1
                if index >= len(lines):
                    break
                piece, piece_start = lines[index].rstrip("\r"), self.line_starts[index]
            logical = "".join(chars)
            if not logical.strip():
                continue
            keyword = logical.split(None, 1)[0].upper()
            inst = _Instruction(keyword, logical, origin, first_line)
            heredocs = self.instruction(inst, first_from_seen)
            first_from_seen = first_from_seen or keyword == "FROM"
            for dash, word in heredocs:  # skip each body, up to its terminator line
                while index < len(lines):
                    end = lines[index].rstrip("\r")
                    index += 1
                    if (end.lstrip("\t") if dash else end) == word:
                        break
        return self.result()

    def tokens(self, inst: _Instruction) -> list[tuple[str, int, int]]:
        """The whitespace-separated words after the keyword, with their (start, end) in inst.text."""
        words = [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", inst.text)]
        return words[1:]

    def span(self, inst: _Instruction, start: int, end: int) -> tuple[int, int]:
        """The file offsets of inst.text[start:end] (a span may cover a continuation; it is replaced whole)."""
        return inst.origin[start], inst.origin[end - 1] + 1

    # -- instructions -------------------------------------------------------------------------------------------------

    def instruction(self, inst: _Instruction, after_from: bool) -> list[tuple[bool, str]]:
        words = self.tokens(inst)
        flags = []
        for word in words:
            if not word[0].startswith("--"):
                break
            flags.append(word)
        heredocs: list[tuple[bool, str]] = []
        if inst.keyword in ("RUN", "COPY", "ADD"):
            for word, start, _ in words[len(flags):]:
                match = _HEREDOC.fullmatch(word)
                if match:
                    if not self.buildkit:
                        raise self.refuse(self.line_of(inst.origin[start]),
                                          f"the heredoc {word} in {inst.keyword} needs BuildKit, which this builder "
                                          f"lacks")
                    heredocs.append((match.group(1) == "-", match.group(3)))
        for word, start, end in flags:
            name, _, value = word[2:].partition("=")
            line = self.line_of(inst.origin[start])
            if not self.buildkit and (inst.keyword == "RUN" or (inst.keyword in ("COPY", "ADD")
                                                                and name.lower() in BUILDKIT_COPY_FLAGS)):
                raise self.refuse(line, f"{inst.keyword} --{name} needs BuildKit, which this builder lacks")
            if inst.keyword == "COPY" and name == "from" and value:
                self.source(inst, start + len("--from="), end, value)
            elif inst.keyword == "RUN" and name == "mount":
                cursor = start + len("--mount=")
                for part in value.split(","):
                    key, eq, val = part.partition("=")
                    if eq and key.strip().lower() == "from" and val:
                        self.source(inst, cursor + len(key) + 1, cursor + len(part), val)
                    cursor += len(part) + 1
        if inst.keyword == "ARG" and not after_from:
            self.arg(inst)
        elif inst.keyword == "FROM":
            self.from_(inst, words[len(flags):])
        return heredocs

    def arg(self, inst: _Instruction) -> None:
        body_start = len(inst.text.split(None, 1)[0])
        for match in _ARG_ITEM.finditer(inst.text, body_start):
            name, raw = match.group("name"), match.group("value")
            line = self.line_of(inst.origin[match.start()])
            if raw is None:
                self.args[name] = _Arg(None, None, line)
                continue
            start, end = match.span("value")
            if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'" and _quoted_whole(raw):
                start, end = start + 1, end - 1
                value = raw[1:-1].replace('\\"', '"') if raw[0] == '"' else raw[1:-1]
                expanded = value if raw[0] == "'" else self.expand(value)
            else:
                expanded = self.expand(raw.replace('"', "").replace("'", ""))
            file_span = (inst.origin[start], inst.origin[end - 1] + 1) if end > start else \
                ((inst.origin[start - 1] + 1,) * 2)
            self.args[name] = _Arg(expanded, file_span, line)

    def expand(self, word: str) -> str | None:
        """`word` with the global ARGs substituted; None when a variable has no value we know."""
        failed = False

        def one(match: re.Match) -> str:
            nonlocal failed
            name = match.group("bare") or match.group("name")
            op, alt = match.group("op"), match.group("word") or ""
            arg = self.args.get(name)
            value = arg.value if arg is not None else None
            if arg is not None and arg.value is None and arg.span is not None:
                failed = True  # declared with a default we could not expand
            if op in (":-", "-"):
                use_alt = value is None or (op == ":-" and value == "")
                if use_alt:
                    alt_value = self.expand(alt)
                    failed = failed or alt_value is None
                    return alt_value or ""
                return value
            if op in (":+", "+"):
                if value is None or (op == ":+" and value == ""):
                    return ""
                alt_value = self.expand(alt)
                failed = failed or alt_value is None
                return alt_value or ""
            if value is None:
                failed = True
                return ""
            return value

        if "$" not in word:
            return word
        out = _VAR.sub(one, word.replace("\\$", "\0"))
        if "$" in out:
            return None  # an expansion we do not follow (${X:?…}, ${X#…}, …)
        return None if failed else out.replace("\0", "$")

    def from_(self, inst: _Instruction, words: list[tuple[str, int, int]]) -> None:
        if not words:
            raise self.refuse(inst.line, "FROM names no image", "write FROM IMAGE [AS NAME]")
        value, start, end = words[0]
        name = words[2][0] if len(words) >= 3 and words[1][0].lower() == "as" else None
        self.image(inst, start, end, value)
        self.stages.append(name)

    def source(self, inst: _Instruction, start: int, end: int, value: str) -> None:
        """A --from / from= value: a stage index, a stage name, or an image."""
        if value.isdigit():
            return
        if "$" in value:
            self.unresolved.append(Base(value, self.line_of(inst.origin[start])))
            return
        self.image(inst, start, end, value)

    def image(self, inst: _Instruction, start: int, end: int, value: str) -> None:
        line = self.line_of(inst.origin[start])
        if "$" not in value:
            self.mapped(value, self.span(inst, start, end), line)
            return
        single = _VAR.fullmatch(value)
        if single:
            name = single.group("bare") or single.group("name")
            op, word = single.group("op"), single.group("word") or ""
            arg = self.args.get(name)
            from_arg = arg is not None and arg.value is not None and not (op == ":-" and arg.value == "")
            if op in (None, ":-", "-") and from_arg and arg.span is not None:
                self.mapped(arg.value, arg.span, line, resolved_from=value)
                return
            if op in (":-", "-") and not from_arg and not (arg is not None and arg.span is not None) \
                    and "$" not in word and word:
                word_start = start + single.start("word")
                self.mapped(word, self.span(inst, word_start, word_start + len(word)), line)
                return
        expanded = self.expand(value)
        if expanded is None or not expanded:
            self.unresolved.append(Base(value, line))
            return
        self.mapped(expanded, self.span(inst, start, end), line)

    def mapped(self, ref_text: str, file_span: tuple[int, int], line: int, resolved_from: str | None = None) -> None:
        """Replace `ref_text` (at file_span) when the map matches it; `scratch` and earlier stages are not images."""
        if ref_text == "scratch" or ref_text.lower() in {stage.lower() for stage in self.stages if stage}:
            return
        try:
            ref = ImageRef.parse(ref_text)
        except ImageError as exc:
            where = f" ({resolved_from})" if resolved_from else ""
            raise ImageError(f"Dockerfile line {line}: {exc}{where}") from None
        local = self.map.lookup(ref)
        if local is None:
            self.unmapped.append(Base(ref_text, line))
        else:
            self.edits[file_span] = (ref_text, local)

    def result(self) -> Rewritten:
        pieces, last, subs = [], 0, []
        for (start, end), (original, local) in sorted(self.edits.items()):
            pieces.append(self.text[last:start])
            pieces.append(local)
            last = end
            subs.append(Substitution(original, local, self.line_of(start)))
        pieces.append(self.text[last:])
        return Rewritten("".join(pieces), tuple(subs), tuple(self.unmapped), tuple(self.unresolved),
                         tuple(self.stages))


def _quoted_whole(raw: str) -> bool:
    """True when raw is exactly one quoted string (no quote of its kind closes early)."""
    if raw[0] == "'":
        return "'" not in raw[1:-1]
    inner = raw[1:-1]
    i = 0
    while i < len(inner):
        if inner[i] == "\\":
            i += 2
            continue
        if inner[i] == '"':
            return False
        i += 1
    return True


def rewrite_dockerfile(text: str, image_map: ImageMap, *, buildkit: bool) -> Rewritten:
    """Rule 3: `text` with every image reference the map matches replaced by its LOCAL (see Rewritten)."""
    return _Rewriter(text, image_map, buildkit).run()
