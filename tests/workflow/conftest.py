"""Fixtures of the workflow tests: a throwaway copy of the workflow (tests/workflow/workdir.py)."""
from __future__ import annotations

import pytest

from .workdir import Workdir


@pytest.fixture
def workdir(tmp_path) -> Workdir:
    return Workdir(tmp_path / "wf")
