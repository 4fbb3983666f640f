"""The numbers the docs state are the code's (issue 37: README said tiny has 2.1 M parameters, training.md 4 epochs
for a small model, contracts.md `--epochs (1)`): each default a table states is read back from the command's own
argparse parser or the constant the code picks with, and the tiny model's parameter count from its checkpoint.

1.x  docs/contracts.md: every `--flag ARG` (DEFAULT) of polar-train, polar-verify, polar-proxy, polar-export
2.x  docs/options.md: the polar-process table's defaults
3.x  docs/training.md: the defaults polar-train picks for a small and a large model
4.x  README.md: the tiny model's parameter count
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.need import VLLM, need

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _defaults(parser) -> dict[str, object]:
    """--flag → its default, for every option of `parser` (and its sub-commands)."""
    import argparse

    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.update(_defaults(sub))
        for s in action.option_strings:
            out[s] = action.default
    return out


def _same(doc: str, default) -> bool:
    doc = doc.strip().strip("`")
    if isinstance(default, bool) or default is None:
        return False
    if isinstance(default, (int, float)):
        try:
            return float(doc) == float(default)
        except ValueError:
            return False
    return doc == str(default)


def _parsers():
    from polar.launch import proxy_cli
    from polar.trainer import export, plan, verify

    return {"polar-train": plan.parser(), "polar-verify": verify.parser(), "polar-proxy": proxy_cli.build_parser(),
            "polar-export": export.parser()}


def _contract_rows() -> dict[str, str]:
    rows = {}
    for line in (DOCS / "contracts.md").read_text().splitlines():
        m = re.match(r"\|\s*`(polar-[a-z]+)[^`]*`\s*\|[^|]*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


@pytest.mark.parametrize("command", ["polar-train", "polar-verify", "polar-proxy", "polar-export"])
def test_1_1_contracts_defaults_are_the_parsers(command):
    defaults = _defaults(_parsers()[command])
    row = _contract_rows()[command]
    stated = re.findall(r"`(--[a-z0-9-]+)[^`]*`\s*\(([^)]*)\)", row)
    assert stated, f"contracts.md's {command} row states no default"
    # a plain value — a number or one word, as `(30)`, `(float32)` — is a default; prose is not
    plain = [(flag, value.strip("`")) for flag, value in stated if re.fullmatch(r"`?[\w.+-]+`?", value)]
    wrong = {flag: (value, defaults.get(flag)) for flag, value in plain
             if flag in defaults and defaults[flag] is not None and not _same(value, defaults[flag])}
    assert wrong == {}, f"contracts.md's {command} defaults that are not the parser's: {wrong}"
    # a flag whose default is picked at run time (None in the parser) states no number
    picked = [flag for flag, value in plain if defaults.get(flag, "") is None and re.fullmatch(r"[\d.]+", value)]
    assert picked == [], f"contracts.md gives {command} {picked} a fixed default; the code picks it"


def test_2_1_options_md_polar_process_defaults_are_the_parsers():
    from polar.processor import cli

    defaults = _defaults(cli.parser())
    text = (DOCS / "options.md").read_text()
    section = text[text.index("## `polar-process`"):text.index("## `polar-rollout`")]
    checked = 0
    for flag_cell, default_cell in re.findall(r"^\|\s*(`--[^|]*)\|\s*([^|]*)\|", section, flags=re.M):
        flag = re.match(r"`(--[a-z0-9-]+)", flag_cell).group(1)
        value = default_cell.strip()
        if flag not in defaults:
            continue
        d = defaults[flag]
        if value == "off":
            assert d in (False, None), (flag, d)
        elif re.fullmatch(r"`[^`\s]+`", value):
            assert _same(value, d), (flag, value, d)
        checked += 1
    assert checked >= 15


def test_3_1_training_md_states_the_small_and_large_model_picks():
    from polar.trainer import plan

    text = (DOCS / "training.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `--epochs E` |"))
    assert f"({plan.SMALL_MODEL_EPOCHS} for a small model, else 1)" in row, row
    assert plan.default_lr(plan.SMALL_MODEL_PARAMS - 1)[2] == plan.SMALL_MODEL_EPOCHS
    assert plan.default_lr(plan.SMALL_MODEL_PARAMS * 10)[2] == 1
    row = next(line for line in text.splitlines() if line.startswith("| `--mini-batches M` |"))
    assert f"({plan.SMALL_MODEL_MINI_BATCHES})" in row and plan.SMALL_MODEL_MINI_BATCHES == \
        plan.LARGE_MODEL_MINI_BATCHES
    small = (f"under {plan.SMALL_MODEL_PARAMS // 1_000_000}M parameters: lr {plan.SMALL_MODEL_LR:.0e}".replace(
        "e-0", "e-") + f" with {plan.SMALL_MODEL_MINI_BATCHES} mini-batches × {plan.SMALL_MODEL_EPOCHS} epochs")
    assert small in " ".join(text.split()), small


def test_4_1_readme_states_tiny_s_parameter_count():
    from polar.trainer.plan import count_params

    tiny = ROOT / ".cache" / "models" / "tiny"
    need(None if (tiny / "config.json").is_file() else f"{tiny} is not built", setup=VLLM)
    params = count_params(tiny)
    text = " ".join((ROOT / "README.md").read_text().split())
    stated = re.findall(r"`tiny` \(a random ([\d.]+) M-parameter", text)
    assert stated == [f"{params / 1e6:.2f}"], (stated, params)
