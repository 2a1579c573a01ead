"""Timing candidates on a board behind a TVM RPC tracker, tested on loopback: a tracker and an
RPC server started here (separate processes) stand in for the board."""
from __future__ import annotations

import json
import shutil
import socket
import time
from dataclasses import replace

import numpy as np
import pytest
import tvm
from tvm import te

from support.kernel_cases import host_target
from packager.errors import UserError
from packager.optimize.schedule.measure import rpc as R
from packager.optimize.schedule.measure.timing import can_measure, time_candidates
from packager.optimize.schedule.rules.cpu import CpuRules
from packager.targets import RpcDevice, resolve
from packager.spec import TargetSpec

KEY = "loopback"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(ready, what: str, seconds: float = 60) -> None:
    end = time.time() + seconds
    while not ready():
        if time.time() > end:
            raise TimeoutError(f"{what} did not come up in {seconds:.0f} s")
        time.sleep(0.2)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def rpc_device():
    """A tracker and one RPC server registered under KEY, both on 127.0.0.1."""
    pytest.importorskip("tornado")
    from tvm import rpc
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker

    tracker = Tracker(host="127.0.0.1", port=_free_port(), port_end=65000, silent=True)
    _wait(lambda: _accepts(tracker.port), "the RPC tracker")
    server = Server(host="127.0.0.1", port=_free_port(), port_end=65000, key=KEY,
                    tracker_addr=("127.0.0.1", tracker.port), silent=True)
    _wait(lambda: KEY in rpc.connect_tracker("127.0.0.1", tracker.port).summary()["queue_info"],
          "the RPC server's registration")
    yield RpcDevice("127.0.0.1", tracker.port, KEY, 300, "targets[0].rpc")
    R._SESSIONS.clear()
    server.terminate()
    tracker.terminate()


def _matmul(n: int, scale: float = 1.0):
    a = te.placeholder((n, n), name="a")
    b = te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j] * scale, axis=k), name="matmul")
    return te.create_prim_func([a, b, c])


def test_candidates_are_timed_on_the_rpc_device(rpc_device, monkeypatch):
    """Timed there, not here (this process's CPU device is made unusable), and a candidate that
    computes something else is still dropped against the first one's output."""
    target = replace(host_target(), rpc=rpc_device)
    assert can_measure(target)
    rules = CpuRules(target)
    right, wrong = rules.schedule(_matmul(64))[0], rules.schedule(_matmul(64, 2.0))[0]

    def no_local_device(*_a, **_k):
        raise AssertionError("a candidate ran on this machine")
    monkeypatch.setattr(tvm, "cpu", no_local_device)
    times = time_candidates([right, right, wrong], target, repeat=1)
    assert times[0] > 0 and times[1] > 0 and times[2] is None


def test_unknown_key_names_the_keys_the_tracker_knows(rpc_device):
    with pytest.raises(UserError, match=rf"targets\[0\].rpc: RPC device 'rk3588' via tracker .*"
                                        rf"the tracker knows: {KEY}\); start one on the board"):
        R.session(replace(rpc_device, key="rk3588"))


def test_unreachable_tracker_is_a_one_line_error_at_once():
    dev = RpcDevice("127.0.0.1", _free_port(), "board", 60, "targets[1].rpc")
    t0 = time.time()
    with pytest.raises(UserError, match=r"targets\[1\].rpc: .*cannot reach the tracker .*rpc_tracker") as e:
        R.session(dev)
    assert time.time() - t0 < 10 and "\n" not in str(e.value)


def test_a_target_without_rpc_that_cannot_run_here_is_not_measured():
    arm = resolve(TargetSpec("arm64", {}, "t"))
    assert not can_measure(arm)
    assert can_measure(replace(arm, rpc=RpcDevice("h", 1, "b")))


@pytest.mark.slow
def test_build_measures_on_the_rpc_device_and_records_it(rpc_device, sample_root, tmp_path):
    """`pack build` with `targets[0].rpc`: Gensor's top-k timed on the RPC server, the report says
    where, and the records land in the tuning database like local ones, under the device's key."""
    from packager.build import build
    from packager.optimize.schedule.measure.database import TuningDatabase
    from packager.spec import load_spec

    folder = tmp_path / "mlp"
    shutil.copytree(sample_root / "mlp", folder, ignore=shutil.ignore_patterns("dist"))   # not what other tests built
    spec_text = (folder / "spec.yaml").read_text().replace(
        "targets: [x86-64, arm64]",
        f"targets: [{{name: x86-64, rpc: {{tracker: '127.0.0.1:{rpc_device.port}', key: {KEY}}}}}]\n"
        f"optimize: {{tuning: {{database: {tmp_path / 'db'}}}}}")
    (folder / "spec.yaml").write_text(spec_text)
    host_target()                                           # skips where x86-64 cannot run here
    out = build(load_spec(folder / "spec.yaml"), log=lambda _m: None)
    report = json.loads((out / "build_report.json").read_text())
    schedule = next(p for p in report["targets"][0]["kernel_passes"] if p["pass"] == "schedule")
    assert f"measured on RPC device '{KEY}' via tracker 127.0.0.1:{rpc_device.port}" in schedule["summary"]
    records = TuningDatabase(tmp_path / "db").records
    remote = [r for r in records.values() if r["meta"]["target"].endswith(f"/rpc:{KEY}")]
    timed = [r for r in remote if r["meta"]["kind"] == "gensor-cpu" and r.get("measured_ms") is not None]
    assert timed and all(r["measured"] and np.isfinite(r["measured_ms"]) for r in timed)
