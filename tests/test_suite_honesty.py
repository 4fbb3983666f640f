"""The suite cannot hide (issue 28): an AST scan of every test file for the patterns that let a green CI hide a broken
claim. Each rule has a self-test on a snippet that breaks it, so a scan that silently stopped matching fails too.

1. A skip that names something CI installs (scripts/setup: bwrap, docker, chromium, the venvs, vLLM, the models, the
   CLIs, a mount, root) or whose reason is computed (it may say so at run time): such a check goes through
   tests/support/need.py, which fails under CI=true and skips elsewhere with the setup command. `importorskip` of a
   module the venv installs is the same: `need_module`.
2. An `except Exception` (or bare `except`, `BaseException`) whose body only passes: a swallowed check.
3. A time bound in an assert (`elapsed < 2.0`) against a bare number: speed is for benchmarks. A deadline stays only
   as a module constant whose definition says why (a `#` comment on its line or the line above).
4. A sleep directly followed by an assert: a sleep used as synchronisation (poll with a deadline, or wait on an
   event, instead).
5. An environment-gated early `return` in a test (`if not os.environ.get(...): return`, or on a tool or path being
   there): the test passes having checked nothing. Skip it through need() or a listed skip instead.
6. A skip gated on an environment variable (an opt-in: `skipif(os.environ.get("X") != "1")`, its reason naming
   nothing CI installs) that tests/known-skips.txt does not list with `env-not:` on that variable: CI would pass it
   uncounted.
7. A data-dependent skip: a `pytest.skip` after the test has asserted something, so whether the test counts depends
   on what the product answered this run (make the input deterministic: a seed, a scripted answer).
8. A speed bound behind a commented constant: a measured duration bounded by a module constant that the test gives
   to nothing (no timeout, delay or fault is set from it) outside a polling loop. A comment does not make a speed
   claim a deadline; such a constant is an ordering only when the code under test is configured with it.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re
import textwrap

import pytest

from tests.support import known_skips

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# The helper that owns the CI-or-skip rule, and this scan (its self-tests hold the patterns on purpose).
EXEMPT = {"tests/support/need.py", "tests/test_suite_honesty.py"}
# What CI installs, as a skip reason would name it.
CI_INSTALLED = re.compile(
    r"scripts/setup|apt-get|bwrap|bubblewrap|docker|chromium|playwright|\bvenv\b|\.venv|vllm|not built|tiny model"
    r"|\bmount|tmpfs|needs root|\binstall|polar-train|python3-pytest|\bray\b", re.IGNORECASE)
TIME_CALLS = {"monotonic", "time", "perf_counter", "monotonic_ns", "perf_counter_ns"}
DURATION_NAME = re.compile(r"(^|_)(elapsed|waited|took|duration|latency|wall|seconds|secs|dt)(_s)?$|_s$")
SLEEPS = {("time", "sleep"), ("asyncio", "sleep")}
# A value built by filtering (records started after a moment) is no duration, though it reads a clock value.
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
ENV_READS = {"os.environ.get", "os.getenv", "environ.get", "getenv"}
# What a test may find missing on a machine: a check on one of these gates the test on its environment.
PRESENCE = {"shutil.which", "os.path.exists", "os.path.isdir", "os.path.isfile", "os.access",
            "importlib.util.find_spec"}
NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@functools.lru_cache(maxsize=1)
def _files() -> tuple[tuple[str, str], ...]:
    out = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in EXEMPT and "/fixtures/" not in rel:
            out.append((rel, path.read_text()))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _parse(source: str) -> ast.Module:
    return ast.parse(source)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _literal_text(node: ast.AST | None) -> str | None:
    """The text of a literal reason (an f-string's literal parts), None when the reason is computed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def _skip_reason(call: ast.Call) -> tuple[str, ast.AST | None] | None:
    """(kind, reason node) for pytest.skip / pytest.mark.skip / skipif / importorskip, else None."""
    name = _dotted(call.func)
    kw = {k.arg: k.value for k in call.keywords}
    if name in ("pytest.skip", "skip"):
        return "skip", call.args[0] if call.args else kw.get("reason", kw.get("msg"))
    if name in ("pytest.mark.skip", "pytest.mark.skipif"):
        return name.rsplit(".", 1)[1], kw.get("reason", call.args[0] if call.args and name.endswith("skip") else None)
    if name == "pytest.importorskip":
        return "importorskip", None
    return None


def scan_skips(rel: str, source: str) -> list[str]:
    out = []
    for node in ast.walk(_parse(source)):
        if not isinstance(node, ast.Call):
            continue
        found = _skip_reason(node)
        if found is None:
            continue
        kind, reason = found
        if kind == "importorskip":
            out.append(f"{rel}:{node.lineno} importorskip of a module the venv installs: use need_module()")
            continue
        text = _literal_text(reason)
        if text is None:
            out.append(f"{rel}:{node.lineno} {kind} with a computed reason: use tests.support.need.need()")
        elif CI_INSTALLED.search(text):
            out.append(f"{rel}:{node.lineno} {kind} names something CI installs ({text!r}): use need()")
    return out


def _swallows(handler: ast.ExceptHandler) -> bool:
    broad = {"Exception", "BaseException"}
    t = handler.type
    names = [] if t is None else [_dotted(e) for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    if t is not None and not broad & set(names):
        return False
    return all(isinstance(s, (ast.Pass, ast.Continue))
               or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)) for s in handler.body)


