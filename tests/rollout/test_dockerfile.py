"""Dockerfile rewriting (polar.rollout.dockerfile), rule 3 (pure: no docker, no sockets, no processes).

3.x  FROM / COPY --from / RUN --mount from=, stages, ARG bases, continuations, comments, BuildKit-only syntax refused
     naming its line, every other byte kept (an empty map, random whitespace/comments)
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.rollout.images.dockerfile import Base, Rewritten, Substitution, rewrite_dockerfile
from polar.rollout.images.refs import ImageMap
from tests.rollout.test_image_refs import SHA_A, SHA_B, mapping, refused

pytestmark = pytest.mark.unit

# 3.x Dockerfiles

PY_MAP = ("python:3.12-slim=local/py312", "ubuntu=local/ubuntu", "golang:1.22=local/go")


def rewrite(text: str, *items: str, buildkit: bool = False) -> Rewritten:
    return rewrite_dockerfile(text, mapping(*(items or PY_MAP)), buildkit=buildkit)


ODD_DOCKERFILE = """\ufeff# escape=\\
# a comment
  # an indented comment

from  --platform=$BUILDPLATFORM   python:3.12-slim@sha256:{a}   as   Build\t
ARG X=1
Run  echo "FROM ubuntu" && \\
    # a comment inside a continuation

    echo done   \\\t
    && true
