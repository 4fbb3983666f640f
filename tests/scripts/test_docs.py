"""The user documentation stands alone: README.md and docs/*.md (no sockets, no processes).

1.x  no reference to the internal design notes users do not have
2.x  every relative link points at a file of the repository, and every #anchor at one of its headings
3.x  docs/architecture.md's layout tree names every module (the README: one line per package); docs/options.md names
     every gateway option and polar-process flag
4.x  the README's first screen: what it is, Install with its extras, the two commands; every command it shows runs in a
     checkout
"""

from __future__ import annotations

import glob
import os
import re

import pytest

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
PAGES = [README, *DOCS]
INTERNAL = ("DES" "IGN §", "DES" "IGN.md", "FIELD" "-NOTES")  # spelt in pieces: this file names them only to look
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: str) -> set[str]:
    text = re.sub(r"```.*?```", "", _read(path), flags=re.DOTALL)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.MULTILINE)}


def _name(path: str) -> str:
    return os.path.relpath(path, ROOT)


def test_1_1_the_docs_exist():
    names = {os.path.basename(p) for p in DOCS}
    assert {"architecture.md", "records.md", "merge-rules.md", "options.md"} <= names


@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_1_2_no_reference_to_internal_notes(path):
    text = _read(path)
    found = [(n, word) for n, line in enumerate(text.splitlines(), 1) for word in INTERNAL if word in line]
    assert not found, f"{_name(path)} cites notes users do not have (link to docs/ instead): {found}"


@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_2_1_relative_links_point_at_existing_files_and_headings(path):
    text = re.sub(r"```.*?```", "", _read(path), flags=re.DOTALL)  # code blocks hold no links
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(dest):
            bad.append(f"{target}: no such file")
        elif anchor and dest.endswith(".md") and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {_name(dest)}")
    assert not bad, f"{_name(path)}: {bad}"


def _modules() -> list[str]:
    """Every source file under addon/, processor/, rollout/ and scripts/ (package markers and caches aside)."""
    out = []
    for top in ("addon", "processor", "rollout", "scripts"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__pycache__"))]
            for f in filenames:
                path = os.path.join(dirpath, f)
                if f.startswith(".") or f.endswith((".pyc", ".typed")):
                    continue
                if f == "__init__.py" and os.path.getsize(path) == 0:
                    continue
                out.append(_name(path))
    return sorted(out)


def test_3_1_the_layout_tree_names_every_module():
    """The file-by-file layout lives in docs/architecture.md; the README keeps one line per package."""
    text = _read(os.path.join(ROOT, "docs", "architecture.md"))
    tree = text[text.index("## Layout"):]
    tree = tree[tree.index("```") + 3:]
    tree = tree[:tree.index("```")]
    listed = {line.split()[0] for line in tree.splitlines() if line.strip()}
    missing = [m for m in _modules() if m not in listed]
    assert not missing, f"docs/architecture.md's layout tree lacks (one line each): {missing}"
    readme = _read(README)
    packages = readme[readme.index("## Packages"):]
    packages = packages[packages.index("```") + 3:]
    named = {line.split()[0] for line in packages[:packages.index("```")].splitlines() if line.strip()}
    assert {f"{top}/" for top in ("records", "launch", "addon", "processor", "rollout", "trainer", "integrations",
                                  "scripts")} <= named, named


def _first_screen() -> str:
    return "\n".join(_read(README).splitlines()[:40])


def test_4_1_the_readmes_first_screen_says_what_it_is_how_to_install_and_the_two_commands():
    """Issue 37: the first 40 lines hold the pitch, the picture, Install with the extras, and the two commands."""
    screen = _first_screen()
    assert screen.startswith("# Polar gateway\n\nMake any coding agent trainable")
    assert "## Install" in screen and "agent CLI / SDK" in screen  # the picture
    blocks = re.findall(r"```bash\n(.*?)```", screen, flags=re.S)
    commands = [line.split("#")[0].split() for block in blocks for line in block.splitlines() if line.strip()]
    assert commands[:2] == [["scripts/demo"], ["scripts/test"]], commands
    import tomllib

    project = tomllib.loads(_read(os.path.join(ROOT, "pyproject.toml")))["project"]
    extras = set(project["optional-dependencies"])
    named = set()
    for words in commands:
        if words[:2] == ["pip", "install"]:
            m = re.fullmatch(r"'polar-gateway\[([a-z,]+)\]'", words[2])
            assert m, words
            named |= set(m.group(1).split(","))
        else:
            script = os.path.join(ROOT, words[0])
            assert os.path.isfile(script) and os.access(script, os.X_OK), words
    assert {"proxy", "agents", "train", "trl"} <= named <= extras, (named, extras)


def test_4_2_the_commands_the_readme_shows_run_as_in_a_checkout():
    """Every command line in the README's bash blocks names something a checkout has: a script, a .venv command
    that is one of the package's console scripts, or an install line."""
    import tomllib

    scripts = set(tomllib.loads(_read(os.path.join(ROOT, "pyproject.toml")))["project"]["scripts"])
    bad = []
    for block in re.findall(r"```bash\n(.*?)```", _read(README), flags=re.S):
        for line in block.splitlines():
            word = (line.split("#")[0].split() or [""])[0]
            if word.startswith((".venv/bin/", ".venv-train/bin/")):
                name = word.rsplit("/", 1)[1]
                if name not in scripts | {"python", "torchrun", "pip", "mitmdump"}:
                    bad.append(line)
            elif word.startswith("polar-"):
                bad.append(line)  # bare: not on PATH in a checkout
    assert bad == [], bad


def test_3_2_options_doc_names_every_gateway_option_and_processor_flag():
    doc = _read(os.path.join(ROOT, "docs", "options.md"))
    declared = re.compile(r"(?:add_option|Option)\(\s*\"(polar_\w+)\"")
    options = sorted({o for f in glob.glob(os.path.join(ROOT, "addon", "*.py")) for o in declared.findall(_read(f))})
    assert options, "no polar_* option declared under addon/"
    missing = [o for o in options if f"`{o}`" not in doc]
    cli = _read(os.path.join(ROOT, "processor", "cli.py"))
    flags = re.findall(r"add_argument\(\s*(?:\"-\w\",\s*)?\"(--[\w-]+)\"", cli)
    assert flags, "no flag found in processor/cli.py"
    missing += [f for f in flags if f not in doc]
    assert not missing, f"docs/options.md does not document: {missing}"
