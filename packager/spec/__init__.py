"""The deployment spec: its typed form (model) and the YAML reader that checks it (load)."""
from .load import load_spec, spec_error
from .model import (DTYPES, LEVEL_PASSES, PASS_NAMES, InputSpec, OptimizeSpec, OrtSpec, Profile, Spec, TargetSpec,
                    VerifySpec)

__all__ = ["DTYPES", "LEVEL_PASSES", "PASS_NAMES", "InputSpec", "OptimizeSpec", "OrtSpec", "Profile", "Spec",
           "TargetSpec", "VerifySpec", "load_spec", "spec_error"]
