"""One GPU split into two logical GPUs (memory limits each): autoplace's default against what users run instead.

Places two workloads (the 4-tower MLP at batch 256 and a small decoder at batch 32) on the two logical
GPUs with autoplace's defaults, then measures, interleaved: the placed model, the model on the first
logical GPU, and a copy per logical GPU by hand (each half the batch), and prints each beside autoplace's
predicted step. The two logical GPUs share one chip's compute (as logical CPUs share cores), so this
checks that the search and the emitted copies run on a GPU and that predictions hold there, not a
two-chip speedup. Exits 0 with a message where no GPU is visible.

    python benchmarks/gpu_check.py [--memory-mb 4096] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memory-mb", type=int, default=4096, help="memory limit of each logical GPU")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        print("skipped: no GPU visible to TensorFlow")
        return 0
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=args.memory_mb)] * 2)
    import keras
    import numpy as np

    import placer
    from placer.tf.measuring import copy_per_device
    from speedup import interleaved_times, median_spread
    from strategy import decoder, towers

    devices = [d.name for d in tf.config.list_logical_devices("GPU")]
    print(f"logical GPUs: {devices} ({args.memory_mb} MB each) on {tf.config.experimental.get_device_details(gpus[0])}")
    failed = 0
    for name, builder, batch, make in (
            ("towers", towers, 256, lambda rng: rng.standard_normal((256, 256)).astype("float32")),
            ("decoder", decoder, 32, lambda rng: rng.integers(0, 2000, (32, 64)).astype("int32"))):
        keras.utils.set_random_seed(0)
        model = builder()
        x = tf.constant(make(np.random.default_rng(0)))
        specs = [placer.DeviceSpec(d, memory_bytes=args.memory_mb << 20) for d in devices]
        placed = placer.autoplace(model, specs, batch_size=batch)
        per_copy, (first, _) = copy_per_device(model, devices)

        @tf.function(autograph=False)
        def one(v):
            with tf.device(devices[0]):
                return first(v, training=False)

        steps = [lambda: placed(x).numpy(), lambda: one(x).numpy(), lambda: per_copy(x).numpy()]
        meds = [median_spread(t)[0] for t in interleaved_times(steps, args.repeats)]
        plan = placed.plan
        chosen = f"{plan.replicas} copies × m={plan.microbatches}" if plan.replicas > 1 else \
            f"one copy on {len(set(plan.assignment.values()))} device(s), m={plan.microbatches}"
        err = (plan.predicted_step_time_s - meds[0]) / meds[0]
        print(f"{name}: autoplace ({chosen}) {1e3 * meds[0]:.2f} ms measured, {1e3 * plan.predicted_step_time_s:.2f}"
              f" ms predicted ({100 * err:+.1f}%); one logical GPU {1e3 * meds[1]:.2f} ms; a copy per logical GPU "
              f"{1e3 * meds[2]:.2f} ms (measured, interleaved, {args.repeats} rounds)")
        if not np.allclose(placed(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-4):
            print(f"{name}: placed outputs differ from the model's")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
