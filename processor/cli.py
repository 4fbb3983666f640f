"""`polar-process FLOWS... -o OUT`. Exit codes: 0 ok, 2 bad input."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from polar.processor import compaction, credit, pipeline
from polar.processor.eot import EotError, parse_tokenizer_arg
from polar.processor.load import InputError
from polar.processor.merge import MissingEot
from polar.processor.report import summary
from polar.processor.rewards import ADVANTAGE_NORMS, RewardsError
from polar.processor.writers import OutputError
from polar.records import FILE_SUFFIX, OPEN_SUFFIX
from polar.records.cliargs import OneLineParser, positive_int


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _unit_float(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text}")
    return value


def _credit_options(p: argparse.ArgumentParser) -> None:
    """Rule 11's options: each token's advantage."""
    p.add_argument("--credit", choices=credit.CREDITS, default="session",
                   help="session = every trained token carries its session's advantage; turn = plus each main-chain "
                        "call's progress term from the rewards file's turn_scores (docs/merge-rules.md rule 11; a "
                        "session without them keeps session credit, counted) (default: session)")
    p.add_argument("--turn-gamma", type=_unit_float, default=credit.DEFAULT_TURN_GAMMA, metavar="G",
                   help="--credit turn: a call's progress term counts later calls' progress discounted by G per call "
                        f"(0: its own only; 1: to the session's end) (default: {credit.DEFAULT_TURN_GAMMA})")
    p.add_argument("--compaction", choices=compaction.COMPACTIONS, default="train",
                   help="a compaction call (its completion reappears in a later prompt where the prefix broke: "
                        "docs/merge-rules.md rule 12): train = its summary trained under the session's advantage, "
                        "mask = its tokens at mask 0, counted (default: train)")


def parser() -> argparse.ArgumentParser:
    """Every option's help says what it does and its default (a test holds each to that)."""
    p = OneLineParser(
        prog="polar-process",
        description="Rebuild token-faithful training sequences from Polar gateway flow files.",
        epilog="Exit codes: 0 ok, 2 bad input (one line on stderr naming the fix). Documented in docs/options.md and docs/merge-rules.md.")
    p.add_argument("flows", nargs="+", metavar="FLOWS",
                   help=f"flow files (*{FILE_SUFFIX}, *{OPEN_SUFFIX}), directories holding them, or globs; required")
    p.add_argument("-o", "--out", required=True, metavar="OUT",
                   help="output directory; must be absent or empty unless --overwrite or --incremental; required")
    p.add_argument("--mode", choices=("prefix_merging", "per_request"), default="prefix_merging",
                   help="prefix_merging: consecutive turns of a conversation merged into one sequence on their "
                        "shared prefix; per_request: one sequence per call (default: prefix_merging)")
    p.add_argument("--eot-token-id", type=int, action="append", default=[], metavar="N",
                   help="end-of-turn token id, for every model (repeatable; a warning names ids that never occur "
                        "in the dump) (default: from --tokenizer, else the dump's evidence: the last id of "
                        "completions that stopped naturally)")
    p.add_argument("--tokenizer", action="append", default=[], metavar="[MODEL=]DIR",
                   help="model directory whose config files name the EOS ids, for every model or for MODEL "
                        "(repeatable) (default: none)")
    p.add_argument("--rewards", metavar="FILE",
                   help='JSONL {"session": str, "reward": float, "group": str|null}; joined to sessions, GRPO '
                        "advantages per group (default: none; reward and advantage stay null)")
    p.add_argument("--allow-unjoined", action="store_true",
                   help="accept a --rewards file none of whose lines joins a session of the dump (default: off: "
                        "exit 2 naming one of its sessions)")
    p.add_argument("--max-batch-tokens", type=positive_int, default=65536, metavar="N",
                   help="Σ n_tokens per batches/ file; a longer sequence is written alone, flagged oversize "
                        "(default: 65536)")
    p.add_argument("--sft-min-reward", type=float, metavar="X",
                   help="sft.jsonl keeps sessions with reward ≥ X (default: every session with a main chain)")
    p.add_argument("--advantage-norm", choices=ADVANTAGE_NORMS, default="std",
                   help="a group's advantages: std = (reward − group mean) / group σ (population σ; GRPO), mean = "
                        "reward − group mean (Dr. GRPO) (default: std)")
    _credit_options(p)
    p.add_argument("--side-chains", choices=("include", "zero", "exclude"), default="include",
                   help="reward of side-chain sequences: include = the session's, zero = 0.0, exclude = null and "
                        "left out of batches/ (default: include)")
    p.add_argument("--on-mismatch", choices=("merge", "split"), default="merge",
                   help="a turn re-rendered differently from what was sampled (context_mismatch): merge = flag it "
                        "and merge anyway, split = start a new sequence (default: merge)")
    p.add_argument("--overwrite", action="store_true", help="replace outputs in a non-empty OUT (default: off)")
    p.add_argument("--incremental", action="store_true", help=(
        "continue the run whose manifest.json is in OUT: read only closed flow files (*.msgpack) it does not list "
        "(.open files wait until closed); rebuild whole every session with a record in a new file, carry the "
        "others over; recompute every reward and advantage, re-pack batches/, rewrite sft.jsonl and the report. "
        "Same outputs as a full run over the same closed files. Options that decide the merge must match the "
        "manifest's (else exit 2: use --overwrite) (default: off, a full run)"))
    p.add_argument("--allow-empty", action="store_true",
                   help="accept inputs without a readable record and write empty outputs (default: off, exit 2 — "
                        "an empty directory or a mistyped path is not a successful run)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: this process; ray: the index pass and the per-session merge as Ray tasks "
                        "(pip install 'polar-gateway[ray]'), same outputs (default: local)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="Ray cluster to join; the flow files must be readable at the same paths on every node "
                        "(default: $RAY_ADDRESS, else a local Ray on this machine)")
    p.add_argument("--ray-partitions", type=positive_int, metavar="N",
                   help="session partitions (stable hash), one Ray task each (default: 4 × the cluster's CPUs)")
    p.add_argument("--session-prefix", action="append", default=[], metavar="P",
                   help="keep only sessions whose id starts with P (repeatable: any of them); the others, and calls "
                        "without a session, are left out and counted in report.json (counts.sessions_other_prefix, "
                        "counts.calls_other_prefix) (default: every session)")
    p.add_argument("--report-max-mb", type=_positive_float, default=50.0, metavar="N",
                   help="report.html's size bound in MB; past it token strips are left out, broken and flagged "
                        "sessions keeping theirs first, and the report says how many (default: 50)")
    p.add_argument("--report-no-text", action="store_true",
                   help="leave conversation text (messages, answers, token text) out of report.html (default: off; "
                        "the report says at its top when it holds text)")
    p.add_argument("--vocab", action="append", default=[], metavar="[MODEL=]DIR",
                   help="tokenizer.json (or a directory holding one) whose vocabulary gives report.html's token text, "
                        "for every model or for MODEL (repeatable); report only, never the end-of-turn set "
                        "(default: the --tokenizer directories that hold a tokenizer.json, else none: token ids)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no summary; warnings and errors still go to stderr (default: off)")
    return p


