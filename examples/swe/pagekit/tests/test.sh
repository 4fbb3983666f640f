#!/bin/bash
# The verifier of an SWE task: the repository's test environment (SWE-bench's images keep it in a conda env named
# testbed; activated when the image has one), then grade.py beside this file grades /testbed as SWE-bench does and
# writes /logs/verifier/reward.txt and reward.json (polar.rollout.swe_grade).
if [ -f /opt/miniconda3/bin/activate ]; then
    source /opt/miniconda3/bin/activate && conda activate testbed
fi
exec python3 "$(dirname "$0")/grade.py" "$@"
