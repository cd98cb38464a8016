"""Digest of what the TensorFlow back end emits, to check that a change of its structure keeps it.

``benchmarks/plan_digest.py`` checks the planner on saved op graphs; this
checks the other half: for a set of small Keras models placed on 4 logical
CPU devices with *analytic* op costs (``hardware=``: no measurement, so the
plans are deterministic) and the measured stages off (links, shared
processors, call cost), each case's plan, the graph of the placed
``tf.function`` TensorFlow runs (every node's name, op, device and inputs),
the export's stored graph and manifest (inference), and a hash of the placed
outputs (or the training step's logs) on a fixed batch. Two versions of the
back end that emit the same functions give identical digests.

    python benchmarks/emit_digest.py OUT.json [--compare BEFORE.json] [--cases NAME ...] [--cluster]

``--cluster`` runs the cases that need processes instead (acknowledged
transfers, ``sends="prompt"``): on two one-thread gRPC workers of a
``LocalCluster``, inside a loopback-only network namespace.

``--compare`` prints each case whose digest differs, field by field, and
exits 1 when any does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

if os.environ.get("PYTHONHASHSEED") != "0":  # sets of op names iterate in one order in every run
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, *sys.argv])

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ["AUTOPLACE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autoplace-emit-digest-")

import tensorflow as tf  # noqa: E402

CLUSTER = "--cluster" in sys.argv
if not CLUSTER:
    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import placer  # noqa: E402

DEVICES = [f"/CPU:{i}" for i in range(4)]
#: Analytic costs: the same op times in every run (a profile would measure them).
CPU = {"name": "digest-cpu", "peak_flops": 1e11, "memory_bandwidth": 2e10, "launch_overhead_s": 5e-6}
#: ... and a slower one, where dense layers run long enough to be ordered.
SLOW = {**CPU, "name": "digest-slow-cpu", "peak_flops": 1e9}
FIXED = dict(hardware={"CPU": CPU}, shared_capacity=None, calibrate_links=False, measure_call=False, time_limit_s=2.0)


def _h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _canonical(x: object) -> object:
    """``x`` with every list of dicts sorted: the report lists the op graph's edges in the order TensorFlow
    lists each tensor's consumers, which differs from run to run."""
    if isinstance(x, dict):
        return {k: _canonical(v) for k, v in x.items()}
    if isinstance(x, list):
        items = [_canonical(v) for v in x]
        if items and all(isinstance(v, dict) for v in items):
            items.sort(key=lambda v: json.dumps(v, sort_keys=True, default=str))
        return items
    return x


def _graph_digest(gd: tf.compat.v1.GraphDef) -> str:
    # a function's captures are named by a process-wide counter ("3581"): named here by their order instead
    alias = {n.name: f"capture{i}" for i, n in enumerate(n for n in gd.node if n.name.isdigit())}

    def named(x: str) -> str:
        head, node, port = ("^", x[1:], "") if x.startswith("^") else ("", *x.partition(":")[::2])
        return head + alias.get(node, node) + (f":{port}" if port else "")

    rows = sorted((alias.get(n.name, n.name), n.op, n.device, tuple(map(named, n.input))) for n in gd.node)
    digest = _h(json.dumps(rows).encode())
    if os.environ.get("EMIT_DIGEST_DUMP"):  # each graph's rows, to see how two digests differ
        Path(os.environ["EMIT_DIGEST_DUMP"], f"{digest}.json").write_text(json.dumps(rows, indent=0))
    return digest


def _towers() -> keras.Model:
    x = keras.Input((32,), name="x")
    towers = [keras.layers.Dense(64, activation="relu", name=f"t{i}b")(keras.layers.Dense(64, activation="relu",
                                                                                             name=f"t{i}a")(x))
              for i in range(4)]
    return keras.Model(x, keras.layers.Dense(8, name="head")(keras.layers.Concatenate()(towers)), name="towers")


def _chain() -> keras.Model:
    x = keras.Input((64,), name="x")
    h = x
    for i in range(6):
        h = keras.layers.Dense(128, activation="relu", name=f"d{i}")(h)
    return keras.Model(x, keras.layers.Dense(4, name="out")(h), name="chain")


def _two_outputs() -> keras.Model:
    a, b = keras.Input((16,), name="a"), keras.Input((8,), name="b")
    h = keras.layers.Concatenate()([keras.layers.Dense(32, activation="relu", name="da")(a),
                                    keras.layers.Dense(32, activation="relu", name="db")(b)])
    return keras.Model([a, b], [keras.layers.Dense(3, name="o1")(h), keras.layers.Dense(1, name="o2")(h)],
                       name="two_outputs")