def default_vocab(tokenizers: list[str]) -> list[str]:
    """--vocab when none is given: the --tokenizer directories that hold a tokenizer.json, so report.html shows the
    tokens' text wherever the run already names the model's tokenizer."""
    out = []
    for spec in tokenizers:
        _, directory = parse_tokenizer_arg(spec)
        if os.path.isfile(os.path.join(directory, "tokenizer.json")):
            out.append(spec)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    err = lambda msg: print(f"polar-process: error: {msg}", file=sys.stderr) or 2  # noqa: E731
    if args.engine == "ray" and importlib.util.find_spec("ray") is None:
        return err("--engine ray needs Ray, which is not installed: pip install 'polar-gateway[ray]' "
                   "(or use --engine local)")
    if args.engine != "ray" and (args.ray_address or args.ray_partitions):
        return err("--ray-address and --ray-partitions need --engine ray")
    if args.incremental and args.overwrite:
        return err("--incremental and --overwrite exclude each other (--overwrite starts over)")
    opts = pipeline.Options(
        inputs=tuple(args.flows), out=args.out, mode=args.mode, eot_token_ids=tuple(args.eot_token_id),
        tokenizers=tuple(args.tokenizer), rewards=args.rewards, max_batch_tokens=args.max_batch_tokens,
        sft_min_reward=args.sft_min_reward, side_chains=args.side_chains, on_mismatch=args.on_mismatch,
        overwrite=args.overwrite, incremental=args.incremental, engine=args.engine, ray_address=args.ray_address,
        ray_partitions=args.ray_partitions, allow_empty=args.allow_empty, session_prefix=tuple(args.session_prefix),
        report_max_mb=args.report_max_mb, report_no_text=args.report_no_text,
        vocab=tuple(args.vocab or default_vocab(args.tokenizer)), allow_unjoined=args.allow_unjoined,
        advantage_norm=args.advantage_norm, credit=args.credit, turn_gamma=args.turn_gamma,
        compaction=args.compaction)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        report = pipeline.process(opts, pipeline.Progress(show and not args.quiet))
    except MissingEot as exc:
        return err(f"no end-of-turn ids for model {exc.args[0]!r}; pass --eot-token-id N or --tokenizer [MODEL=]DIR")
    except (InputError, EotError, RewardsError, OutputError) as exc:
        return err(str(exc))
    for warning in report.warnings:
        print(f"polar-process: warning: {warning}", file=sys.stderr)
    if not args.quiet:
        print(summary(report))
        if args.session_prefix:
            c = report.counts
            print(f"session prefix {' | '.join(map(repr, args.session_prefix))}: {c.sessions_other_prefix} other "
                  f"session(s) ({c.calls_other_prefix} calls) left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
