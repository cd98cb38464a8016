"""Is ``placed.measure``'s baseline what a user runs on one worker? Two gRPC workers, a 4-tower MLP.

``placed.measure`` times the placed model against the original on the plan's first device. This times, in
one process and interleaved: the baseline ``measure`` uses now (every op and a copy of every weight on
worker 0), a hand-built one-worker copy (the model cloned under ``tf.device(worker 0)``, its weights copied
there: what a user runs instead), and the baseline ``measure`` used before (the user's model run under
``tf.device(worker 0)``, its weights left in this process: every call ships them to the worker). Then it
prints ``placed.measure()``'s own figures. Writes ``benchmarks/results/measure_baseline.md``.

    python benchmarks/measure_baseline.py [--batch 256] [--rounds 60]

Runs itself inside a loopback-only network namespace (TF's servers listen on all interfaces).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from placer.measure.cluster import LocalCluster, rerun_in_loopback_namespace  # noqa: E402


def towers(width: int = 512) -> "object":
    import keras

    inp = keras.Input((256,), name="features")
    outs = [keras.layers.Dense(width, activation="relu", name=f"t{i}b")(
        keras.layers.Dense(width, activation="relu", name=f"t{i}a")(inp)) for i in range(4)]
    return keras.Model(inp, keras.layers.Dense(10, name="head")(keras.layers.Concatenate()(outs)), name="towers")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--out", default=str(HERE / "results" / "measure_baseline.md"))
    args = ap.parse_args()
    code = rerun_in_loopback_namespace(sys.argv)
    if code is not None:
        return code
    import keras
    import numpy as np
    import tensorflow as tf

    import placer
    from placer.measure.steps import measure_steps
    from placer.tf.measuring import one_device_original

    lines = [f"# `placed.measure`'s baseline on two gRPC workers ({datetime.date.today()})", "",
             f"`python benchmarks/measure_baseline.py --batch {args.batch} --rounds {args.rounds}`: two one-core "
             "workers (LocalCluster), a 4-tower MLP (4 × 2 dense layers of 512, batch "
             f"{args.batch}), the plan `contiguous` over both workers. Medians ± half IQR of interleaved rounds, "
             "outputs fetched.", ""]
    with LocalCluster(2, threads=1) as cluster:
        devices = placer.connect(cluster)
        keras.utils.set_random_seed(0)
        model = towers()
        x = np.random.default_rng(0).standard_normal((args.batch, 256)).astype("float32")
        placed = placer.autoplace(model, devices, batch_size=args.batch, algorithm="contiguous",
                                  objective="throughput", split_margin=0, profile_cache=False)
        worker0 = devices[0]
        traced = placed.placement.functions.forward_trace(False)
        now, _copies = one_device_original(traced, worker0)
        with tf.device(worker0):
            hand = keras.models.clone_model(model)
            hand.set_weights(model.get_weights())

        def on_worker0(m):
            @tf.function(autograph=False)
            def step(xs):
                with tf.device(worker0):
                    return m(xs, training=False)
            return step

        hand_step, old_step = on_worker0(hand), on_worker0(model)
        xs = tf.constant(x)
        a, b = measure_steps(now, hand_step, [xs], repeats=args.rounds, warmup=5, min_time_s=2)
        c, d = measure_steps(old_step, hand_step, [xs], repeats=args.rounds, warmup=5, min_time_s=2)

        def ms(s):
            q1, q2, q3 = np.percentile(s, [25, 50, 75])
            return f"{1e3 * q2:.2f} ± {1e3 * (q3 - q1) / 2:.2f} ms"

        m = placed.measure(x, repeats=args.rounds, min_time_s=2)
        lines += ["| what | step | against the hand-built copy (same rounds) |", "|---|---|---|",
                  f"| `measure`'s baseline now: every op and a copy of every weight on worker 0 | {ms(a)} | "
                  f"{np.median(a) / np.median(b):.3f}× of {ms(b)} |",
                  f"| `measure`'s baseline before: the user's model on worker 0, its weights in the client | "
                  f"{ms(c)} | {np.median(c) / np.median(d):.3f}× of {ms(d)} |", "",
                  f"`placed.measure()` (contiguous split over both workers): {m.summary()}", ""]
        print("\n".join(lines), flush=True)
    Path(args.out).write_text("\n".join(lines))
    print(f"written: {args.out}")
    os._exit(0)  # the workers are stopped; skip TensorFlow's teardown of functions registered on them


if __name__ == "__main__":
    sys.exit(main())
