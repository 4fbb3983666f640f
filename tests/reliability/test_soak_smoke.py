"""A short run of scripts/soak (the CI smoke version of the load test): no failed call, a record per call."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.gateway import ROOT

pytestmark = pytest.mark.integration


def test_1_1_soak_smoke_has_no_errors_and_records_every_call(tokenizer_dir):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "soak"), "--duration", "10",
                           "--concurrency", "8", "--sample-interval", "1", "--tokenizer", tokenizer_dir, "--json"],
                          capture_output=True, text=True, timeout=90)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["errors"] == 0 and summary["calls"] >= 20
    assert summary["records"] == summary["calls"] and summary["rss_samples"] >= 5