COPY --from=build /a /b
FROM ubuntu:22.04\r
copy --FROM=golang:1.21 /x /y
""".format(a="a" * 64)


def test_3_1_an_empty_map_returns_the_text_unchanged_and_reports_every_base():
    result = rewrite_dockerfile(ODD_DOCKERFILE, ImageMap(), buildkit=False)
    assert result.text == ODD_DOCKERFILE and result.substitutions == ()
    assert result.unmapped == (Base(f"python:3.12-slim@{SHA_A}", 5), Base("ubuntu:22.04", 13))
    assert result.stages == ("Build", None) and result.unresolved == ()


def test_3_2_from_lines_are_rewritten_in_place_and_nothing_else_changes():
    result = rewrite(ODD_DOCKERFILE)
    assert result.text == ODD_DOCKERFILE.replace(f"python:3.12-slim@{SHA_A}", "local/py312") \
        .replace("ubuntu:22.04", "local/ubuntu")
    assert result.substitutions == (Substitution(f"python:3.12-slim@{SHA_A}", "local/py312", 5),
                                    Substitution("ubuntu:22.04", "local/ubuntu", 13))
    assert result.local_bases == ("local/py312", "local/ubuntu")
    assert "echo \"FROM ubuntu\"" in result.text  # a word in a RUN is not an image
    assert result.unmapped == ()  # `copy --FROM=` is not COPY's --from flag (flags are lower case)


@pytest.mark.parametrize("line", [
    "FROM docker.io/library/python:3.12-slim",
    "FROM index.docker.io/python:3.12-slim AS x",
    f"FROM python:3.12-slim@{SHA_B}",
    "FROM --platform=linux/amd64 python:3.12-slim",
    "from python:3.12-slim as x",
    "FrOm python:3.12-slim",
])
def test_3_3_every_spelling_of_a_mapped_base_is_rewritten(line):
    result = rewrite(line + "\nRUN true\n")
    assert result.text.count("local/py312") == 1 and "python" not in result.text
    assert result.text.endswith("\nRUN true\n") and result.substitutions[0].line == 1


def test_3_4_stage_names_and_indexes_are_not_images():
    text = ("FROM golang:1.22 AS Builder\nFROM builder AS second\nCOPY --from=BUILDER /a /a\nCOPY --from=0 /b /b\n"
            "COPY --from=ubuntu:22.04 /c /c\nCOPY --chown=1:1 --from=second /d /d\nFROM scratch\n"
            "COPY --from=python:3.12-slim /e /e\n")
    result = rewrite(text)
    assert result.text == text.replace("golang:1.22", "local/go").replace("ubuntu:22.04", "local/ubuntu") \
        .replace("python:3.12-slim", "local/py312")
    assert [sub.line for sub in result.substitutions] == [1, 5, 8]
    assert result.stages == ("Builder", "second", None) and result.unmapped == ()


def test_3_5_a_stage_name_used_before_its_stage_is_an_image():
    result = rewrite("FROM later\nFROM ubuntu AS later\n")
    assert result.unmapped == (Base("later", 1),)


@pytest.mark.parametrize("arg,use", [
    ("ARG BASE=python:3.12-slim", "${BASE}"),
    ("ARG BASE=python:3.12-slim", "$BASE"),
    ("ARG BASE=python:3.12-slim", "${BASE:-ubuntu}"),
    ("ARG BASE=python:3.12-slim", "${BASE-ubuntu}"),
    ('ARG BASE="python:3.12-slim"', "${BASE}"),
    ("ARG BASE='python:3.12-slim'", "${BASE}"),
    ("ARG OTHER=1 BASE=python:3.12-slim", "${BASE}"),
])
def test_3_6_a_from_taking_an_arg_default_is_rewritten_in_the_arg(arg, use):
    text = f"# header\n{arg}\nFROM {use} AS app\nARG BASE\nRUN echo $BASE\n"
    result = rewrite(text)
    assert result.text == text.replace("python:3.12-slim", "local/py312")
    assert result.substitutions == (Substitution("python:3.12-slim", "local/py312", 2),)
    assert result.unmapped == () and result.unresolved == ()


def test_3_7_an_arg_used_by_two_froms_is_rewritten_once():
    text = "ARG BASE=python:3.12-slim\nFROM $BASE AS a\nFROM ${BASE} AS b\n"
    result = rewrite(text)
    assert result.text == text.replace("python:3.12-slim", "local/py312") and len(result.substitutions) == 1


def test_3_8_the_default_word_of_an_unset_arg_is_rewritten_in_the_from():
    text = "ARG BASE\nFROM ${BASE:-python:3.12-slim}\nFROM ${NOT_DECLARED:-ubuntu:22.04}\n"
    result = rewrite(text)
    assert result.text == "ARG BASE\nFROM ${BASE:-local/py312}\nFROM ${NOT_DECLARED:-local/ubuntu}\n"
    assert [sub.line for sub in result.substitutions] == [2, 3]


def test_3_9_a_from_with_variables_inside_is_rewritten_whole():
    text = "ARG PY=3.12\nARG REG=docker.io/library\nFROM ${REG}/python:${PY}-slim\nFROM python:${PY}\n"
    result = rewrite(text)
    assert result.text == "ARG PY=3.12\nARG REG=docker.io/library\nFROM local/py312\nFROM python:${PY}\n"
    assert result.unmapped == (Base("python:3.12", 4),)


def test_3_10_an_arg_default_built_from_other_args_is_replaced_whole():
    text = "ARG V=3.12\nARG BASE=python:${V}-slim\nFROM $BASE\n"
    assert rewrite(text).text == "ARG V=3.12\nARG BASE=local/py312\nFROM $BASE\n"


def test_3_11_a_base_from_an_arg_without_a_default_is_unresolved_not_an_error():
    text = "ARG BASE\nARG TAG\nFROM $BASE\nFROM python:${TAG}\nFROM ${UNDECLARED}\nCOPY --from=${BASE} /a /a\n"
    result = rewrite(text)
    assert result.text == text and result.unmapped == ()
    assert result.unresolved == (Base("$BASE", 3), Base("python:${TAG}", 4), Base("${UNDECLARED}", 5),
                                 Base("${BASE}", 6))


def test_3_12_args_after_the_first_from_do_not_name_bases():
    text = "FROM ubuntu\nARG BASE=python:3.12-slim\nFROM $BASE\n"
    result = rewrite(text)
    assert result.text == "FROM local/ubuntu\nARG BASE=python:3.12-slim\nFROM $BASE\n"
    assert result.unresolved == (Base("$BASE", 3),)


def test_3_13_continuations_and_the_escape_directive():
    text = "FROM \\\n  # a comment between\n\n  python:3.12-slim \\\n  AS app\nRUN true\n"
    result = rewrite(text)
    assert result.text == text.replace("python:3.12-slim", "local/py312") and result.stages == ("app",)
    assert result.substitutions[0].line == 4
    split = "FROM pyth\\\non:3.12-slim\n"  # a continuation inside the word: the word is replaced whole
    assert rewrite(split).text == "FROM local/py312\n"
    backtick = "# escape=`\nFROM `\n python:3.12-slim\nRUN dir c:\\\nFROM ubuntu\n"
    result = rewrite(backtick)
    assert result.text == "# escape=`\nFROM `\n local/py312\nRUN dir c:\\\nFROM local/ubuntu\n"


def test_3_14_crlf_line_endings_are_kept():
    text = "# c\r\nFROM python:3.12-slim AS a\r\nRUN echo \\\r\n  hi\r\nFROM ubuntu\r\n"
    result = rewrite(text)
    assert result.text == text.replace("python:3.12-slim", "local/py312").replace("ubuntu", "local/ubuntu")
    assert result.stages == ("a", None)


@pytest.mark.parametrize("text,line,what", [
    ("# syntax=docker/dockerfile:1\nFROM ubuntu\n", 1, "the `# syntax=` parser directive"),
    ("#Syntax = docker/dockerfile:1.7\nFROM ubuntu\n", 1, "the `# syntax=` parser directive"),
    ("# escape=\\\n# syntax=x\nFROM ubuntu\n", 2, "the `# syntax=` parser directive"),
    ("FROM ubuntu\nRUN --mount=type=cache,target=/root/.cache pip install x\n", 2, "RUN --mount"),
    ("FROM ubuntu\nRUN \\\n  --network=none true\n", 3, "RUN --network"),
    ("FROM ubuntu\nRUN <<EOF\necho hi\nEOF\n", 2, "the heredoc <<EOF in RUN"),
    ("FROM ubuntu\n\nrun <<-'END' bash\n\techo\n\tEND\n", 3, "the heredoc <<-'END' in RUN"),
    ("FROM ubuntu\nCOPY <<\"EOF\" /app/x\nhi\nEOF\n", 2, "the heredoc <<\"EOF\" in COPY"),
    ("FROM ubuntu\nCOPY --chmod=755 a /a\n", 2, "COPY --chmod"),
    ("FROM ubuntu\nADD --link a /a\n", 2, "ADD --link"),
])
def test_3_15_buildkit_only_syntax_is_refused_naming_its_line_without_buildkit(text, line, what):
    message = refused(rewrite_dockerfile, text, ImageMap(), buildkit=False)
    assert message == (f"Dockerfile line {line}: {what} needs BuildKit, which this builder lacks; build with BuildKit "
                       f"(DOCKER_BUILDKIT=1 or docker buildx) or rewrite the line without it")
    assert rewrite_dockerfile(text, ImageMap(), buildkit=True).text == text


def test_3_16_what_the_classic_builder_reads_is_not_refused():
    text = ("# check=skip=all\nFROM ubuntu\nRUN cat <<<word && echo a<<b\nCOPY --chown=1:1 a /a\n"
            "# syntax=late, only a comment\nRUN echo '<< EOF'\n")
    assert rewrite_dockerfile(text, ImageMap(), buildkit=False).text == text


def test_3_17_with_buildkit_heredoc_bodies_are_not_instructions_and_mount_from_is_an_image():
    text = ("# syntax=docker/dockerfile:1\nFROM python:3.12-slim AS base\nRUN <<EOF\nFROM ubuntu\nEOF\n"
            "COPY <<-A <<B /dst/\n\tFROM golang:1.22\n\tA\nFROM ubuntu\nB\n"
            "RUN --mount=type=bind,from=ubuntu:22.04,source=/x,target=/y --mount=type=cache,from=base,target=/c true\n")
    result = rewrite(text, buildkit=True)
    assert result.text == text.replace("python:3.12-slim", "local/py312").replace("from=ubuntu:22.04",
                                                                                  "from=local/ubuntu")
    assert [sub.line for sub in result.substitutions] == [2, 11] and result.stages == ("base",)


@pytest.mark.parametrize("text,line,start", [
    ("FROM\n", 1, "Dockerfile line 1: FROM names no image; write FROM IMAGE [AS NAME]"),
    ("\n\nFROM Ubuntu\n", 3, "Dockerfile line 3: image reference 'Ubuntu': the repository must be lower case;"),
    ("ARG B=Bad\nFROM $B\n", 2, "Dockerfile line 2: image reference 'Bad':"),
    ("FROM ubuntu\nCOPY --from=a:b:c /x /y\n", 2, "Dockerfile line 2: image reference 'a:b:c':"),
])
def test_3_18_an_invalid_image_is_refused_naming_its_line(text, line, start):
    assert refused(rewrite_dockerfile, text, ImageMap(), buildkit=False).startswith(start)


def test_3_19_a_mapped_stage_lookalike_is_still_a_stage_and_args_may_name_stages_or_scratch():
    result = rewrite("FROM python:3.12-slim AS ubuntu\nFROM ubuntu\nCOPY --from=ubuntu /a /a\n")
    assert result.text == "FROM local/py312 AS ubuntu\nFROM ubuntu\nCOPY --from=ubuntu /a /a\n"
    text = "ARG EMPTY=scratch\nARG STAGE=Base\nFROM $EMPTY AS base\nFROM ${STAGE}\nFROM ${NONE:-scratch}\n"
    result = rewrite(text)
    assert (result.text, result.substitutions, result.unmapped, result.unresolved) == (text, (), (), ())


FILLER = st.lists(st.sampled_from(["", "   ", "\t", "# note", "  # FROM ubuntu", "#FROM python:3.12-slim"]),
                  max_size=3).map(lambda lines: "".join(line + "\n" for line in lines))
GAP = st.text(alphabet=" \t", min_size=1, max_size=4)
TRAIL = st.text(alphabet=" \t", max_size=3)
BASES = st.sampled_from([("python:3.12-slim", "local/py312"), ("docker.io/library/ubuntu:22.04", "local/ubuntu"),
                         (f"golang:1.22@{SHA_A}", "local/go"), ("alpine:3", None)])


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.tuples(FILLER, st.sampled_from(["FROM", "from", "From"]), GAP, BASES, TRAIL,
                                st.booleans(), GAP), min_size=1, max_size=4),
       tail=FILLER, crlf=st.booleans())
def test_3_20_random_whitespace_and_comments_survive_a_rewrite(parts, tail, crlf):
    original, expected = [], []
    for index, (filler, keyword, gap, (base, local), trail, named, gap2) in enumerate(parts):
        suffix = f"{gap2}AS s{index}" if named else ""
        line_end = "\r\n" if crlf else "\n"
        original.append(f"{filler}{keyword}{gap}{base}{suffix}{trail}{line_end}RUN echo {base}{line_end}")
        expected.append(f"{filler}{keyword}{gap}{local or base}{suffix}{trail}{line_end}RUN echo {base}{line_end}")
    text, want = "".join(original) + tail, "".join(expected) + tail
    result = rewrite(text)
    assert result.text == want
    assert rewrite_dockerfile(text, ImageMap(), buildkit=False).text == text
    assert len(result.substitutions) == sum(1 for part in parts if part[3][1])
    assert len(result.unmapped) == sum(1 for part in parts if not part[3][1])
