"""A served run's RUN/flows (rollout/serve/runflows.py): hard links to the serve's flow files written since the run began,
one per file, their names kept across the proxy's rename.

1.x  what is linked: files written since the run began, not older ones; a rename does not link a file twice
"""

from __future__ import annotations

import os
import time

import pytest

from polar import records as rec
from polar.rollout.serve.runflows import SLACK_S, link_flows

pytestmark = pytest.mark.unit


def _write(writer: rec.FlowWriter, session: str) -> str:
    return writer.write(rec.new_record(id=rec.uuid7(), session=session))


def _sessions(paths: list[str]) -> list[str]:
    return sorted(r["session"] for _, _, r in rec.iter_files(rec.expand_inputs(paths)))


def test_1_1_files_written_before_the_run_are_left_out_and_a_renamed_file_is_linked_once(tmp_path):
    flows, run_flows = tmp_path / "flows", tmp_path / "run" / "flows"
    old = rec.FlowWriter(str(flows), min_free_mb=0)
    old_path = _write(old, "earlier/t/0/0")
    old.close()
    began = time.time()
    os.utime(rec.closed_name(old_path), (began - 10 * SLACK_S, began - 10 * SLACK_S))  # closed long before
    writer = rec.FlowWriter(str(flows), min_free_mb=0)
    _write(writer, "run/t/0/0")
    assert _sessions(link_flows(str(flows), run_flows, began)) == ["run/t/0/0"]
    writer.close()  # the proxy renames its file (rotation, or its stop): the link keeps its `.open` name
    writer = rec.FlowWriter(str(flows), min_free_mb=0)
    _write(writer, "run/t/1/0")
    inputs = link_flows(str(flows), run_flows, began)  # a resumed run links again: the renamed file is not new
    assert inputs == [str(run_flows)] and len(list(run_flows.iterdir())) == 2
    assert _sessions(inputs) == ["run/t/0/0", "run/t/1/0"]
    writer.close()
