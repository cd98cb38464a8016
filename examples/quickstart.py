"""Quickstart: place a multi-tower Keras model on 4 logical CPU devices.

Run: python examples/quickstart.py  (writes out/quickstart_report.{html,json}, out/quickstart_plan.json and
out/quickstart_graph.json; open the .html page in a browser)

The plan is saved and re-applied without solving; the op graph is saved for
offline re-planning (``autoplace plan-graph out/quickstart_graph.json``).
The plan's times are predicted by the cost model; ``placed.measure`` then times the placed model
against the original on the same devices (measured), and the report shows both.
"""

import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

# Logical devices must exist before TensorFlow initialises.
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import placer  # noqa: E402


def multi_tower(width: int = 512) -> keras.Model:
    inp = keras.Input((256,), name="features")
    towers = [keras.layers.Dense(width, activation="relu", name=f"tower{i}_2")(
        keras.layers.Dense(width, activation="relu", name=f"tower{i}_1")(inp)) for i in range(4)]
    out = keras.layers.Dense(10, name="head")(keras.layers.Concatenate(name="join")(towers))
    return keras.Model(inp, out, name="multi_tower")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="autoplace: %(message)s")
    model = multi_tower()
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    placed = placer.autoplace(model, devices, batch_size=128, time_limit_s=5)
    print(placed.summary())

    x = np.random.default_rng(0).standard_normal((300, 256)).astype("float32")
    same = np.array_equal(placed.predict(x, batch_size=128), model.predict(x, batch_size=128, verbose=0))
    print(f"placed predictions identical to model.predict: {same}")
    measured = placed.measure(x[:128])  # placed vs original on these devices, interleaved (measured)
    print(measured.summary())
    path = placed.report(os.path.join("out", "quickstart_report.json"))
    page = placed.report(os.path.join("out", "quickstart_report.html"))
    print(f"report written to {path} and {page} (open it in a browser)")
    plan_path = placed.plan.save(os.path.join("out", "quickstart_plan.json"))
    again = placer.autoplace(model, devices, batch_size=128, plan=plan_path)
    print(f"plan saved to {plan_path} and re-applied without solving: "
          f"same placement {again.plan.assignment == placed.plan.assignment}")
    print(f"op graph for offline planning: {placed.save_graph(os.path.join('out', 'quickstart_graph.json'))}")
    if not same or again.plan.assignment != placed.plan.assignment:
        raise SystemExit("placed model disagrees with the original")


if __name__ == "__main__":
    main()