def _bn_cnn() -> keras.Model:
    x = keras.Input((12, 12, 3), name="img")
    h = keras.layers.Conv2D(8, 3, activation="relu", name="c1")(x)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Dropout(0.2, seed=1, name="drop")(keras.layers.Flatten()(h))
    return keras.Model(x, keras.layers.Dense(5, name="cls")(h), name="bn_cnn")


def _wide() -> keras.Model:
    """Two branches of 512-wide dense layers: ops long enough to order (``placer.core.order.MIN_ORDERED_OP_S``)."""
    x = keras.Input((256,), name="x")
    outs = []
    for name in "ab":
        h = keras.layers.Dense(512, activation="relu", name=f"{name}1")(x)
        outs.append(keras.layers.Dense(8, name=f"{name}_out")(keras.layers.Dense(512, name=f"{name}2")(h)))
    return keras.Model(x, outs, name="wide")


def _sample(model: keras.Model, batch: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, *t.shape[1:])).astype("float32") for t in model.inputs]


def _targets(model: keras.Model, batch: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, *t.shape[1:])).astype("float32") for t in model.outputs]


def _compiled(model: keras.Model) -> keras.Model:
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return model


#: name -> (model factory, batch, options)
CASES = {
    "towers/fwd": (_towers, 16, {}),
    "towers/fwd/round_robin/bf16": (_towers, 16, {"algorithm": "round_robin", "compression": "bf16"}),
    "wide/fwd/cp_heft/order": (_wide, 32, {"algorithm": "cp_heft", "execution_order": "auto", "devices": 2,
                                           "hardware": {"CPU": SLOW}}),
    "chain/fwd/throughput/m4": (_chain, 16, {"objective": "throughput", "microbatches": 4,
                                             "algorithm": "contiguous", "split_margin": 0}),
    "two_outputs/fwd/round_robin": (_two_outputs, 8, {"algorithm": "round_robin"}),
    "towers/train": (lambda: _compiled(_towers()), 16, {"training": True}),
    "towers/train/round_robin/bf16": (lambda: _compiled(_towers()), 16,
                                      {"training": True, "algorithm": "round_robin", "compression": "bf16"}),
    "wide/train/cp_heft/order": (lambda: _compiled(_wide()), 32,
                                 {"training": True, "algorithm": "cp_heft", "execution_order": "auto", "devices": 2,
                                  "hardware": {"CPU": SLOW}}),
    "chain/train/m2/gpipe": (lambda: _compiled(_chain()), 16, {"training": True, "microbatches": 2,
                                                               "algorithm": "contiguous", "pipeline": "gpipe",
                                                               "split_margin": 0}),
    "chain/train/m4/1f1b": (lambda: _compiled(_chain()), 16, {"training": True, "microbatches": 4,
                                                              "algorithm": "contiguous", "pipeline": "1f1b",
                                                              "objective": "throughput", "split_margin": 0}),
    "chain/train/replicas2": (lambda: _compiled(_chain()), 16, {"training": True, "replicas": 2,
                                                                "algorithm": "contiguous"}),
    "chain/train/replicas2/m2": (lambda: _compiled(_chain()), 16, {"training": True, "replicas": 2,
                                                                   "microbatches": 2, "algorithm": "contiguous",
                                                                   "split_margin": 0}),
    "two_outputs/train/round_robin": (lambda: _compiled(_two_outputs()), 8,
                                      {"training": True, "algorithm": "round_robin"}),
    "bn_cnn/train/round_robin": (lambda: _compiled(_bn_cnn()), 8, {"training": True, "algorithm": "round_robin"}),
}


def _deep() -> keras.Model:
    """Four 512-wide dense layers: a stage boundary's tensor unblocks more than a millisecond of work."""
    x = keras.Input((512,), name="x")
    h = x
    for i in range(4):
        h = keras.layers.Dense(512, activation="relu", name=f"c{i}")(h)
    return keras.Model(x, keras.layers.Dense(8, name="out")(h), name="deep")


PROMPT = {"sends": "prompt", "algorithm": "contiguous", "split_margin": 0, "hardware": {"CPU": SLOW}}
#: name -> (model factory, batch, options), run on two gRPC workers (``--cluster``).
CLUSTER_CASES = {
    "deep/fwd/prompt": (_deep, 32, PROMPT),
    "deep/fwd/m4/prompt": (_deep, 32, {**PROMPT, "microbatches": 4, "objective": "throughput"}),
    "deep/train/prompt": (lambda: _compiled(_deep()), 32, {**PROMPT, "training": True}),
    "deep/train/m2/prompt": (lambda: _compiled(_deep()), 32, {**PROMPT, "training": True, "microbatches": 2}),
}


