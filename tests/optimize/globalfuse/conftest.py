"""Fixtures of the global-fusion tests: the transformer sample imported once, an h100 target."""
from __future__ import annotations

import pytest

from packager.frontend import bind_profiles, import_relax, load_model, profile_shapes
from packager.spec import TargetSpec, load_spec
from packager.targets import resolve, resolve_all


@pytest.fixture(scope="module")
def transformer(sample_root):
    spec = load_spec(sample_root / "transformer" / "spec.yaml")
    model = load_model(spec.model)
    dtypes = bind_profiles(spec, model)
    mod = import_relax(model, profile_shapes(model, spec.profiles[0]), dtypes)[0]
    return spec, mod, resolve_all(spec)[0]


@pytest.fixture(scope="module")
def h100():
    return resolve(TargetSpec("h100", {}, "test"))
