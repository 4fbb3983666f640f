#!/bin/bash
cat > /app/greet.py <<'PY'
import os
import sys

print(f"{os.environ['GREETING']}, {sys.argv[1]}!")
PY
