"""Batch normalization split over micro-batches (``split_batch_norm=True``): its loss curve beside ``model.fit``'s.

A small CNN with batch normalization (two convolutions, BN, pooling, a
dense head; SGD, sparse cross-entropy) trained for ``--steps`` steps on the
same random batches: Keras' ``model.fit`` on the whole batch, and autoplace's
placement on two logical CPUs with ``microbatches=2`` (and ``4``) and
``split_batch_norm=True``: each micro-batch normalised by its own statistics,
the moving statistics updated once per micro-batch (GPipe's semantics, a
change of the math). Prints each step's loss side by side, the largest relative
difference, and the moving mean's difference at the end. A statement of the
math, not of speed: no timing.

    python benchmarks/batch_norm_split.py [--steps 20] [--batch 32] [--out benchmarks/results/batch_norm_split.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from markdown import MarkdownOut  # noqa: E402


def cnn() -> "object":
    import keras

    inp = keras.Input((16, 16, 3), name="image")
    h = keras.layers.Conv2D(8, 3, activation="relu", name="conv_a")(inp)
    h = keras.layers.BatchNormalization(name="bn_a")(h)
    h = keras.layers.MaxPooling2D(name="pool")(h)
    h = keras.layers.Conv2D(16, 3, activation="relu", name="conv_b")(h)
    h = keras.layers.BatchNormalization(name="bn_b")(h)
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    return keras.Model(inp, keras.layers.Dense(5, name="head")(h), name="bn_cnn")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", default=str(HERE / "results" / "batch_norm_split.md"))
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras

    import placer

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch * args.steps, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 5, args.batch * args.steps).astype("int32")
    settings = dict(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def fresh() -> "object":
        keras.utils.set_random_seed(0)
        m = cnn()
        m.compile(**{k: (keras.optimizers.get(v) if k == "optimizer" else v) for k, v in settings.items()})
        return m

    class Losses(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.losses: list[float] = []

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.losses.append(float(logs["loss"]))

    runs = {}
    ref = fresh()
    cb = Losses()
    ref.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    runs["model.fit"] = (cb.losses, ref.get_layer("bn_b").moving_mean.numpy())
    for m in (2, 4):
        model = fresh()
        placed = placer.autoplace(model, ["/CPU:0", "/CPU:1"], training=True, batch_size=args.batch,
                                  microbatches=m, split_batch_norm=True, algorithm="contiguous", time_limit_s=2,
                                  shared_capacity=None, targets=tf.TensorSpec((None,), "int32"))
        cb = Losses()
        placed.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
        at = [w.path for w in model.weights].index(model.get_layer("bn_b").moving_mean.path)
        runs[f"microbatches={m}"] = (cb.losses, placed.get_weights()[at])

    out = MarkdownOut()
    out("## Batch normalization over micro-batches (`split_batch_norm=True`) beside `model.fit`")
    out()
    out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/batch_norm_split.py --steps {args.steps} --batch "
        f"{args.batch}`; a CNN with two BatchNormalization layers, SGD, the same {args.steps} batches of "
        f"{args.batch} random 16×16×3 images; autoplace on two logical CPUs, `microbatches=m`, "
        "`split_batch_norm=True` (each micro-batch normalised by its own statistics, the moving statistics "
        "updated once per micro-batch). Loss per step (`fit`'s running mean of the epoch, as Keras logs it).")
    out()
    names = list(runs)
    out("| step | " + " | ".join(names) + " |")
    out("|---|" + "---|" * len(names))
    for i in range(args.steps):
        out(f"| {i + 1} | " + " | ".join(f"{runs[n][0][i]:.5f}" for n in names) + " |")
    out()
    base, base_mm = runs["model.fit"]
    for n in names[1:]:
        losses, mm = runs[n]
        rel = np.max(np.abs(np.array(losses) - base) / np.abs(base))
        out(f"- {n}: largest relative difference from `model.fit`'s losses {rel:.2e}; the last BN layer's moving "
            f"mean differs by up to {np.max(np.abs(mm - base_mm)):.3e} (its largest entry "
            f"{np.max(np.abs(base_mm)):.3e})")
    out.write(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
