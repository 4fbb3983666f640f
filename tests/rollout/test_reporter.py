"""What a run tells its user goes through a Reporter (rollout/reporter.py), and a `polar-rollout serve` request
reaches its Runner as Options built from the request's fields (rollout/serve/server.py), never as a command line
turned back into one. No sockets."""

from __future__ import annotations

import json
import io
import sys

import pytest

from polar.rollout.common import UsageError
from polar.rollout.reporter import Reporter
from polar.rollout.serve import protocol as sp
from polar.rollout.serve import server

pytestmark = pytest.mark.unit


def test_1_1_a_reporter_keeps_errors_as_data_and_writes_the_users_lines():
    err, out = io.StringIO(), io.StringIO()
    report = Reporter(err=err, out=out)
    report.note("run r: 2 sample(s)")
    report.warn("torn line")
    report.error("--samples must be at least 1 (got 0)")
    report.summary(["polar-rollout: 2 samples", "  files     x"])
    assert report.errors == ["--samples must be at least 1 (got 0)"]
    assert err.getvalue().splitlines() == ["polar-rollout: run r: 2 sample(s)", "polar-rollout: warning: torn line",
                                           "polar-rollout: error: --samples must be at least 1 (got 0)"]
    assert out.getvalue() == "polar-rollout: 2 samples\n  files     x\n"


def test_1_2_the_command_lines_reporter_writes_to_the_streams_of_the_moment(capsys):
    """Without streams of its own it looks sys.stderr and sys.stdout up at each write (what the CLI's tests
    capture, and what a serve's own lines use)."""
    Reporter().error("x")
    assert capsys.readouterr().err == "polar-rollout: error: x\n"


def _serve(sandbox: str = "bwrap") -> server.Serve:
    args = server.parser().parse_args(["/nonexistent/serve", "--sandbox", sandbox, "--parallel", "2", "--npm-dir",
                                       "/npm", "--confdir", "/conf"])  # every serve option, its defaults as a start's
    return server.Serve(args)


def test_2_1_a_request_becomes_options_from_its_fields():
    req = sp.RolloutRequest(out="/runs/a", tasks=("t1", "t2"), agent="python:m:f", samples=3, run_id="r",
                            resume=True, agent_timeout=30.5, process_opt=("--tokenizer=M",), retry_infra=2)
    o = server._request_options(req, _serve())
    assert (o.tasks, o.agent, o.out, o.samples, o.run_id, o.resume, o.agent_timeout, o.process_opt, o.retry_infra) \
        == (["t1", "t2"], "python:m:f", "/runs/a", 3, "r", True, 30.5, ["--tokenizer=M"], 2)
    assert (o.sandbox, o.npm_dir, o.confdir, o.progress) == ("bwrap", "/npm", "/conf", False)


def test_2_2_extra_args_are_parsed_over_the_fields_and_the_serves_own_are_refused():
    req = sp.RolloutRequest(out="/runs/a", tasks=("t",), agent="python:m:f", samples=3, process_opt=("--a=1",),
                            extra_args=("--samples", "5", "--process-opt=--b=2", "--warm-agents"))
    o = server._request_options(req, _serve())
    assert (o.samples, o.process_opt, o.warm_agents) == (5, ["--a=1", "--b=2"], True)  # a flag there wins
    with pytest.raises(UsageError, match="--upstream: the serve's, not a run's"):
        server._request_options(sp.RolloutRequest(out="/o", extra_args=("--upstream", "http://127.0.0.1:9/v1")),
                                _serve())
    with pytest.raises(UsageError, match="must be a positive integer, got 0"):
        server._request_options(sp.RolloutRequest(out="/o", extra_args=("--samples", "0")), _serve())


def test_2_3_a_served_run_never_swaps_the_process_streams(monkeypatch, tmp_path):
    """The serve's request thread hands its Runner a Reporter on the run's log: sys.stderr stays the serve's."""
    seen = []

    class Spy(server.ServedRunner):
        def run(self) -> int:
            seen.append((sys.stderr, self.report.err))
            self.report.error("refused on purpose")
            return 2

    monkeypatch.setattr(server, "ServedRunner", Spy)
    serve = _serve()
    serve.dir = tmp_path
    req = sp.RolloutRequest(out=str(tmp_path / "run"), tasks=("t",), agent="python:m:f",
                            log=str(tmp_path / "run.log"))
    (tmp_path / sp.REQUESTS).mkdir()
    (tmp_path / sp.RESPONSES).mkdir()
    sp.write_json_atomic(sp.request_path(tmp_path, "a"), req.to_json())
    before = sys.stderr
    serve._serve_one("a")
    got = sp.RolloutResponse.from_json(json.loads(sp.response_path(tmp_path, "a").read_text()))
    assert seen and seen[0][0] is before and seen[0][1] is not before
    assert (got.exit, got.error) == (2, "refused on purpose")
    assert "polar-rollout: error: refused on purpose" in (tmp_path / "run.log").read_text()
