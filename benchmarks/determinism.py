"""Same model, options and seed in fresh processes: is the plan the same every time?

Runs the placement of ``tests/test_training.py::test_training_footprint_is_planned_under_each_devices_capacity``
(a 5-layer MLP's training step, analytic T4 costs and a given
shared-processor capacity ``--share`` so that no measurement noise enters,
2 logical CPU devices each capped at ``--cap`` × the one-device predicted
peak) in ``--runs`` fresh Python processes and counts the distinct plans
and the failures. ``--share measure`` measures the capacity instead, as
autoplace does by default. On 2026-12-01, with a cap of 0.7, 4 of
14 runs raised ``InsufficientMemoryError`` and the others found one plan
whose predicted peak varied (2,777,624 or 2,778,648 B): TensorFlow creates
the gradient ops in an order that varies between runs, and the problem
builder followed it. With ``placer.core.build.canonical_order`` every run
gives one outcome (8 of 8 at cap 0.7: the plan's peak is 2,908,696 B, over
that cap; 3 of 3 at 0.8 and 2 of 2 at 0.75: placed).

On 2026-12-03 (simulated descent, measured shared capacity) 5 runs at cap
0.8 gave 5 outcomes, one ``InsufficientMemoryError`` (as in clean-clone
CI): the logical CPUs' shared capacity was measured in every run (1.47,
1.49, ...) and moved the plan, the analytic op costs did not. With the
capacity given, see ``benchmarks/results/determinism.md``.

    python benchmarks/determinism.py [--runs 10] [--cap 0.7] [--share 2.0|measure]

``--warm-cache MODEL ...`` checks what a user re-running a placement sees: the benchmark workloads
(``benchmarks/workloads.py``, forward pass, 4 logical CPUs, everything measured as ``autoplace`` does by
default: op times, runtime factor, shared capacity) placed once to fill a fresh profile cache, then in
``--runs`` fresh processes reading it; each run also saves the op graph and re-plans it offline with
``placer.solve(*placer.load_graph(path))`` (no options: the file's). One plan per model, and the offline
plan equal to ``autoplace``'s in every run, is the target.

    python benchmarks/determinism.py --warm-cache multi_tower_mlp transformer lstm_seq2seq [--runs 5]
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import hashlib, json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras, placer
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((128,))] + [keras.layers.Dense(256, activation="relu") for _ in range(4)]
                             + [keras.layers.Dense(4)], name="wide_mlp")
    model.compile(optimizer="adam", loss="mse")
    share = None if sys.argv[2] == "measure" else float(sys.argv[2])
    opts = dict(training=True, batch_size=32, time_limit_s=2, hardware={"CPU": "nvidia-t4"}, profile_cache=False,
                shared_capacity="measure" if share is None else share)
    one = placer.autoplace(model, ["/CPU:0"], **opts)
    cap = int(float(sys.argv[1]) * one.plan.predicted_peak_memory_bytes[0])
    try:
        two = placer.autoplace(model, [placer.DeviceSpec(d, memory_bytes=cap) for d in ("/CPU:0", "/CPU:1")], **opts)
        digest = hashlib.sha256(json.dumps(sorted(two.plan.assignment.items())).encode()).hexdigest()[:12]
        print("RESULT", digest, two.plan.solver, max(two.plan.predicted_peak_memory_bytes))
    except placer.InsufficientMemoryError:
        print("RESULT failed InsufficientMemoryError")
""")


WARM_CHILD = textwrap.dedent("""
    import hashlib, json, os, sys, tempfile
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    import keras, placer
    sys.path.insert(0, sys.argv[2])
    from workloads import WORKLOADS
    builder, batch = WORKLOADS[sys.argv[1]]
    keras.utils.set_random_seed(0)
    model = builder()
    placed = placer.autoplace(model, [f"/CPU:{i}" for i in range(4)], batch_size=min(batch, 16),
                              profile_cache=sys.argv[3], measure_call=False)
    digest = lambda a: hashlib.sha256(json.dumps(sorted((str(k), v) for k, v in a.items())).encode()).hexdigest()[:12]
    offline = placer.solve(*placer.load_graph(placed.save_graph(os.path.join(tempfile.mkdtemp(), "ops.json"))))
    print("RESULT", digest(placed.plan.assignment), placed.plan.solver,
          "offline=same" if offline.assignment == placed.plan.assignment else "offline=DIFFERS",
          [line for line in placed.plan.log if line.startswith(("op times", "host figures"))])
""")


def warm_cache(models: list[str], runs: int) -> None:
    """:data:`WARM_CHILD` per model: once to fill a fresh cache, then ``runs`` times reading it."""
    import os
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    for name in models:
        cache = tempfile.mkdtemp(prefix="autoplace-determinism-")
        outcomes: collections.Counter[str] = collections.Counter()
        for i in range(runs + 1):
            proc = subprocess.run([sys.executable, "-c", WARM_CHILD, name, here, cache], capture_output=True,
                                  text=True, timeout=1800)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")),
                        f"RESULT crashed {proc.returncode}: {proc.stderr[-300:]}")[len("RESULT "):]
            print(f"{name} {'cold' if i == 0 else f'warm {i}'}: {line}", flush=True)
            if i:
                outcomes[line.split(" [")[0]] += 1
        print(f"{name}: {len(outcomes)} distinct outcome(s) in {runs} warm runs: {dict(outcomes)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--cap", type=float, default=0.7)
    ap.add_argument("--share", default="2.0", help="the logical CPUs' shared capacity, or 'measure'")
    ap.add_argument("--warm-cache", nargs="+", metavar="MODEL", default=None,
                    help="instead: these workloads, measured placements read from a warm cache (see above)")
    args = ap.parse_args()
    if args.warm_cache:
        warm_cache(args.warm_cache, args.runs)
        return
    outcomes: collections.Counter[str] = collections.Counter()
    for i in range(args.runs):
        proc = subprocess.run([sys.executable, "-c", CHILD, str(args.cap), args.share], capture_output=True, text=True, timeout=600)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), f"RESULT crashed {proc.returncode}")
        outcomes[line[len("RESULT "):]] += 1
        print(f"run {i + 1}: {line[len('RESULT '):]}", flush=True)
    print(f"{len(outcomes)} distinct outcome(s) in {args.runs} runs:")
    for outcome, count in outcomes.most_common():
        print(f"  {count} × {outcome}")


if __name__ == "__main__":
    main()
