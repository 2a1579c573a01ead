"""The variants: (name, defect class, damage), in the defect classes of CLASSES."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .mutations import (
    Case, INT_MIN, U64, Variant, _abs_copy_outside, _align, _copy_into_input, _copy_into_new_weights,
    _copy_into_weights, _copy_overlapping, _copy_valid, _cuda_plan, _drop_last_arg, _dsize, _hdr, _in,
    _new_tensor, _npy_saved, _other_kernel, _out, _package_through_symlink, _produced, _replace_arg, _shape,
    _step0, _weights, _wrapping_shape, _written, append_bytes, append_step, cut, del_key, directory, fifo,
    flip_byte, manifest_path, npy_input, npy_raw, on_manifest, on_plan, on_profile, on_target, set_kernel0,
    set_step0, set_tensor, symlink_inside, symlink_loop, symlink_outside, threads, write_text)

CLASSES = {
    "ranges": "plan.json offsets/sizes negative, huge, wrapping, overlapping, misaligned; arena and weights bytes",
    "dtypes": "tensor dtypes unknown, or not matching their bytes or what the kernel takes",
    "json-types": "missing keys, extra keys, JSON values of the wrong type (strings, floats, booleans, 2^32, 1e300, null)",
    "kernels": "kernel symbols (libc functions, data, other kernels), kernel and tensor indices, argument counts",
    "shapes": "zero, negative and overflowing dimensions, rank above the maximum",
    "truncated": "truncated and zero-length package files",
    "filesystem": "symlinks, FIFOs and directories in place of files, '..' and absolute manifest paths",
    "copy-steps": "copy steps: overlapping ranges, into weights or inputs, between different sizes",
    "data-flow": "steps out of order, output counts, a step writing an input, a tensor twice or its own input, "
                 "outputs never computed",
    "npy-input": "damaged .npy inputs (the package is intact)",
    "threads": "bad --threads values",
    "manifest": "manifest.json: wrong types, missing targets, unknown devices, unsigned tampering",
}


def variants() -> list[Variant]:
    """Every variant, in table order."""
    out: list[Variant] = []

    def add(name: str, cls: str, fn: Callable[[Case], None], **kw) -> None:
        assert cls in CLASSES, cls
        out.append(Variant(name, cls, fn, **kw))

    # (1) byte ranges in plan.json
    c = "ranges"
    add("offset-negative-64", c, set_tensor(_produced, offset=-64))
    add("offset-2^63", c, set_tensor(_produced, offset=2**63))
    add("offset-2^64-4096-wraps", c, set_tensor(_produced, offset=U64 - 4096))
    add("offset-2^64-1", c, set_tensor(_produced, offset=U64 - 1))
    add("weights-offset-2^64-64-wraps", c, set_tensor(_weights(0), offset=U64 - 64))
    add("offset-at-arena-end", c, set_tensor(_produced, offset=lambda t, pr: _align(pr["arena_bytes"])))
    add("offset-misaligned", c, set_tensor(_produced, offset=lambda t, pr: t["offset"] + 4))
    add("weights-offset-misaligned", c, set_tensor(_weights(1), offset=lambda t, pr: t["offset"] + 32))
    add("bytes-2^63", c, set_tensor(_produced, bytes=2**63))
    add("bytes-2^64-1", c, set_tensor(_produced, bytes=U64 - 1))
    add("bytes-negative", c, set_tensor(_produced, bytes=-4))
    add("overlap-output-on-live-input", c,           # the second kernel writes over what it reads
        set_tensor(_written(1), offset=lambda t, pr: pr["tensors"][_written(0)(pr)]["offset"]))
    add("overlap-two-weights", c, set_tensor(_weights(1), offset=lambda t, pr: pr["tensors"][_weights(0)(pr)]["offset"]))
    add("arena-bytes-negative", c, on_profile(lambda pr: pr.update(arena_bytes=-1)))
    add("arena-bytes-2^64-1", c, on_profile(lambda pr: pr.update(arena_bytes=U64 - 1)))
    add("arena-bytes-2^64-64", c, on_profile(lambda pr: pr.update(arena_bytes=U64 - 64)))
    add("arena-bytes-2^63", c, on_profile(lambda pr: pr.update(arena_bytes=2**63)))
    add("arena-bytes-0", c, on_profile(lambda pr: pr.update(arena_bytes=0)))
    add("arena-bytes-too-small", c, on_profile(lambda pr: pr.update(arena_bytes=pr["arena_bytes"] - 64)))
    add("weights-bytes-negative", c, on_plan(lambda p: p["weights"].update(bytes=-1)))
    add("weights-bytes-2^64-1", c, on_plan(lambda p: p["weights"].update(bytes=U64 - 1)))
    add("weights-bytes-2^63", c, on_plan(lambda p: p["weights"].update(bytes=2**63)))
    add("weights-bytes-larger-than-file", c, on_plan(lambda p: p["weights"].update(bytes=p["weights"]["bytes"] + 64)))

    # (2) dtypes
    c = "dtypes"
    add("dtype-unknown", c, set_tensor(_produced, dtype="float128"))
    add("dtype-empty", c, set_tensor(_produced, dtype=""))
    add("dtype-uppercase", c, set_tensor(_produced, dtype="FLOAT32"))
    add("dtype-float64-bytes-of-float32", c, set_tensor(_in, dtype="float64"))
    add("dtype-int32-intermediate", c, set_tensor(_produced, dtype="int32"))
    add("dtype-float16-intermediate", c, set_tensor(_produced, dtype="float16", bytes=lambda t, pr: t["bytes"] // 2))
    add("dtype-int32-input", c, set_tensor(_in, dtype="int32"))
    add("dtype-int8-output", c, set_tensor(_out, dtype="int8", shape=lambda t, pr: [1, t["bytes"]]))
    add("dtype-bool-weights", c, set_tensor(_weights(0), dtype="bool", shape=lambda t, pr: [t["bytes"]]))

    # (3) JSON: missing keys, extra keys, wrong types
    c = "json-types"
    add("offset-string", c, set_tensor(_produced, offset="0"))
    add("offset-null", c, set_tensor(_produced, offset=None))
    add("offset-float-0.75", c, set_tensor(_written(1), offset=0.75))
    add("offset-true", c, set_tensor(_produced, offset=True))
    add("offset-2^64-as-float", c, set_tensor(_produced, offset=float(U64)))
    add("offset-1e300", c, set_tensor(_produced, offset=1e300))
    add("offset-nan", c, set_tensor(_produced, offset=float("nan")))
    add("arena-bytes-1e300", c, on_profile(lambda pr: pr.update(arena_bytes=1e300)))
    add("kernel-index-2^32-plus-other", c, set_step0(kernel=lambda s, p: 2**32 + _other_kernel(p, True)))
    add("kernel-index-1e300", c, set_step0(kernel=1e300))
    add("kernel-index-true", c, set_step0(kernel=True))
    add("step-arg-2^32-plus-input", c, set_step0(args=_replace_arg(-1, lambda a, p: 2**32 + _in(p["profiles"][0]))))
    add("step-arg-true", c, set_step0(args=_replace_arg(0, True)))
    add("num-args-float", c, set_kernel0(num_args=lambda k, p: k["num_args"] + 0.5))
    add("io-tensor-string", c, on_profile(lambda pr: pr["inputs"][0].update(tensor=str(_in(pr)))))
    add("shape-strings", c, set_tensor(_in, shape=lambda t, pr: [str(d) for d in t["shape"]]))
    add("shape-float-dim", c, set_tensor(_in, shape=lambda t, pr: t["shape"][:-1] + [t["shape"][-1] + 0.5]))
    add("dtype-number", c, set_tensor(_produced, dtype=1))
    add("plan-version-string", c, on_plan(lambda p: p.update(version="1")))
    add("plan-version-true", c, on_plan(lambda p: p.update(version=True)))
    add("missing-format", c, del_key(lambda p: p, "format"))
    add("missing-weights", c, del_key(lambda p: p, "weights"))
    add("missing-kernels", c, del_key(lambda p: p, "kernels"))
    add("missing-tensor-offset", c, del_key(lambda p: p["profiles"][0]["tensors"][_produced(p["profiles"][0])], "offset"))
    add("missing-profile-steps", c, del_key(lambda p: p["profiles"][0], "steps"))
    add("missing-kernel-symbol", c, del_key(lambda p: p["kernels"][0], "symbol"))

    def extra_keys(p):
        p["unexpected"] = {"a": [1, 2]}
        p["kernels"][0]["unexpected"] = True
        p["profiles"][0]["unexpected"] = None
        p["profiles"][0]["tensors"][0]["unexpected"] = "x"
        p["profiles"][0]["steps"][0]["unexpected"] = 1.5
    add("extra-keys-everywhere", c, on_plan(extra_keys))
    add("weights-array-for-object", c, on_plan(lambda p: p.update(weights=[p["weights"]["bytes"]])))
    add("profiles-object-for-array", c, on_plan(lambda p: p.update(profiles={"default": p["profiles"][0]})))
    add("tensor-array-for-object", c,
        on_profile(lambda pr: pr["tensors"].__setitem__(_produced(pr), list(pr["tensors"][_produced(pr)].values()))))
    add("plan-is-json-array", c, write_text("plan", "[]"))
    add("plan-not-json", c, write_text("plan", "{\"format\": \"packager-plan\", "))

    # (4) kernels: symbols, indices, argument counts
    c = "kernels"
    add("symbol-exit", c, set_kernel0(symbol="exit"))
    add("symbol-abort", c, set_kernel0(symbol="abort"))
    add("symbol-malloc", c, set_kernel0(symbol="malloc"))
    add("symbol-data-hook-variable", c, set_kernel0(symbol="__TVMBackendAllocWorkspace"))
    add("symbol-bss-variable", c, set_kernel0(symbol="packrt_parallel_barrier"))
    add("symbol-libc-data-environ", c, set_kernel0(symbol="environ"))
    add("symbol-missing", c, set_kernel0(symbol="no_such_kernel"))
    add("symbol-empty", c, set_kernel0(symbol=""))
    add("symbol-abi-version-function", c, set_kernel0(symbol="packrt_kernels_abi_version"))
    add("symbol-ffi-helper-function", c, set_kernel0(symbol="TVMFFIErrorSetRaisedFromCStr"))
    add("symbol-of-other-kernel-other-arity", c,
        set_kernel0(symbol=lambda k, p: p["kernels"][_other_kernel(p, False)]["symbol"]))
    add("symbol-of-other-kernel-same-arity", c,
        set_kernel0(symbol=lambda k, p: p["kernels"][_other_kernel(p, True)]["symbol"]))
    add("kernel-name-multiline-and-failing", c,
        set_kernel0(name="conv\nsecond line", symbol=lambda k, p: p["kernels"][_other_kernel(p, False)]["symbol"]))
    add("step-arg-negative", c, set_step0(args=_replace_arg(0, -1)))
    add("step-arg-int-max", c, set_step0(args=_replace_arg(0, 2**31 - 1)))
    add("step-arg-2^63", c, set_step0(args=_replace_arg(-1, 2**63)))
    add("num-args-plus-one", c, set_kernel0(num_args=lambda k, p: k["num_args"] + 1))
    add("num-args-and-args-minus-one", c, on_plan(_drop_last_arg))
    add("kernel-index-negative", c, set_step0(kernel=-1))
    add("kernel-index-past-end", c, set_step0(kernel=lambda s, p: len(p["kernels"])))
    add("step-op-unknown", c, set_step0(op="launch"))
    add("cuda-plan-launch-arg-int-min", c, on_plan(_cuda_plan([INT_MIN])))
    add("cuda-plan-on-cpu-target", c, on_plan(_cuda_plan([0])))
    add("cuda-plan-cooperative-not-a-boolean", c, on_plan(_cuda_plan([0], cooperative="yes")))

    # (5) shapes
    c = "shapes"
    add("dim-zero-intermediate", c, set_tensor(_produced, shape=lambda t, pr: [t["shape"][0], 0, *t["shape"][2:]], bytes=0))
    add("dim-negative", c, set_tensor(_produced, shape=lambda t, pr: [t["shape"][0], -t["shape"][1], *t["shape"][2:]]))
    add("dims-2^32x2^32-intermediate", c, set_tensor(_produced, shape=[2**32, 2**32], bytes=0))
    add("dims-2^32x2^32-output", c, set_tensor(_out, shape=[2**32, 2**32], bytes=0))
    add("dims-2^32x2^32-input", c, set_tensor(_in, shape=[2**32, 2**32], bytes=0))
    add("dims-wrap-to-bytes-intermediate", c,
        set_tensor(_produced, shape=lambda t, pr: _wrapping_shape(t["shape"], _dsize(t["dtype"]))))
    add("dims-wrap-to-bytes-output", c, set_tensor(_out, shape=lambda t, pr: _wrapping_shape(t["shape"], _dsize(t["dtype"]))))
    add("rank-9", c, set_tensor(_produced, shape=lambda t, pr: [1] * (9 - len(t["shape"])) + t["shape"]))
    add("rank-0-output", c, set_tensor(_out, shape=[], bytes=lambda t, pr: _dsize(t["dtype"])))
    add("dim-2^63-1-input", c, set_tensor(_in, shape=lambda t, pr: [2**63 - 1, *t["shape"][1:]]))
    add("dim-2^64-1", c, set_tensor(_produced, shape=lambda t, pr: [U64 - 1, *t["shape"][1:]]))

    # (6) truncated and empty files
    c = "truncated"
    add("kernels-cut-to-10pct", c, cut("kernels", 0.10))
    add("kernels-cut-to-50pct", c, cut("kernels", 0.50))
    add("kernels-cut-to-90pct", c, cut("kernels", 0.90))
    add("kernels-elf-header-only", c, cut("kernels", keep=64))
    add("kernels-empty", c, cut("kernels", keep=0))
    add("kernels-garbage-appended", c, append_bytes("kernels", b"\xde\xad\xbe\xef" * 1000))
    add("plan-cut-in-half", c, cut("plan", 0.5))
    add("plan-empty", c, cut("plan", keep=0))
    add("weights-cut-in-half", c, cut("weights", 0.5))
    add("weights-empty", c, cut("weights", keep=0))
    add("manifest-cut-in-half", c, cut("manifest", 0.5), sign=False)
    add("manifest-empty", c, cut("manifest", keep=0), sign=False)

    # (7) the file system
    c = "filesystem"
    add("plan-symlink-inside", c, symlink_inside("plan"))
    add("plan-symlink-outside", c, symlink_outside("plan"))
    add("kernels-symlink-outside", c, symlink_outside("kernels"))
    add("weights-symlink-to-dev-zero", c, symlink_outside("weights", "/dev/zero"))
    add("plan-symlink-loop", c, symlink_loop("plan"))
    add("plan-fifo", c, fifo("plan"))
    add("weights-fifo", c, fifo("weights"))
    add("kernels-fifo", c, fifo("kernels"))
    add("manifest-fifo", c, fifo("manifest"), sign=False)
    add("plan-directory", c, directory("plan"))
    add("kernels-directory", c, directory("kernels"))
    add("manifest-directory", c, directory("manifest"), sign=False)
    add("plan-path-with-dotdot", c, manifest_path("plan", lambda c_: "targets/../" + c_.rel["plan"]))
    add("plan-path-absolute-inside", c, manifest_path("plan", lambda c_: str(c_.file("plan"))))
    add("weights-path-absolute-outside", c, manifest_path("weights", _abs_copy_outside("weights")))
    add("package-through-symlink", c, _package_through_symlink)

    # (8) copy steps (added to the plan: the samples' plans have none)
    c = "copy-steps"
    add("copy-valid-output", c, on_profile(_copy_valid))
    add("copy-overlapping-ranges", c, on_profile(_copy_overlapping))
    add("copy-onto-itself", c, append_step(lambda pr: {"op": "copy", "args": [_out(pr), _out(pr)]}))
    add("copy-into-new-weights-tensor", c, on_profile(_copy_into_new_weights))
    add("copy-into-existing-weights", c, on_profile(_copy_into_weights))
    add("copy-into-input", c, on_profile(_copy_into_input))
    add("copy-different-sizes", c, append_step(lambda pr: {"op": "copy", "args": [_in(pr), _out(pr)]}))
    add("copy-three-args", c, append_step(lambda pr: {"op": "copy", "args": [_out(pr), _out(pr), _out(pr)]}))
    add("copy-no-args", c, append_step(lambda pr: {"op": "copy", "args": []}))
    add("copy-index-out-of-range", c, append_step(lambda pr: {"op": "copy", "args": [_out(pr), len(pr["tensors"])]}))

    # (8b) the plan's data flow (each arena tensor written once, before it is read)
    c = "data-flow"
    add("steps-first-two-swapped", c, on_profile(lambda pr: pr["steps"].insert(0, pr["steps"].pop(1))))
    add("steps-reversed", c, on_profile(lambda pr: pr["steps"].reverse()))
    add("step-repeated-at-end", c, on_profile(lambda pr: pr["steps"].append(dict(_step0(pr)))))
    add("step-outputs-missing", c, on_profile(lambda pr: _step0(pr).pop("outputs")))
    add("step-outputs-zero", c, on_profile(lambda pr: _step0(pr).update(outputs=0)))
    add("step-outputs-all-args", c, on_profile(lambda pr: _step0(pr).update(outputs=len(_step0(pr)["args"]))))
    add("step-outputs-too-many", c, on_profile(lambda pr: _step0(pr).update(outputs=len(_step0(pr)["args"]) + 1)))
    add("step-writes-the-input", c, on_profile(lambda pr: _step0(pr)["args"].__setitem__(-1, _in(pr))))
    add("step-writes-its-own-input", c,
        on_profile(lambda pr: _step0(pr)["args"].__setitem__(-1, _step0(pr)["args"][0])))
    add("output-never-written", c,
        on_profile(lambda pr: pr["outputs"][0].update(tensor=_new_tensor(pr, _out(pr)))))

    # (9) .npy inputs
    c = "npy-input"
    add("npy-negative-dim", c, npy_input(lambda x: _hdr("(-1, 1)")))
    add("npy-negative-dims-product-positive", c, npy_input(lambda x: _hdr("(-1, -3, 64, 64)")))
    add("npy-huge-dims-product-zero", c, npy_input(lambda x: _hdr("(1099511627776, 1099511627776)")))
    add("npy-dims-wrap-to-size", c,
        npy_input(lambda x: _hdr("(" + ", ".join(map(str, _wrapping_shape(list(x.shape), x.itemsize))) + ")")))
    add("npy-dim-beyond-int64", c, npy_input(lambda x: _hdr("(1000000000000000000000000000000,)")))
    add("npy-dim-not-a-number", c, npy_input(lambda x: _hdr("(1, 3, x, 64)")))
    add("npy-truncated-data", c, npy_input(lambda x: _hdr(_shape(x)), lambda x: x.tobytes()[: x.nbytes // 2]))
    add("npy-header-longer-than-file", c, npy_input(lambda x: _hdr(_shape(x)), lambda x: b"", hlen=60000))
    add("npy-header-without-shape", c, npy_input(lambda x: "{'descr': '<f4', 'fortran_order': False, }"))
    add("npy-header-ends-after-key", c, npy_input(lambda x: "{'descr':", lambda x: b""))
    add("npy-header-ends-after-colon-unpadded", c, npy_input(lambda x: "{'descr':          ", lambda x: b"", pad=False))
    add("npy-shape-unclosed", c, npy_input(lambda x: "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 64, 64"))
    add("npy-float64", c, npy_raw(lambda x: _npy_saved(x.astype(np.float64))))
    add("npy-big-endian", c, npy_raw(lambda x: _npy_saved(x.astype(">f4"))))
    add("npy-complex64", c, npy_raw(lambda x: _npy_saved(x.astype(np.complex64))))
    add("npy-object-dtype", c, npy_input(lambda x: _hdr(_shape(x), descr="|O")))
    add("npy-fortran-order", c, npy_input(lambda x: _hdr(_shape(x), fortran="True")))
    add("npy-rank-9", c, npy_input(lambda x: _hdr("(" + "1, " * (9 - x.ndim) + _shape(x)[1:])))
    add("npy-empty-file", c, npy_raw(lambda x: b""))
    add("npy-not-npy", c, npy_raw(lambda x: b"this is not a .npy file\n"))
    add("npy-version-2-header", c, npy_input(lambda x: _hdr(_shape(x)), version=2))
    add("npy-trailing-bytes", c, npy_input(lambda x: _hdr(_shape(x)), lambda x: x.tobytes() + b"\0" * 100))

    # (10) --threads
    c = "threads"
    add("threads-negative", c, threads("-1"))
    add("threads-one-million", c, threads("1000000"), native=True)
    add("threads-int-max", c, threads("2147483647"), native=True)
    add("threads-beyond-int", c, threads("99999999999"))
    add("threads-not-a-number", c, threads("many"))
    add("threads-one", c, threads("1"))

    # (11) manifest.json
    c = "manifest"

    def files_entry(**changes):
        def f(m, c_):
            for k, v in changes.items():
                m["files"][c_.rel["plan"]][k] = v
        return on_manifest(f)

    add("files-bytes-string", c, files_entry(bytes="1234"))
    add("files-bytes-negative", c, files_entry(bytes=-1))
    add("files-bytes-1e300", c, files_entry(bytes=1e300))
    add("files-sha256-null", c, files_entry(sha256=None))
    add("files-missing", c, on_manifest(lambda m, c_: m.pop("files")))
    add("files-array-for-object", c, on_manifest(lambda m, c_: m.update(files=list(m["files"].values()))))
    add("files-plan-unlisted", c, on_manifest(lambda m, c_: m["files"].pop(c_.rel["plan"])))
    add("targets-missing", c, on_manifest(lambda m, c_: m.pop("targets")))
    add("targets-empty", c, on_manifest(lambda m, c_: m.update(targets=[])))
    add("targets-object-for-array", c, on_manifest(lambda m, c_: m.update(targets={"t": c_.target(m)})))
    add("target-kind-unknown-device", c, on_target(kind="tpu"))
    add("target-kind-cuda-without-sm", c, on_target(kind="cuda"))
    add("target-arch-unknown", c, on_target(arch="riscv64"))
    add("target-cpu-features-string", c, on_target(cpu_features="avx2"))
    add("target-plan-number", c, on_target(plan=123))
    add("target-plan-is-the-weights", c, on_manifest(lambda m, c_: c_.target(m).update(plan=c_.rel["weights"])))
    add("manifest-version-string", c, on_manifest(lambda m, c_: m.update(version="1")))
    add("format-wrong", c, on_manifest(lambda m, c_: m.update(format="packager-plan")))
    add("name-missing", c, on_manifest(lambda m, c_: m.pop("name")))
    add("manifest-json-array", c, write_text("manifest", "[]"), sign=False)
    add("manifest-trailing-garbage", c,
        lambda c_: (c_.pkg / "manifest.json").write_text((c_.pkg / "manifest.json").read_text() + "\n}{"), sign=False)
    add("tampered-weights-unsigned", c, flip_byte("weights"), sign=False)
    add("tampered-plan-unsigned", c, set_tensor(_in, offset=lambda t, pr: t["offset"] + 64), sign=False)
    assert len({v.name for v in out}) == len(out), "variant names must be unique (they name folders)"
    return out


