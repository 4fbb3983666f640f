#!/usr/bin/env python3
"""Generated task families for polar-train: many graded answer tasks of one kind, each with its own prompt.

    python3 examples/tasks/families/generate.py [--family NAME ...] [--train N] [--eval M] [--seed S]

writes examples/tasks/families/<NAME>/train/<NAME>-NNN/ (N tasks to train on) and
examples/tasks/families/<NAME>/eval/<NAME>-eNNN/ (M held-out tasks, for `polar-train --eval-tasks`), each a Harbor
task (task.toml, instruction.md, tests/test.sh, solution/solve.sh, no environment/). The output is a function of the
arguments (a seeded generator): the folders in the tree are what the defaults write.

Every family scores one share of the characters of the files the agent leaves in /app (answer.txt is asked for; the
`answer` agent writes its reply there), so the reward is graded 0–1 and a random policy's samples already differ
within a group: no file or no counted character scores 0.0, the solution 1.0. The prompts differ in wording and in
the thing the answer is about, so a policy has to learn the kind of answer, not one prompt:

- digit-share: the share of digits among the letters and digits (ASCII).
- vowel-share: the share of vowels (a e i o u) among the letters and digits.
- upper-share: the share of upper-case letters among the letters.
- letter-share: the share of one letter (given in the prompt, one of e t a o n s) among the letters and digits.

One family is made of steps, for per-turn credit (polar-process --credit turn):

- digit-steps: three notes, one per reply (the `steps` agent writes reply N to noteN.txt before its next call), each
  scored as digit-share scores a file; the reward is their mean (a missing note scores 0). tests/progress.sh scores a
  working directory the same way at any point, so the state before call N+1 shows what reply N added.
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent

TOPICS = ("a train timetable", "a shopping list", "a weather report", "a football match", "a recipe",
          "a bank statement",
          "a library catalogue", "a chess game", "a phone book", "a tide table", "a star chart", "a garden plan",
          "an invoice", "a lottery draw", "a flight board", "a diary entry", "a city map", "a school report",
          "a song", "a poem", "a parking ticket", "a museum guide", "a race result", "a tax form")
STYLES = ("Write", "Produce", "Reply with", "Give", "Answer with", "Compose")

FAMILIES = {
    "digit-share": {
        "what": "as many digits (0-9) as you can",
        "score": "the share of digits among the letters and digits",
        "count": "c.isdigit()", "among": "c.isascii() and c.isalnum()",
        "solution": "20260412 31415926 27182818",
    },
    "vowel-share": {
        "what": "as many vowels (a, e, i, o, u) as you can",
        "score": "the share of vowels among the letters and digits",
        "count": "c.lower() in 'aeiou'", "among": "c.isascii() and c.isalnum()",
        "solution": "aeiou oui eau",
    },
    "upper-share": {
        "what": "only upper-case letters (A-Z)",
        "score": "the share of upper-case letters among the letters",
        "count": "c.isupper()", "among": "c.isascii() and c.isalpha()",
        "solution": "SHOUTING IN CAPITALS",
    },
    "digit-steps": {
        "what": "as many digits (0-9) as you can",
        "score": "the share of digits among the letters and digits",
        "count": "c.isdigit()", "among": "c.isascii() and c.isalnum()",
        "solution": "20260412 31415926 27182818",
        "steps": 3,
    },
    "letter-share": {
        "what": "the letter `{letter}` as often as you can",
        "score": "the share of the letter `{letter}` (either case) among the letters and digits",
        "count": "c.lower() == '{letter}'", "among": "c.isascii() and c.isalnum()",
        "solution": "{letter}{letter}{letter} {letter}{letter}",
        "letters": "etaons",
    },
}

TOML = """version = "1.0"

[metadata]
difficulty = "easy"
category = "file-output"
tags = ["graded", "training", "family:{family}"]

[agent]
timeout_sec = 120.0

[verifier]
timeout_sec = 60.0