def scan_swallowed(rel: str, source: str) -> list[str]:
    return [f"{rel}:{n.lineno} a broad except that only passes: assert the outcome instead"
            for n in ast.walk(_parse(source)) if isinstance(n, ast.ExceptHandler) and _swallows(n)]


def _is_clock(call: ast.AST) -> bool:
    """time.monotonic() and friends, a bare monotonic(), or an event loop's loop.time()."""
    if not isinstance(call, ast.Call):
        return False
    name = _dotted(call.func)
    head, _, attr = name.rpartition(".")
    return attr in TIME_CALLS and (head in ("", "time") or "loop" in head) and name != "time"


def _has_time_call(node: ast.AST) -> bool:
    return any(_is_clock(n) for n in ast.walk(node))


def _timed_names(func: ast.AST) -> dict[str, list[ast.AST]]:
    """Names assigned, in this function, from an expression that reads a clock (or from one of those names), with
    the values assigned to them."""
    names: dict[str, list[ast.AST]] = {}
    assigns = [n for n in ast.walk(func) if isinstance(n, ast.Assign) and not isinstance(n.value, COMPREHENSIONS)]
    for _ in range(3):  # a difference of differences: a few passes reach a fixed point
        for n in assigns:
            if _has_time_call(n.value) or _reads(n.value, set(names)):
                for t in n.targets:
                    for x in ast.walk(t):
                        if isinstance(x, ast.Name) and n.value not in names.setdefault(x.id, []):
                            names[x.id].append(n.value)
    return names


def _reads(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _is_duration(node: ast.AST, timed: set[str]) -> bool:
    if _has_time_call(node) or _reads(node, timed):
        return True
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and DURATION_NAME.search(n.id) and not n.id.isupper():
            return True
        if isinstance(n, ast.Attribute) and DURATION_NAME.search(n.attr):
            return True
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str) \
                and DURATION_NAME.search(n.slice.value):
            return True
    return False


def _reasoned_constants(tree: ast.Module, lines: list[str]) -> set[str]:
    """Module-level UPPER_CASE constants whose definition carries a comment (its line, or the line above)."""
    out = set()
    for n in tree.body:
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            line, above = lines[n.lineno - 1], lines[n.lineno - 2] if n.lineno > 1 else ""
            if "#" in line or above.lstrip().startswith("#"):
                out |= {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()}
    return out


