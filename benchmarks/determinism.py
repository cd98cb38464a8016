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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--cap", type=float, default=0.7)
    ap.add_argument("--share", default="2.0", help="the logical CPUs' shared capacity, or 'measure'")
    args = ap.parse_args()
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
