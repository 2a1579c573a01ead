"""Emit: what goes into a package (plan.json, memory plan, weights.bin, manifest.json, README,
build report, ORT wrapper model, the C++ runtime) and the writer that puts it in place atomically."""