def _has_number(node: ast.AST) -> bool:
    """A bound with a number in it; a bare 0 is none (`seconds > 0`: the clock moved, no speed claimed), nor are
    round()'s digits."""
    if isinstance(node, ast.Constant) and node.value == 0:
        return False
    if isinstance(node, ast.Call) and _dotted(node.func) == "round":
        return any(_has_number(a) for a in node.args[:1])
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    return any(_has_number(c) for c in ast.iter_child_nodes(node))


def scan_time_bounds(rel: str, source: str) -> list[str]:
    tree = _parse(source)
    reasoned = _reasoned_constants(tree, source.splitlines())
    out = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        asserts = [a for a in ast.walk(func) if isinstance(a, ast.Assert)]
        if not asserts:
            continue
        timed = _timed_names(func)
        for a in asserts:
            for cmp in (n for n in ast.walk(a.test) if isinstance(n, ast.Compare)):
                if not all(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in cmp.ops):
                    continue
                sides = [cmp.left, *cmp.comparators]
                if not any(_is_duration(s, timed) for s in sides):
                    continue
                # the bounds: the sides that are no duration, and what a deadline name was computed from
                bounds = [s for s in sides if not _is_duration(s, timed)]
                bounds += [v for s in sides if isinstance(s, ast.Name) for v in timed.get(s.id, [])]
                if any(_has_number(b) and not _reads(b, reasoned) for b in bounds):
                    out.append(f"{rel}:{a.lineno} a time bound without a stated reason: "
                               f"{ast.unparse(cmp)} (an ordering, or a commented module constant)")
    return out


def scan_sleep_then_assert(rel: str, source: str) -> list[str]:
    out = []
    for node in ast.walk(_parse(source)):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for a, b in zip(block, block[1:]):
                call = a.value.value if isinstance(a, ast.Expr) and isinstance(a.value, ast.Await) else \
                    a.value if isinstance(a, ast.Expr) else None
                if isinstance(call, ast.Call) and tuple(_dotted(call.func).split(".")[-2:]) in SLEEPS \
                        and isinstance(b, ast.Assert):
                    out.append(f"{rel}:{a.lineno} a sleep, then an assert: wait on an event or poll with a deadline")
    return out


def _own(node: ast.AST):
    """The nodes of a function's own body: nested functions, lambdas and classes left out."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, NESTED):
            yield child
            yield from _own(child)


def _tests(tree: ast.Module):
    return [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and f.name.startswith("test")]


def _is_skip(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and _dotted(node.func) in ("pytest.skip", "skip")


def _env_vars(node: ast.AST, env_names: dict[str, set[str]]) -> set[str]:
    """The environment variables an expression reads: os.environ.get("X"), os.getenv("X"), os.environ["X"],
    "X" in os.environ, or a module constant assigned from such a read."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and _dotted(n.func) in ENV_READS and n.args and isinstance(n.args[0], ast.Constant):
            out.add(n.args[0].value)
        elif isinstance(n, ast.Subscript) and _dotted(n.value) in ("os.environ", "environ") \
                and isinstance(n.slice, ast.Constant):
            out.add(n.slice.value)
        elif isinstance(n, ast.Compare) and isinstance(n.left, ast.Constant) \
                and any(_dotted(c) in ("os.environ", "environ") for c in n.comparators):
            out.add(n.left.value)
        elif isinstance(n, ast.Name) and n.id in env_names:
            out |= env_names[n.id]
    return out


def _module_env_names(tree: ast.Module) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and (found := _env_vars(n.value, names)):
            names.update({t.id: found for t in n.targets if isinstance(t, ast.Name)})
    return names


def scan_env_returns(rel: str, source: str) -> list[str]:
    tree = _parse(source)
    env = _module_env_names(tree)
    out = []
    for func in _tests(tree):
        for n in _own(func):
            if not isinstance(n, ast.If):
                continue
            gated = _env_vars(n.test, env) or any(isinstance(c, ast.Call) and _dotted(c.func) in PRESENCE
                                                  for c in ast.walk(n.test))
            if gated and any(isinstance(r, ast.Return) for b in n.body + n.orelse for r in [b, *_own(b)]):
                out.append(f"{rel}:{n.lineno} an early return gated on the environment ({ast.unparse(n.test)}): the "
                           f"test passes having checked nothing; need() or a listed skip instead")
    return out


