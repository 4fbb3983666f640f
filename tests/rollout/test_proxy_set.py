"""polar-rollout --proxy-set with a polar_* name no option has (issue 22): one line naming it and the nearest real
one, exit 2, before any sample runs (the runner's proxy start refuses it up front)."""

from __future__ import annotations

import pytest

from tests.rollout.rollout_support import AGENT, make_task

pytestmark = pytest.mark.unit


def test_1_1_an_unknown_proxy_option_is_one_line_and_exit_2(tmp_path, capsys):
    from polar.rollout import cli

    make_task(tmp_path / "tasks", "ok", "solve")
    code = cli.main([str(tmp_path / "tasks"), "--out", str(tmp_path / "run"), "--sandbox", "none", "--upstream",
                     "http://127.0.0.1:9/v1", "--agent", AGENT, "--proxy-set", "polar_exct=true"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "unknown option polar_exct (did you mean polar_exact?)" in err
