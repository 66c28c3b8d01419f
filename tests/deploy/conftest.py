"""Fixtures for the deploy tests: a scratch directory out of /tmp, and the namespaced systemd."""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path

import pytest

from deploy_helpers import REPO, SCRATCH
from systemd_ns import SystemdNamespace, unavailable_reason

# What the namespace must show at the host's paths: the checkout (code, stand-in, scratch) and the
# python the rendered units run (a venv's python is a link into its base install).
VISIBLE = (REPO, Path(sys.prefix), Path(sys.base_prefix))


@pytest.fixture
def scratch():
    path = SCRATCH / uuid.uuid4().hex[:12]
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def systemd_ns():
    """A booted systemd (PID 1 of its own namespace); killed, with all it started, when the module ends."""
    reason = unavailable_reason(VISIBLE)
    if reason:
        pytest.skip(f"real-systemd test: {reason}")
    workdir = SCRATCH / f"ns-{uuid.uuid4().hex[:12]}"
    workdir.mkdir(parents=True)
    ns = SystemdNamespace(workdir, VISIBLE)
    try:
        ns.start()
        yield ns
    finally:
        ns.stop()
        shutil.rmtree(workdir, ignore_errors=True)