def _listed(rel: str, func: str, names: set[str], entries: list) -> bool:
    """tests/known-skips.txt lists the test (any of its parameters) with `env-not:` on one of these variables."""
    for e in entries:
        path, _, rest = e.test.partition("::")
        kind, _, arg = e.condition.partition(":")
        if path == rel and re.split(r"[\[*]", rest.rsplit("::", 1)[-1])[0] == func and kind == "env-not" \
                and arg.partition("=")[0] in names:
            return True
    return False


def scan_env_skips(rel: str, source: str, listed: list | None = None) -> list[str]:
    entries = known_skips.load() if listed is None else listed
    tree = _parse(source)
    env = _module_env_names(tree)
    gates = []  # (line, function, variables)
    for func in (f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for d in func.decorator_list:
            if isinstance(d, ast.Call) and _dotted(d.func) == "pytest.mark.skipif":
                cond = d.args[0] if d.args else next((k.value for k in d.keywords if k.arg == "condition"), None)
                gates.append((d.lineno, func.name, _env_vars(cond, env) if cond is not None else set()))
        for n in _own(func):
            if isinstance(n, ast.If) and (names := _env_vars(n.test, env)):
                gates += [(c.lineno, func.name, names) for b in n.body + n.orelse for c in [b, *_own(b)]
                          if _is_skip(c)]
    return [f"{rel}:{line} a skip gated on {', '.join(sorted(names))}, which tests/known-skips.txt does not list "
            f"for {func} with env-not:{sorted(names)[0]}=…: CI would pass it uncounted"
            for line, func, names in gates if names and not _listed(rel, func, names, entries)]


def scan_data_skips(rel: str, source: str) -> list[str]:
    out = []
    for func in _tests(_parse(source)):
        own = list(_own(func))
        first_assert = min((a.lineno for a in own if isinstance(a, ast.Assert)), default=None)
        out += [f"{rel}:{c.lineno} a skip after the test has asserted: whether it counts depends on what this run "
                f"answered (make the input deterministic)"
                for c in own if _is_skip(c) and first_assert is not None and c.lineno > first_assert]
    return out


def _given_constants(tree: ast.Module) -> set[str]:
    """Names read outside asserts and outside a clock's arithmetic: given to the code under test (a timeout, a delay,
    a fault), so that a bound on one is an ordering against a known delay."""
    out = set()
    for stmt in (n for n in ast.walk(tree) if isinstance(n, ast.stmt) and not isinstance(n, ast.Assert)):
        for part in ast.iter_child_nodes(stmt):
            if not isinstance(part, (ast.stmt, ast.excepthandler, ast.match_case)) and not _has_time_call(part):
                out |= {n.id for n in ast.walk(part) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return out


def scan_speed_bounds(rel: str, source: str) -> list[str]:
    tree = _parse(source)
    speed = _reasoned_constants(tree, source.splitlines()) - _given_constants(tree)
    out = []
    for func in (f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))):
        polled = {a for loop in _own(func) if isinstance(loop, (ast.While, ast.For)) for a in ast.walk(loop)}
        timed = _timed_names(func)
        for a in (a for a in _own(func) if isinstance(a, ast.Assert) and a not in polled):
            for cmp in (n for n in ast.walk(a.test) if isinstance(n, ast.Compare)):
                sides = [cmp.left, *cmp.comparators]
                if not any(_is_duration(s, timed) for s in sides):
                    continue
                bounds = [s for s in sides if not _is_duration(s, timed)]
                bounds += [v for s in sides if isinstance(s, ast.Name) for v in timed.get(s.id, [])]
                if any(_reads(b, speed) for b in bounds):
                    out.append(f"{rel}:{a.lineno} a speed bound behind a commented constant: {ast.unparse(cmp)} "
                               f"(the constant configures nothing; assert the behaviour, or benchmark the speed)")
    return out


