"""`polar-rollout TASKS... --agent AGENT --out RUN [options]`. Exit codes: 0 every sample has a final status and at
least one a reward; 1 none has a reward (or processing failed); 2 bad input or a preflight refused; 130 cancelled.
`polar-rollout serve DIR ...` is the long-lived rollout stage (rollout/serve/server.py). The parser and the Options it
builds are rollout/options.py's, which the serve parses its requests with too."""

from __future__ import annotations

import sys

from polar.rollout.options import options, parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # a task folder named serve is passed as ./serve
        from polar.rollout.serve import server as serve

        return serve.main(argv[1:])
    args = parser().parse_args(argv)
    from polar.rollout import runner
    from polar.rollout.reporter import Reporter
    from polar.rollout.sandbox import warm

    report = Reporter()
    try:
        return runner.main(options(args), report)
    except KeyboardInterrupt:
        report.note("cancelled")
        return 130
    finally:
        warm.close_all()


if __name__ == "__main__":
    sys.exit(main())