def digest_case(name: str, devices: list[str] = DEVICES) -> dict:
    factory, batch, options = {**CASES, **CLUSTER_CASES}[name]
    keras.utils.set_random_seed(0)
    model = factory()
    options = dict(options)
    devices = devices[:options.pop("devices", len(devices))]
    placed = placer.autoplace(model, devices, batch_size=batch, **{**FIXED, **options})
    plan = placed.plan
    pairs = sorted(plan.assignment.items())
    out = {"assignment": _h(json.dumps(pairs).encode()), "microbatches": plan.microbatches,
           "pipeline": plan.pipeline, "solver": plan.solver, "op_order": _h(json.dumps(plan.op_order,
                                                                                      sort_keys=True).encode()),
           "predicted_step_s": round(plan.predicted_step_time_s, 12)}
    fn = placed.emitted.function
    out["function_graph"] = _graph_digest(fn.get_concrete_function().graph.as_graph_def())
    out["compressed_edges"] = len(placed.compressed_edges)
    report = {k: v for k, v in placed.report_data.items() if k != "stage_seconds"}  # wall times
    report["plan"] = {k: v for k, v in report["plan"].items() if k != "solve_time_s"}
    out["acknowledged"] = len(report["sends"]["acknowledged"])
    out["report"] = _h(json.dumps(_canonical(report), sort_keys=True, default=str).encode())
    x = _sample(model, batch)
    if options.get("training"):
        y = _targets(model, batch)
        xs = x[0] if len(x) == 1 else x
        ys = y[0] if len(y) == 1 else y
        logs = placed.fit(xs, ys, batch_size=batch, epochs=1, shuffle=False, verbose=0).history
        out["fit_logs"] = _h(json.dumps(logs, sort_keys=True).encode())
        out["weights"] = _h(b"".join(w.tobytes() for w in placed.get_weights()))
    else:
        got = placed(x[0] if len(x) == 1 else x)
        out["outputs"] = _h(b"".join(np.asarray(t).tobytes() for t in tf.nest.flatten(got)))
        with tempfile.TemporaryDirectory() as tmp:
            path = placed.export(os.path.join(tmp, "saved"))
            extra = Path(path) / "assets.extra" / "autoplace"
            saved = tf.compat.v1.GraphDef()
            saved.ParseFromString((extra / "graph_def.pb").read_bytes())
            out["export_graph"] = _graph_digest(saved)
            manifest = json.loads((extra / "manifest.json").read_text())
            out["export_manifest"] = _h(json.dumps(manifest, sort_keys=True).encode())
            loaded = placer.load(path)
            out["loaded_function_graph"] = _graph_digest(
                loaded.forward.get_concrete_function().graph.as_graph_def())
            back = loaded(*x)
            out["loaded_outputs"] = _h(b"".join(np.asarray(t).tobytes() for t in tf.nest.flatten(back)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--cases", nargs="+", default=None, choices=[*CASES, *CLUSTER_CASES])
    ap.add_argument("--compare", default=None, help="an earlier digest to compare with")
    ap.add_argument("--cluster", action="store_true", help="the cases on two gRPC workers")
    args = ap.parse_args()
    out = {}
    if args.cluster:
        from placer.measure.cluster import LocalCluster, rerun_in_loopback_namespace

        code = rerun_in_loopback_namespace(sys.argv)
        if code is not None:
            return code
        with LocalCluster(2, threads=1) as cluster:
            placer.connect(cluster)
            for name in args.cases or list(CLUSTER_CASES):
                out[name] = digest_case(name, [cluster.device(0), cluster.device(1)])
                print(name, out[name], flush=True)
    else:
        for name in args.cases or list(CASES):
            out[name] = digest_case(name)
            print(name, out[name], flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    if args.compare is None:
        return 0
    before = json.loads(Path(args.compare).read_text())
    differ = 0
    for name in sorted(set(before) & set(out)):
        fields = [k for k in sorted(set(before[name]) | set(out[name])) if before[name].get(k) != out[name].get(k)]
        if fields:
            differ += 1
            print(f"DIFFERS {name}: " + ", ".join(f"{k}: {before[name].get(k)} -> {out[name].get(k)}"
                                                  for k in fields))
    print(f"{len(set(before) & set(out)) - differ} of {len(set(before) & set(out))} cases identical to "
          f"{args.compare}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
