"""The verifier's view: APP is the agent's /app (POLAR_APP overrides it). It is appended to sys.path, after the
standard library and pytest, so files the agent writes cannot shadow them."""

import os
import sys
from pathlib import Path

import pytest

APP = Path(os.environ.get("POLAR_APP", "/app"))
sys.path.append(str(APP))


@pytest.fixture
def app() -> Path:
    return APP
