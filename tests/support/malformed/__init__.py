"""Malformed packages for packrt-run: a generator of damaged copies of a built package, a runner
that classifies how the runtime takes each one; the sanitized (ASan + UBSan) build of the runtime it
runs is support.sanitized's (re-exported here).

Every variant is (name, defect class, a function that damages a copy of the package). After the
damage the copy's manifest is re-signed (sha256 and bytes of every changed file recomputed) so the
checksum check passes and what is tested is the loader's own validation; a few variants stay
unsigned to show that tampering is detected. Some variants damage the .npy input instead, or give
packrt-run a bad option.

Outcomes (see `classify`): clean (exit 2, or 1, with exactly one stderr line starting
"packrt-run: error:"), correct (exit 0, outputs equal the undamaged package's), wrong (exit 0,
outputs differ or are missing), crash (killed by a signal), hang (timeout), sanitizer (an ASan or
UBSan report), messy (any other failure). A runtime that takes malformed packages well gives only
clean and correct.

The runner copies the package without runtime/ and ort/ (packrt-run reads neither) and runs the
given packrt-run (the sanitized build, or the package's own) with the copy as its argument.
Variants marked `native` (huge --threads) run the package's own binary under RLIMIT_AS (ASan
cannot run under an address-space limit): an uncapped thread pool then fails after a few hundred
threads instead of taking every pid of the machine.

By hand (the package's own packrt-run, or the sanitized one with --sanitized):
    PYTHONPATH=tests python -m support.malformed --sanitized --table malformed.md PKG
"""
from ..sanitized import SANITIZER_ENV, build_sanitized_runtime  # noqa: F401
from .mutations import Case, Variant  # noqa: F401
from .runner import Row, run_variants, write_table  # noqa: F401
from .variants import CLASSES, variants  # noqa: F401
