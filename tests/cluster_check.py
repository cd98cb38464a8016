"""Run by tests/test_cluster.py inside a loopback-only network namespace (not collected by pytest).

Starts two pinned gRPC workers, connects, calibrates the link between them,
places a small Keras model across them and compares outputs with the
original; prints one JSON line. The workers are stopped on every path.
"""

import json
import os
import sys

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


def main() -> None:
    out = {}
    with LocalCluster(2) as cluster:
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
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