[environment]
cpus = 1
memory_mb = 2048
"""

# what every scorer runs before its own Python: the paths and a clean reward file (the score is written, then renamed)
SCORER_HEAD = """set -uo pipefail
APP=${{POLAR_APP:-/app}}
TESTS=${{POLAR_TESTS:-/tests}}
LOGS=${{POLAR_LOGS:-/logs/verifier}}
mkdir -p "$LOGS" && LOGS=$(cd "$LOGS" && pwd) && cd "$APP" || exit 1
rm -f "$LOGS/reward.txt"
python3 -P - "$APP" >"$LOGS/reward.txt.tmp" <<'PY' || exit 1
import os
import sys
"""

TEST_SH = """#!/usr/bin/env bash
# Verifier of {task} (family {family}, examples/tasks/families/generate.py): a graded reward, {score}, over every
# regular file the agent left in /app, in /logs/verifier/reward.txt. No file or no counted character scores 0.0; the
# solution 1.0. Paths are /app, /tests and /logs/verifier; POLAR_APP, POLAR_TESTS and POLAR_LOGS override them.
""" + SCORER_HEAD + """
text = ""
for dirpath, dirnames, filenames in os.walk(sys.argv[1]):
    dirnames[:] = [d for d in dirnames if d != ".git"]
    for name in sorted(filenames):
        path = os.path.join(dirpath, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                text += f.read(1 << 20).decode("ascii", errors="ignore")
among = [c for c in text if {among}]
print(round(sum(1 for c in among if {count}) / len(among), 6) if among else 0.0)
PY
mv "$LOGS/reward.txt.tmp" "$LOGS/reward.txt"
"""

STEPS_SH = """#!/usr/bin/env bash
# {role} of {task} (family {family}, examples/tasks/families/generate.py).
# The score: {score} of each of note1.txt … note{steps}.txt in /app,
# averaged over the {steps} notes (a missing note scores 0.0), in /logs/verifier/reward.txt.
# {why}
# Paths are /app, /tests and /logs/verifier; POLAR_APP, POLAR_TESTS and POLAR_LOGS override them.
""" + SCORER_HEAD + """
total = 0.0
for n in range(1, {steps} + 1):
    path = os.path.join(sys.argv[1], f"note{{n}}.txt")
    if os.path.isfile(path) and not os.path.islink(path):
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode("ascii", errors="ignore")
        among = [c for c in text if {among}]
        total += sum(1 for c in among if {count}) / len(among) if among else 0.0
print(round(total / {steps}, 6))
PY
mv "$LOGS/reward.txt.tmp" "$LOGS/reward.txt"
"""

ROLES = {"tests/test.sh": ("Verifier", "The solution scores 1.0."),
         "tests/progress.sh": ("State scorer", "Run on the working directory at each call (polar-rollout "
                                               "--turn-states): the change from one call\n# to the next is what the "
                                               "reply between them added.")}

SOLVE_STEPS_SH = """#!/usr/bin/env bash
# Reference solution of {task} (cwd /app).
set -euo pipefail
for n in $(seq 1 {steps}); do printf '%s\\n' '{solution}' > "note$n.txt"; done
"""

SOLVE_SH = """#!/usr/bin/env bash
# Reference solution of {task} (cwd /app).
set -euo pipefail
printf '%s\\n' '{solution}' > answer.txt
"""


def instruction(spec: dict, rng: random.Random, letter: str | None) -> str:
    what = spec["what"].format(letter=letter)
    score = spec["score"].format(letter=letter)
    topic = rng.choice(TOPICS)
    style = rng.choice(STYLES)
    if spec.get("steps"):
        return (f"{style} {spec['steps']} short notes about {topic}, one per reply (each reply is saved as note1.txt, "
                f"note2.txt, …), using {what}: the score is {score} of each note, averaged over the notes.\n")
    return (f"{style} {topic} in a file named `answer.txt` in the current directory, using {what}: the score is "
            f"{score} of the files you leave in the current directory.\n")


def write_task(folder: Path, family: str, spec: dict, rng: random.Random, letter: str | None) -> None:
    fill = {"family": family, "task": folder.name, "score": spec["score"].format(letter=letter),
            "count": spec["count"].format(letter=letter), "among": spec["among"],
            "solution": spec["solution"].format(letter=letter)}
    (folder / "tests").mkdir(parents=True)
    (folder / "solution").mkdir()
    (folder / "task.toml").write_text(TOML.format(**fill))
    (folder / "instruction.md").write_text(instruction(spec, rng, letter))
    if spec.get("steps"):
        fill["steps"] = spec["steps"]
        scripts = [(rel, STEPS_SH.format(**fill, role=role, why=why)) for rel, (role, why) in ROLES.items()]
        scripts.append(("solution/solve.sh", SOLVE_STEPS_SH.format(**fill)))
    else:
        scripts = [(rel, text.format(**fill)) for rel, text in (("tests/test.sh", TEST_SH),
                                                                  ("solution/solve.sh", SOLVE_SH))]
    for rel, text in scripts:
        (folder / rel).write_text(text)
        (folder / rel).chmod(0o755)


def generate(family: str, n_train: int, n_eval: int, seed: int, root: Path = HERE) -> Path:
    spec = FAMILIES[family]
    rng = random.Random(f"{family}:{seed}")
    base = root / family
    shutil.rmtree(base, ignore_errors=True)
    letters = spec.get("letters")
    seen: set[str] = set()
    for split, n, prefix in (("train", n_train, ""), ("eval", n_eval, "e")):
        for i in range(n):
            letter = letters[i % len(letters)] if letters else None
            folder = base / split / f"{family}-{prefix}{i:03d}"
            while True:  # distinct prompts across both splits
                state = rng.getstate()
                text = instruction(spec, rng, letter)
                if text not in seen:
                    seen.add(text)
                    rng.setstate(state)
                    break
            write_task(folder, family, spec, rng, letter)
    return base


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", action="append", choices=sorted(FAMILIES), help="default: every family")
    p.add_argument("--train", type=int, default=32, help="tasks to train on, per family")
    p.add_argument("--eval", type=int, default=8, help="held-out tasks, per family")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE, help="where the family folders go")
    args = p.parse_args(argv)
    for family in args.family or sorted(FAMILIES):
        print(generate(family, args.train, args.eval, args.seed, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
