"""Scenarios for trainer/report.py: polar-train's RUN/report.html from train.jsonl's lines (no model, no server).

1  every chart is drawn with polar.processor.figures' line_chart (one curve implementation for both reports)
2  a flat series gets an axis through zero (0…2v, or 0…1 at 0), never −0.5…0.5
3  the page is written atomically and opens from disk (no script)
4  the learning knobs (issue 41): the low/high clip shares and the entropy coefficient drawn and tabled; the plan's
   clip-high, entropy control, advantage norm and normalisation stated
"""

from __future__ import annotations

import re

import pytest

from polar.processor.figures import line_chart
from polar.trainer.report import CHARTS, render, write_report

pytestmark = pytest.mark.unit

LINES = [{"step": s, "weight_version": f"step-{s - 1:04d}", "reward_mean": r, "reward_std": 0.1,
          "groups": 2, "groups_without_spread": 0, "updates": 4, "kl_initial": 0.25, "loss": 0.5 / s,
          "reward_mean_per_group": {f"run-step-{s:04d}/vowel-share": r, f"run-step-{s:04d}/hello-file": 0.0}}
         for s, r in [(1, 0.2), (2, 0.35), (3, 0.5)]]


def figure_of(page: str, title: str) -> str:
    return re.search(rf"<figure><figcaption>{re.escape(title)}</figcaption>.*?</figure>", page, flags=re.DOTALL)[0]


def y_labels(fig: str) -> list[str]:
    return re.findall(r'text-anchor="end">([^<]*)</text>', fig)


def test_1_every_chart_is_the_shared_line_chart(tmp_path):
    page = render(tmp_path, LINES)
    reward = figure_of(page, "mean reward per step")
    series = [("all samples", [(ln["step"], ln["reward_mean"]) for ln in LINES]),
              ("mean + std", [(ln["step"], ln["reward_mean"] + 0.1) for ln in LINES]),
              ("mean − std", [(ln["step"], ln["reward_mean"] - 0.1) for ln in LINES]),
              ("held-out tasks (no update)", [])]
    assert reward == line_chart("mean reward per step", series)
    per_task = figure_of(page, "mean reward per step, per task")
    assert per_task.count("<polyline") == 2
    assert re.findall(r"</span> ([\w-]+)", per_task) == ["hello-file", "vowel-share"]
    assert page.count("<figure>") == len(CHARTS) + 1 and "step 3: 0.166667" in figure_of(page, "GRPO loss")
    assert "no value yet" in figure_of(page, "policy entropy on trainable tokens (nats)")


@pytest.mark.parametrize("title,labels", [
    ("optimizer updates per step", ["8", "0"]),                  # always 4: 0…8, the line in the middle
    ("KL to the initial policy (k3, nats/token)", ["0.5", "0"]),  # always 0.25: 0…0.5
])
def test_2_a_flat_series_gets_an_axis_through_zero(tmp_path, title, labels):
    fig = figure_of(render(tmp_path, LINES), title)
    assert y_labels(fig) == labels and "-0.5" not in fig


def test_2b_a_series_that_stays_zero_sits_on_its_axis(tmp_path):
    lines = [{"step": s, "groups_without_spread": 0} for s in (1, 2, 3)]
    fig = figure_of(render(tmp_path, lines), "groups without a reward spread")
    assert y_labels(fig) == ["1", "0"]
    assert {float(y) for y in re.findall(r'<circle cx="[^"]*" cy="([^"]*)"', fig)} == {220 - 36}


def test_3_the_page_is_written_whole_and_has_no_script(tmp_path):
    path = write_report(tmp_path, LINES)
    page = path.read_text()
    assert path == tmp_path / "report.html" and page.endswith("</html>\n") and "<script" not in page
    assert "step-0002" in page and list(tmp_path.iterdir()) == [path]  # no temporary file left


def test_4_the_clip_sides_and_the_entropy_coefficient_are_drawn(tmp_path):
    lines = [dict(ln, clip_share=0.3, clip_share_low=0.1, clip_share_high=0.2, entropy_coef=0.005 * ln["step"])
             for ln in LINES]
    (tmp_path / "train.json").write_text('{"agent": "a", "tasks": ["t"], "samples": 4, "lr": 0.01, "clip": 0.2, '
                                         '"clip_high": 0.28, "entropy_coef": 0.0, "entropy_target": 0.2, '
                                         '"advantage_norm": "mean", "normalize": "rollout", "steps": 3}')
    page = render(tmp_path, lines)
    clip = figure_of(page, "clipped / truncated share of tokens")
    assert "clipped low" in clip and "clipped high" in clip
    assert "0.015" in page.split("<table>")[1]  # step 3's coefficient in the table
    coef = figure_of(page, "entropy bonus coefficient")
    assert "<title>step 3: 0.015</title>" in coef and "<title>step 1: 0.005</title>" in coef
    assert "<title>step 2: 0.2</title>" in figure_of(page, "clipped / truncated share of tokens")  # the high side
    assert "clip 0.2/0.28" in page and "entropy target 0.2" in page and "advantages mean" in page
    assert "normalize rollout" in page
