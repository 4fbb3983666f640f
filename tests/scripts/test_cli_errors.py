"""Every command's argument errors are one line on stderr and exit 2 (issue 37), not argparse's usage block: a
mistyped option is named with the option it most likely meant ("did you mean"), a mistyped choice likewise, and a
required argument missing beside a typo still names the typo. Each command's own parser, called in this process."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def _rollout(argv):
    from polar.rollout import cli

    return cli.main(argv)


def _serve(argv):
    from polar.rollout import cli

    return cli.main(["serve", *argv])


def _process(argv):
    from polar.processor import cli

    return cli.main(argv)


def _proxy(argv):
    from polar.launch import proxy_cli

    return proxy_cli.main(argv)


def _vllm(argv):
    from polar.launch import vllm_cli

    return vllm_cli.main(argv)


def _export(argv):
    from polar.trainer import export

    return export.main(argv)


def _train(argv):
    from polar.trainer import plan

    return plan.parser().parse_args(argv)


CASES = [
    ("polar-rollout", _rollout, ["t", "--agent", "codex", "--out", "r", "--sampels", "2"],
     "--sampels: did you mean --samples?"),
    ("polar-rollout", _rollout, ["t", "--agent", "codex", "--out", "r", "--sandbox", "bwarp"],
     "(did you mean bwrap?)"),
    ("polar-rollout serve", _serve, ["d", "--upstrem", "http://x/v1"], "--upstrem: did you mean --upstream?"),
    ("polar-process", _process, ["flows", "--ouput", "o"], "--ouput: did you mean --out?"),
    ("polar-process", _process, ["flows", "-o", "o", "--tokenzer", "t"], "--tokenzer: did you mean --tokenizer?"),
    ("polar-proxy", _proxy, ["start", "--uptream", "http://x/v1"], "--uptream: did you mean --upstream?"),
    ("polar-proxy", _proxy, ["strat"], "(did you mean start?)"),
    ("polar-vllm", _vllm, ["start", "--tensor-paralel-size", "2"],
     "--tensor-paralel-size: did you mean --tensor-parallel-size?"),
    ("polar-export", _export, ["out", "--format", "verl", "-o", "d", "--rows-per-fle", "3"],
     "--rows-per-fle: did you mean --rows-per-file?"),
    ("polar-train", _train, ["t", "--agent", "a", "--model", "m", "--out", "o", "--stpes", "2"],
     "--stpes: did you mean --steps?"),
]


@pytest.mark.parametrize("prog,main,argv,hint", CASES, ids=[f"{c[0]} {c[2][-2] if len(c[2]) > 1 else c[2][0]}" for c in CASES])
def test_1_a_typo_is_one_line_exit_2_naming_what_was_meant(prog, main, argv, hint, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    # polar-proxy and polar-vllm name themselves as run (scripts/proxy, scripts/vllm in a checkout's process)
    assert prog.split("-", 1)[1] in err[0].split(":")[0] and hint in err[0], err[0]
    assert err[0].endswith("--help)") or prog == "polar-export", err[0]


def test_2_suggestions_come_only_when_something_is_near():
    from polar.records.cliargs import nearest

    assert nearest("--stpes", ["--steps", "--samples"]) == "--steps"
    assert nearest("--sam", ["--samples", "--steps"]) == "--samples"  # a prefix names it
    assert nearest("--zzzzzz", ["--steps", "--samples"]) is None
