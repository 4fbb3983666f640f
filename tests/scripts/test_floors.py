"""The floors of the house, as issue 38 set them (no sockets): who may import whom, checked over every import of the
project — at module level, inside functions and under `if TYPE_CHECKING` alike — and no import circle inside a
package. docs/architecture.md draws the same table ("The floors"); test_4_1 holds the drawing to it.

Bottom up: polar.records → polar.addon / polar.processor / polar.launch → polar.rollout → polar.trainer →
polar.integrations; examples/ and scripts/ stand above the package and may import any of it."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("records", "addon", "processor", "launch", "rollout", "trainer", "integrations")

# What each floor may import of the project besides itself: a package name, or one module of it. Nothing imports
# polar.integrations (it is the top floor); examples/ and scripts/ may import anything.
FLOORS: dict[str, frozenset[str]] = {
    "polar.records": frozenset(),
    "polar.addon": frozenset({"polar.records"}),
    "polar.processor": frozenset({"polar.records"}),
    "polar.launch": frozenset({"polar.records"}),
    "polar.rollout": frozenset({"polar.records", "polar.launch", "polar.processor"}),
    # The trainer runs in its own environment (.venv-train) and drives the rollout as a service: of polar.rollout it
    # imports the request and response of `polar-rollout serve` only.
    "polar.trainer": frozenset({"polar.records", "polar.launch", "polar.processor", "polar.rollout.serve_protocol"}),
    "polar.integrations": frozenset({"polar.records", "polar.launch", "polar.trainer",
                                     "polar.rollout.serve_protocol"}),
}

# The sideways edges that are right, each with why; every other import across a floor is refused.
SIDEWAYS: dict[tuple[str, str], str] = {
    ("polar.launch.proxy", "polar.addon.options"):
        "polar-proxy start refuses a bad --set or --upstream @FILE with one line before a proxy starts (instead of a "
        "mitmdump that fails closed after it started): it reads the gateway's own option table, which has one home, "
        "the addon's, and imports only the standard library (no mitmproxy); a launcher without the addon package "
        "leaves the check to the gateway",
}

# The third-party packages a floor may import (polar.records: the standard library and msgpack; Polars only in
# polar.records.out, which nothing else of polar.records imports, so the addon never loads Polars).
RECORDS_THIRD_PARTY = {"msgpack"}
RECORDS_OUT = "polar.records.out"


# -- the project's imports, read with ast ---------------------------------------------------------------------------

def _module_name(path: pathlib.Path) -> str:
    """`polar.addon.codecs.anthropic` for addon/codecs/anthropic.py; `scripts/proxy`, `examples/trl/grpo` above."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in PACKAGES:
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(["polar"] + parts)
    return "/".join(parts)


def project_files() -> list[pathlib.Path]:
    files = [p for folder in PACKAGES for p in (ROOT / folder).rglob("*.py")]
    files += [p for p in (ROOT / "examples").rglob("*.py")]
    files += [p for p in (ROOT / "scripts").rglob("*") if p.is_file() and (
        p.suffix == ".py" or not p.suffix and p.read_bytes()[:40].startswith(b"#!") and b"python" in
        p.read_bytes().split(b"\n", 1)[0])]
    return sorted(files)


MODULES: dict[str, pathlib.Path] = {_module_name(p): p for p in project_files() if p.parts[len(ROOT.parts)] in PACKAGES}


def _resolve(target: str) -> str:
    """The longest prefix of a dotted name that is a module of the project ("" when it is none of ours)."""
    parts = target.split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return ""


