"""scripts/run-agent's argv per harness (issue 13 item 9): turn 1, a second turn through each CLI's own continue flag
(`--continue`), extra CLI arguments after a second `--` passed verbatim, and the hint when the prompt is missing.
No CLI runs: `build` is checked directly."""

from __future__ import annotations

import argparse
import os

import pytest

from tests.support.scripts import load_script

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ra():
    return load_script("scripts/run-agent", "run_agent_under_test")


def argv_for(ra, harness, *, cont=False, extra=(), provider=None, model=None, env=None):
    args = argparse.Namespace(harness=harness, provider=provider, model=model, keep_nonessential=False,
                              prompt=["do", "it"], continue_session=cont, extra=list(extra))
    argv, _ = ra.build(args, dict(env or {}), "http://s:x@127.0.0.1:1", "/ca.pem", "/bundle.pem", "s")
    return argv


CLAUDE_PERMS = (["--allowedTools", "Bash,Edit,Write,Read,Glob,Grep,NotebookEdit,WebFetch,TodoWrite"]
                if os.geteuid() == 0 else ["--dangerously-skip-permissions"])
CODEX_FLAGS = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
# harness, provider: (turn 1, turn 2 with --continue) — turn 2 uses the CLI's own flag for the newest conversation
# of this HOME + working directory, the same argv scripts/bench_exact_clis drove turns 2-3 with.
TABLE = {
    ("claude-code", None): (["-p", "do it", *CLAUDE_PERMS], ["--continue", "-p", "do it", *CLAUDE_PERMS]),
    ("codex", None): (["exec", *CODEX_FLAGS, "--color", "never", "do it"],
                      ["exec", "resume", "--last", *CODEX_FLAGS, "do it"]),  # resume takes no --color
    ("gemini-cli", None): (["--yolo", "-p", "do it"], ["--resume", "latest", "--yolo", "-p", "do it"]),
    ("qwen-code", None): (["--auth-type", "openai", "--yolo", "-p", "do it"],
                          ["--continue", "--auth-type", "openai", "--yolo", "-p", "do it"]),
    ("pi", None): (["--provider", "anthropic", "-p", "do it"], ["--continue", "--provider", "anthropic", "-p", "do it"]),
    ("pi", "openai"): (["--provider", "openai", "-p", "do it"], ["--continue", "--provider", "openai", "-p", "do it"]),
}


@pytest.mark.parametrize("harness,provider", list(TABLE), ids=[f"{h}-{p or 'default'}" for h, p in TABLE])
def test_1_1_first_and_continued_turn_argv(ra, harness, provider):
    first, second = TABLE[harness, provider]
    assert argv_for(ra, harness, provider=provider) == first
    assert argv_for(ra, harness, provider=provider, cont=True) == second


@pytest.mark.parametrize("harness", ["claude-code", "codex", "gemini-cli", "qwen-code", "pi"])
def test_1_2_extra_arguments_go_last_and_verbatim(ra, harness):
    extra = ["--extra-flag", "a value with spaces", "--", "-x"]
    for cont in (False, True):
        plain = argv_for(ra, harness, cont=cont, model="m")
        assert argv_for(ra, harness, cont=cont, model="m", extra=extra) == plain + extra


def test_1_3_main_splits_prompt_and_extra_at_the_separators(ra, monkeypatch):
    """Through main(): the prompt between the first and second `--`, everything after the second to the CLI."""
    seen = {}

    def fake_build(args, *rest):
        seen.update(prompt=args.prompt, extra=args.extra, cont=args.continue_session)
        raise SystemExit(0)

    monkeypatch.setattr(ra, "build", fake_build)
    monkeypatch.setattr(ra, "find_binary", lambda name: "/bin/true")
    monkeypatch.setattr(ra, "combined_bundle", lambda ca_pem: ca_pem)  # writes under .cache/run otherwise
    with pytest.raises(SystemExit):
        ra.main(["codex", "--continue", "--proxy", "127.0.0.1:1", "--ca", __file__, "--", "fix", "it", "--",
                 "-c", "x=1"])
    assert seen == {"prompt": ["fix", "it"], "extra": ["-c", "x=1"], "cont": True}


@pytest.mark.parametrize("argv", [["codex", "fix the test"], ["codex"], ["codex", "--"], ["codex", "--", " "],
                                  ["pi", "--yolo"]])
def test_1_4_a_missing_prompt_says_where_it_goes(ra, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        ra.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "the prompt goes after `--`" in err and "Traceback" not in err
