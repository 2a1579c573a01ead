"""Fixtures of the runtime tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture
def x_npy(tmp_path) -> Path:
    """The float32[4] input of the hand-written packages (support/synthetic.py)."""
    p = tmp_path / "x.npy"
    np.save(p, np.array([1, 2, 3, 4], np.float32))
    return p