def imports_of(path: pathlib.Path) -> list[tuple[int, str, str]]:
    """(line, the name written, the project module it resolves to or "") for every import in a file."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, _resolve(a.name)) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                found.append((node.lineno, module if sub not in MODULES else sub,
                              sub if sub in MODULES else _resolve(module)))
    return found


def _floor(module: str) -> str:
    if module.startswith("polar."):
        return ".".join(module.split(".")[:2])
    return module.split("/")[0]


def _allowed(src: str, dst: str) -> bool:
    floor, target = _floor(src), _floor(dst)
    if floor in ("scripts", "examples") or floor == target:
        return True
    if (src, dst) in SIDEWAYS:
        return True
    return any(dst == a or dst.startswith(a + ".") for a in FLOORS[floor])


def edges() -> list[tuple[str, int, str]]:
    """(importing module, line, imported module) for every import of one project module by another."""
    return [(_module_name(p), line, dst) for p in project_files() for line, _, dst in imports_of(p) if dst]


def floor_violations() -> list[str]:
    return sorted({f"{src}:{line} imports {dst}" for src, line, dst in edges() if not _allowed(src, dst)})


def circles() -> list[list[str]]:
    """Every strongly connected set of modules (more than one) inside one package, in Tarjan's order."""
    graph: dict[str, set[str]] = {}
    for src, _, dst in edges():
        if src.startswith("polar.") and _floor(src) == _floor(dst) and src != dst:
            graph.setdefault(src, set()).add(dst)
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


# Inside polar.rollout (docs/architecture.md#the-rollout-runner): what each wing may import of the rest of the package
# — "hall" is rollout/*.py, which may import every wing. The sandbox wing stands on nothing else of the rollout; the
# images wing only on the sandbox's registry; the serve on the hall and the sandbox; the agents wing on nothing of
# polar at all but the protocols' standard-library leaf, since it is bound into sandboxes alone.
WINGS: dict[str, frozenset[str]] = {
    "polar.rollout.sandbox": frozenset(),
    "polar.rollout.images": frozenset({"polar.rollout.sandbox"}),
    "polar.rollout.serve": frozenset({"hall", "polar.rollout.sandbox"}),
    "polar.rollout.agents": frozenset(),
}
AGENTS_MAY_IMPORT = frozenset({"polar.records.protocols"})


def _wing(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:3]) if len(parts) > 3 and ".".join(parts[:3]) in WINGS else "hall"


def wing_violations() -> list[str]:
    found = set()
    for src, line, dst in edges():
        if not src.startswith("polar.rollout."):
            continue
        wing = _wing(src)
        if wing == "polar.rollout.agents" and not dst.startswith("polar.rollout.agents") \
                and dst not in AGENTS_MAY_IMPORT:
            found.add(f"{src}:{line} imports {dst}")
        elif wing != "hall" and dst.startswith("polar.rollout.") and _wing(dst) not in (wing, *WINGS[wing]):
            found.add(f"{src}:{line} imports {dst}")
    return sorted(found)


# -- 1. the floors ---------------------------------------------------------------------------------------------------

def test_1_1_every_import_keeps_to_its_floor():
    """Every import of a package module names its own package, a floor below it (FLOORS), or a declared sideways
    edge (SIDEWAYS) — module level and inside functions alike."""
    assert floor_violations() == []


def test_1_2_no_import_circle_inside_a_package():
    assert circles() == []


def test_1_3_the_declared_edges_are_all_used():
    """A declared sideways edge that no import uses any more is removed, with its reason."""
    used = {(src, dst) for src, _, dst in edges()}
    assert sorted(set(SIDEWAYS) - used) == []


def test_1_4_nothing_imports_the_integrations():
    found = [f"{src}:{line}" for src, line, dst in edges()
             if _floor(dst) == "polar.integrations" and _floor(src).startswith("polar.") and
             _floor(src) != "polar.integrations"]
    assert found == []


# -- 2. polar.records stands on the standard library and msgpack ----------------------------------------------------

def test_2_1_polar_records_imports_the_standard_library_and_msgpack():
    """Every module of polar.records but `out` imports only the standard library, msgpack and polar.records; `out`
    adds Polars (OUT's table schemas), and no other module of the package imports it."""
    found = []
    for module, path in sorted(MODULES.items()):
        if _floor(module) != "polar.records":
            continue
        third = RECORDS_THIRD_PARTY | ({"polars"} if module == RECORDS_OUT else set())
        for line, written, dst in imports_of(path):
            top = written.split(".")[0]
            if dst == RECORDS_OUT and module != RECORDS_OUT:
                found.append(f"{module}:{line} imports {dst}")
            elif not dst and top not in sys.stdlib_module_names and top not in third and written != "__future__":
                found.append(f"{module}:{line} imports {written}")
    assert found == []


