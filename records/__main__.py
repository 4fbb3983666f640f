"""`python -m polar.records FILE...`: print flow files (see `polar.records.inspect`)."""

import sys

from .inspect import main

sys.exit(main())
