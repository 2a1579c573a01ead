"""EinNet's derivation-based rewrites (OSDI'23): tensor-algebra expressions, exact rules over
them, and the search that finds cheaper programs (see expr.py for the IR)."""