SCANS = {"skips": scan_skips, "swallowed": scan_swallowed, "time_bounds": scan_time_bounds,
         "sleep_then_assert": scan_sleep_then_assert, "env_returns": scan_env_returns, "env_skips": scan_env_skips,
         "data_skips": scan_data_skips, "speed_bounds": scan_speed_bounds}


@pytest.mark.parametrize("rule", list(SCANS))
def test_1_no_test_file_breaks_the_rule(rule):
    found = [hit for rel, source in _files() for hit in SCANS[rule](rel, source)]
    assert found == [], "\n".join(found)


# -- the scans find what they are for -------------------------------------------------------------------------------

BAD = {
    "skips": '''
        import pytest
        @pytest.fixture
        def dockerd():
            try:
                yield start()
            except Unavailable as e:
                pytest.skip(str(e))
        def test_a():
            pytest.skip("bwrap is not installed (scripts/setup --system)")
        def test_b():
            ray = pytest.importorskip("ray")
        @pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="chromium is not installed")
        def test_c():
            pass
    ''',
    "swallowed": '''
        def test_a(client):
            try:
                client.call()
            except Exception:  # noqa: BLE001
                pass
            try:
                client.call()
            except:
                ...
    ''',
    "time_bounds": '''
        import time
        def test_a(http):
            t0 = time.monotonic()
            http.get("/")
            assert time.monotonic() - t0 < 2.0
            elapsed = time.monotonic() - t0
            assert elapsed < 0.9
            assert 1.4 <= result.wall_s < 15
            deadline = time.monotonic() + 0.5
            assert time.monotonic() < deadline
    ''',
    "sleep_then_assert": '''
        import time
        def test_a():
            kill()
            time.sleep(0.2)
            assert gone()
    ''',
    "env_returns": '''
        import os, shutil
        def test_a():
            if not os.environ.get("POLAR_TEST_SLOW"):
                return
            assert run()
        def test_b():
            if shutil.which("bwrap") is None:
                return
            assert run()
    ''',
    "env_skips": '''
        import os
        import pytest
        OPT_IN = os.environ.get("POLAR_TEST_OPT_IN") == "1"
        @pytest.mark.skipif(os.environ.get("POLAR_TEST_OPT_IN") != "1", reason="POLAR_TEST_OPT_IN=1 runs it")
        def test_a():
            assert run()
        def test_b(harness):
            if harness == "slow" and not OPT_IN:
                pytest.skip("kept out of the default run for its time")
            assert run()
    ''',
    "data_skips": '''
        import pytest
        def test_a(model):
            answer = model.ask()
            assert answer is not None
            if not answer:
                pytest.skip("the random model's answer was empty this run")
            assert check(answer)
    ''',
    "speed_bounds": '''
        import time
        # a no-op reads a few files (~0.2 s); 1 s is the promise, with room for a loaded machine
        NOOP_BOUND_S = 1.0
        def test_a():
            t0 = time.monotonic()
            build()
            elapsed = time.monotonic() - t0
            assert elapsed < NOOP_BOUND_S
            assert time.monotonic() - t0 < NOOP_BOUND_S
    ''',
}
GOOD = {
    "skips": '''
        import pytest
        def test_a():
            pytest.skip("../shared/captures is not present")
            pytest.skip(f"{name}: POLAR_TEST_ALL_CLIS=1 runs it too")
    ''',
    "swallowed": '''
        def test_a(client):
            try:
                client.call()
            except OSError:
                pass
            try:
                client.call()
            except Exception as e:
                errors.append(e)
    ''',
    "time_bounds": '''
        import time
        # why 20 s: a generous deadline for a 1.5 s timeout on a loaded 2-core machine
        DEADLINE_S = 20.0
        def test_a(result):
            t0 = time.monotonic()
            assert time.monotonic() - t0 < DEADLINE_S
            assert result.wall_s >= result.timeout  # an ordering
            assert n_tokens < 200
            deadline = time.monotonic() + DEADLINE_S
            assert time.monotonic() < deadline
            took = round(time.monotonic() - t0, 2)
            assert took > 0
    ''',
    "sleep_then_assert": '''
        import time
        def test_a():
            while not done():
                time.sleep(0.1)
            assert done()
    ''',
    "env_returns": '''
        import os
        def test_a():
            slow = os.environ.get("POLAR_TEST_SLOW", "1.5")
            if not slow:
                slow = "1.5"
            assert run(slow)
        def test_b():
            def helper():
                if not os.environ.get("X"):
                    return None
                return 1
            assert helper() in (None, 1)
    ''',
    "env_skips": '''
        import os
        import pytest
        OPT_IN = os.environ.get("POLAR_TEST_OPT_IN") == "1"
        @pytest.mark.skipif(os.environ.get("POLAR_TEST_OPT_IN") != "1", reason="POLAR_TEST_OPT_IN=1 runs it")
        def test_a():
            assert run()
        def test_b(harness):
            if harness == "slow" and not OPT_IN:
                pytest.skip("kept out of the default run for its time")
            assert run()
    ''',
    "data_skips": '''
        import pytest
        def test_a(captures):
            if not captures:
                pytest.skip("no captures")
            answer = ask(captures, seed=7)
            assert answer, "seed 7 draws a non-empty answer on this model"
    ''',
    "speed_bounds": '''
        import time
        # the agent's own timeout; a run that ends before it was ended by the Ctrl-C
        HANG_TIMEOUT_S = 120
        # until the child has exec'd
        EXEC_WAIT_S = 10
        def test_a():
            t0 = time.monotonic()
            run(agent_timeout=HANG_TIMEOUT_S)
            assert time.monotonic() - t0 < HANG_TIMEOUT_S
            deadline = time.monotonic() + EXEC_WAIT_S
            while not execd():
                assert time.monotonic() < deadline
    ''',
}
EXPECTED_HITS = {"skips": 4, "swallowed": 2, "time_bounds": 4, "sleep_then_assert": 1, "env_returns": 2,
                 "env_skips": 2, "data_skips": 1, "speed_bounds": 2}
