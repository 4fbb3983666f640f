"""Run mitmdump (or scripts/polar-fast) under cProfile: `python bench_profile.py OUT.prof mitmdump|fast ARGS...`.

Stats are written when the proxy exits (SIGTERM). Used by scripts/bench_gateway --profile to find the recording
share and the hot spots of proxy CPU; cProfile inflates Python-heavy code, so read shares, not absolute times.
"""

from __future__ import annotations

import cProfile
import time
import os
import runpy
import sys


def main() -> int:
    out, kind, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    prof = cProfile.Profile(time.process_time)  # CPU, not wall: preemption on a busy machine is not cost
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    prof.enable()
    try:
        if kind == "fast":
            sys.argv = [os.path.join(root, "scripts", "polar-fast"), *args]
            try:
                runpy.run_path(sys.argv[0], run_name="__main__")
            except SystemExit:
                pass
        else:
            from mitmproxy.tools.main import mitmdump

            mitmdump(args)
    finally:
        prof.disable()
        prof.dump_stats(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