def test_2_2_the_addon_never_imports_polars_or_the_out_tables():
    found = [f"{m}:{line} {w}" for m, p in sorted(MODULES.items()) if _floor(m) == "polar.addon"
             for line, w, dst in imports_of(p) if w.split(".")[0] == "polars" or dst == RECORDS_OUT]
    assert found == []


def test_2_3_importing_polar_records_loads_no_polars():
    """At run time too: every module of polar.records but `out` imported, Polars is not loaded."""
    modules = [m for m in MODULES if _floor(m) == "polar.records" and m != RECORDS_OUT
               and not m.endswith("__main__")]
    code = "import sys\n" + "".join(f"import {m}\n" for m in sorted(modules)) + \
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('polars', 'numpy', 'pyarrow')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_1_5_docs_architecture_draws_the_same_table():
    """docs/architecture.md's "The floors" drawing names, for each package, the same allowed set as FLOORS."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## The floors"):]
    block = block[block.index("```") + 3:]
    block = block[:block.index("```")]
    drawn: dict[str, frozenset[str]] = {}
    for line in block.splitlines():
        words = line.split()
        if words and words[0].startswith("polar.") and "may import" in line:
            drawn[words[0]] = frozenset(w.strip(",") for w in line.split("may import", 1)[1].split())
        elif words and words[0].startswith("polar.") and "imports nothing of the project" in line:
            drawn[words[0]] = frozenset()
    assert drawn == FLOORS


def test_1_6_the_checks_find_what_they_look_for(monkeypatch):
    """On the tree before issue 38 these checks found four circles (addon's gateway.py and the addons it listed;
    launch's vllm, vllm_args, vllm_pool; rollout's cli and serve; rollout's sample and verify, each closed by an
    import inside a function) and launch/proxy.py's two imports of the addon's option table: the same shapes, made
    up, are found here."""
    made_up = [("polar.rollout.sample", 21, "polar.rollout.verify"),
               ("polar.rollout.verify", 106, "polar.rollout.sample"),
               ("polar.launch.proxy", 172, "polar.addon.gateway"),
               ("polar.trainer.train", 9, "polar.rollout.runner")]
    monkeypatch.setattr(sys.modules[__name__], "edges", lambda: made_up)
    assert circles() == [["polar.rollout.sample", "polar.rollout.verify"]]
    assert floor_violations() == ["polar.launch.proxy:172 imports polar.addon.gateway",
                                  "polar.trainer.train:9 imports polar.rollout.runner"]


def test_1_8_each_rollout_wing_keeps_to_its_side():
    """The wings of polar.rollout import only what WINGS allows them (the hall imports any wing)."""
    assert wing_violations() == []


def test_1_9_the_wing_check_finds_what_it_looks_for(monkeypatch):
    made_up = [("polar.rollout.sandbox.run", 3, "polar.rollout.job"),
               ("polar.rollout.images.environments", 4, "polar.rollout.sandbox.registry"),
               ("polar.rollout.images.sources", 5, "polar.rollout.serve.protocol"),
               ("polar.rollout.agents.sdk_agent", 6, "polar.records.schema"),
               ("polar.rollout.agents.sdk_agent", 7, "polar.records.protocols"),
               ("polar.rollout.runner", 8, "polar.rollout.agents.pyagent")]
    monkeypatch.setattr(sys.modules[__name__], "edges", lambda: made_up)
    assert wing_violations() == ["polar.rollout.agents.sdk_agent:6 imports polar.records.schema",
                                 "polar.rollout.images.sources:5 imports polar.rollout.serve.protocol",
                                 "polar.rollout.sandbox.run:3 imports polar.rollout.job"]


def test_1_7_imports_inside_functions_are_read():
    """`imports_of` reads an import inside a function (and a relative one) as the module it names."""
    path = ROOT / "rollout" / "cli.py"
    found = {dst for _, _, dst in imports_of(path)}
    assert {"polar.rollout.options", "polar.rollout.runner", "polar.rollout.serve.server"} <= found