# What the env_skips snippets are checked against: the good snippet's opt-ins are listed, the bad one's are not.
LISTED = known_skips.parse("good.py::test_a | env-not:POLAR_TEST_OPT_IN=1 | opt-in\n"
                           "good.py::test_b[slow] | env-not:POLAR_TEST_OPT_IN=1 | opt-in\n"
                           "bad.py::test_a | env-not:POLAR_TEST_OTHER=1 | another variable\n")


@pytest.mark.parametrize("rule", list(SCANS))
def test_2_each_scan_finds_its_pattern_and_passes_the_honest_form(rule):
    kwargs = {"listed": LISTED} if rule == "env_skips" else {}
    bad = SCANS[rule]("bad.py", textwrap.dedent(BAD[rule]), **kwargs)
    assert len(bad) == EXPECTED_HITS[rule], bad
    assert SCANS[rule]("good.py", textwrap.dedent(GOOD[rule]), **kwargs) == []


def test_3_need_fails_under_ci_and_skips_naming_the_setup_elsewhere(monkeypatch):
    from tests.support.need import need

    need(None)  # there and working: nothing
    need("")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"CI installs this \(scripts/setup --system\), but: no bwrap"):
        need("no bwrap", setup="scripts/setup --system")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match=r"no bwrap \(run scripts/setup --system\)"):
        need("no bwrap", setup="scripts/setup --system")
    monkeypatch.setenv("CI", "1")  # tests/e2e's CI=1 for the CLIs it starts is not CI's CI=true
    with pytest.raises(pytest.skip.Exception):
        need("no bwrap")
