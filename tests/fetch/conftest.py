"""Fixtures for the fetch tests: a fake hub on 127.0.0.1 (see fakehub.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The helpers beside this file are imported by name from the tests (no package here).
sys.path.insert(0, str(Path(__file__).parent))

from fakehub import FakeHub  # noqa: E402
from fetch_support import TOKEN  # noqa: E402


@pytest.fixture
def hub():
    with FakeHub(TOKEN) as fake:
        yield fake
