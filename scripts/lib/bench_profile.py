"""Run mitmdump under cProfile: `python bench_profile.py OUT.prof MITMDUMP_ARGS...`.

Stats are written when the proxy exits (SIGTERM). Used by scripts/bench_gateway --profile to find the recording
share and the hot spots of proxy CPU; cProfile inflates Python-heavy code, so read shares, not absolute times.
"""

from __future__ import annotations

import cProfile
import sys
import time


def main() -> int:
    out, args = sys.argv[1], sys.argv[2:]
    prof = cProfile.Profile(time.process_time)  # CPU, not wall: preemption on a busy machine is not cost
    prof.enable()
    try:
        from mitmproxy.tools.main import mitmdump

        mitmdump(args)
    finally:
        prof.disable()
        prof.dump_stats(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
