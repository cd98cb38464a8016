"""Two workers: place a model on two TF gRPC worker processes and measure it against what users run instead.

Run: python examples/two_workers.py   (or ./scripts/demo.sh --workers)

Starts two local workers (``placer.LocalCluster``), each pinned to one core with one thread, inside a
loopback-only network namespace (the script re-runs itself in one: TensorFlow's gRPC servers listen on
all interfaces), connects to them and places a small decoder with autoplace's defaults (``replicas="auto"``:
one copy spread or pipelined over both workers, or a copy on each, whichever is predicted fastest). Then it
measures, interleaved on the same batch: the placed model, the model on one worker (``placed.measure``'s
baseline) and a copy of the model per worker by hand (data parallelism), and prints each beside
autoplace's prediction. On a machine with fewer than two free cores the workers share them, and the
speedups shrink with it. The logical-CPU quickstart (``examples/quickstart.py``) shares one process's
cores between its devices, where spreading rarely pays.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from placer.errors import DeviceError  # noqa: E402  (TensorFlow-free: before the re-run)
from placer.measure.cluster import rerun_in_loopback_namespace  # noqa: E402

BATCH = 32


def decoder(vocab: int = 2000, seq: int = 64, dim: int = 256, blocks: int = 2):
    import keras

    ids = keras.Input((seq,), dtype="int32", name="ids")
    h = keras.layers.Embedding(vocab, dim, name="embed")(ids)
    for b in range(blocks):
        a = keras.layers.MultiHeadAttention(4, dim // 4, name=f"att{b}")(h, h, use_causal_mask=True)
        h = keras.layers.LayerNormalization(name=f"ln{b}a")(h + a)
        f = keras.layers.Dense(4 * dim, activation="gelu", name=f"ff{b}a")(h)
        h = keras.layers.LayerNormalization(name=f"ln{b}b")(h + keras.layers.Dense(dim, name=f"ff{b}b")(f))
    return keras.Model(ids, keras.layers.Dense(vocab, name="head")(h), name="decoder")


def main() -> int:
    try:
        code = rerun_in_loopback_namespace(sys.argv)
    except DeviceError as e:
        print(f"skipped: {e}")
        return 0
    if code is not None:
        return code
    import keras
    import numpy as np
    import tensorflow as tf

    import placer
    from placer.measure.steps import measure_steps
    from placer.tf.measuring import copy_per_device

    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        keras.utils.set_random_seed(0)
        model = decoder()
        x = np.random.default_rng(0).integers(0, 2000, (BATCH, 64)).astype("int32")
        print(f"placing {model.name} on {devices} (batch {BATCH}) …", flush=True)
        placed = placer.autoplace(model, devices, batch_size=BATCH)
        print(placed.plan.summary())
        print("why:", next((line for line in reversed(placed.plan.log) if "copies" in line or "one device" in line),
                           "the solver's plan"))
        measured = placed.measure(x, repeats=10, min_time_s=2)  # against the model on worker 0 (measured)
        print(measured.summary())

        copy_per_worker, _ = copy_per_device(model, devices)  # data parallelism by hand

        xs = tf.constant(x)
        ours, theirs = measure_steps(placed.placement.functions.forward(False).function, copy_per_worker, [xs],
                                     repeats=10, warmup=2, min_time_s=2)
        predicted = placed.plan.predicted_step_time_s
        print(f"placed: {1e3 * np.median(ours):.1f} ms measured ({1e3 * predicted:.1f} ms predicted); "
              f"a copy per worker by hand: {1e3 * np.median(theirs):.1f} ms measured; "
              f"placed / by hand: {np.median(theirs) / np.median(ours):.2f}× (same rounds, interleaved)")
        same = np.allclose(placed(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
        print(f"placed outputs equal the model's (within 1e-5): {same}")
    sys.stdout.flush()
    os._exit(0 if same else 1)  # the workers are stopped; skip TensorFlow's teardown of functions on them


if __name__ == "__main__":
    sys.exit(main())
