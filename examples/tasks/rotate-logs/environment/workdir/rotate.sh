#!/usr/bin/env bash
# rotate.sh DIR KEEP: keep the KEEP newest *.log files in DIR, move the others into DIR/archive/.
echo "rotate.sh: not implemented yet" >&2
exit 1
