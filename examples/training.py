"""Placed training: fit a small CNN across 4 logical CPU devices and compare with Keras' own fit.

Run: python examples/training.py

The placed model trains with Keras' ``fit`` (progress bar, callbacks,
``History``) on the placed training step; the script prints both loss
curves and the largest difference. Logical devices share the machine's
cores, so this shows placement and numerics, not speed
(``benchmarks/training.py`` measures speed on real gRPC workers).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import placer  # noqa: E402


def cnn() -> keras.Model:
    inp = keras.Input((16, 16, 3), name="image")
    h = keras.layers.Conv2D(16, 3, activation="relu", name="conv1")(inp)
    h = keras.layers.BatchNormalization(name="bn1")(h)
    h = keras.layers.MaxPooling2D(name="pool1")(h)
    h = keras.layers.Conv2D(32, 3, activation="relu", name="conv2")(h)
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    h = keras.layers.Dropout(0.2, name="drop")(h)
    return keras.Model(inp, keras.layers.Dense(10, name="logits")(h), name="cnn")


def main() -> None:
    keras.utils.set_random_seed(0)
    settings = dict(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"])
    model = cnn()
    model.compile(**settings)
    reference = keras.models.clone_model(model)          # an identical copy, for comparison only
    for a, b in zip(reference.variables, model.variables):
        a.assign(b)
    reference.compile(**settings)

    devices = [f"/CPU:{i}" for i in range(4)]
    placed = placer.autoplace(model, devices, training=True, batch_size=16, algorithm="contiguous",
                              targets=tf.TensorSpec((None,), "int32"))
    print(placed.summary())

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 10, 256).astype("int32")
    fit = dict(batch_size=16, epochs=2, shuffle=False, validation_split=0.25)
    ours = placed.fit(x, y, **fit, verbose=2)
    theirs = reference.fit(x, y, **fit, verbose=0)
    for key in ("loss", "val_loss", "accuracy"):
        print(f"{key:>9}: placed {np.round(ours.history[key], 6).tolist()}  "
              f"model.fit {np.round(theirs.history[key], 6).tolist()}")
    diff = max(float(np.abs(a - b).max()) for a, b in zip(placed.get_weights(), reference.get_weights()))
    print(f"largest weight difference after training (measured): {diff:.3g}")


if __name__ == "__main__":
    main()
