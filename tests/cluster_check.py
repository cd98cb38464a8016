"""Run by tests/test_cluster.py inside a loopback-only network namespace (not collected by pytest).

Starts two pinned gRPC workers (from a directory holding planted ``tensorflow``
and ``placer`` packages, which they must not import), connects, calibrates the
link between them, places a small Keras model across them and compares
outputs with the original. Then the faults: worker 1 frozen (SIGSTOP) under a
direct call and under ``predict``, continued, then killed. Prints one JSON
line. The workers are stopped on every path.
"""

import json
import os
import signal
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import placer  # noqa: E402
from placer.measure.cluster import LocalCluster  # noqa: E402
from placer.measure.links import measure_link  # noqa: E402


def model() -> keras.Model:
    inp = keras.Input((32,))
    towers = [keras.layers.Dense(64, activation="relu", name=f"t{i}")(inp) for i in range(2)]
    out = keras.layers.Dense(4, name="head")(keras.layers.Concatenate()(towers))
    return keras.Model(inp, out, name="two_towers")


def plant(directory: str) -> str:
    """Packages named like the real ones in ``directory``; importing either writes ``HIJACKED``."""
    marker = os.path.join(directory, "HIJACKED")
    for pkg in ("tensorflow", "placer"):
        os.makedirs(os.path.join(directory, pkg))
        with open(os.path.join(directory, pkg, "__init__.py"), "w") as f:
            f.write(f"open({marker!r}, 'w').write({pkg!r})\n")
    return marker


def timed_error(fn) -> dict:
    t = time.monotonic()
    try:
        fn()
        return {"error": None, "s": time.monotonic() - t}
    except Exception as e:  # noqa: BLE001  (reported to the test, which checks the type)
        return {"error": type(e).__name__, "message": str(e)[:300], "s": time.monotonic() - t}


def main() -> None:
    out = {}
    here = os.getcwd()
    planted = tempfile.mkdtemp()
    marker = plant(planted)
    os.chdir(planted)  # the workers start here
    with LocalCluster(2) as cluster:
        os.chdir(here)
        out["hijacked"] = os.path.exists(marker)
        out["worker_pids"] = [p.pid for p in cluster.procs]
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster.spec))
        devices = [cluster.device(0), cluster.device(1)]
        names = {d.name for d in tf.config.list_logical_devices()}
        out["devices_visible"] = all(d in names for d in devices)
        fit = measure_link(devices[0], devices[1], repeats=3)
        out["link"] = {"latency_s": fit.link.latency_s, "bandwidth_bytes_per_s": fit.link.bandwidth_bytes_per_s,
                       "r2": fit.r2}
        m = model()
        x = np.random.default_rng(0).standard_normal((8, 32)).astype("float32")
        ref = m.predict(x, verbose=0)
        placed = placer.autoplace(m, devices, batch_size=8, time_limit_s=1, algorithm="round_robin",
                                  profile_cache=False)
        got = placed(x).numpy()
        out["max_abs_diff"] = float(np.abs(got - ref).max())
        out["used_devices"] = sorted(set(placed.plan.assignment.values()))
        out["variable_devices"] = sorted({v.value.device for v in placed.variables})
        out["healthy"] = timed_error(lambda: (placed.check_workers(), cluster.check()))
        pid = cluster.procs[1].pid
        os.kill(pid, signal.SIGSTOP)
        out["frozen_call"] = timed_error(lambda: placed(x))
        out["frozen_predict"] = timed_error(lambda: placed.predict(x, verbose=0))
        out["frozen_check"] = timed_error(lambda: cluster.check(timeout_s=2))
        os.kill(pid, signal.SIGCONT)
        time.sleep(1)
        out["resumed_max_abs_diff"] = float(np.abs(placed(x).numpy() - ref).max())
        os.kill(pid, signal.SIGKILL)
        cluster.procs[1].wait()
        out["killed_call"] = timed_error(lambda: placed(x))
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
