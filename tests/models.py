"""Small real Keras models shared by the TF tests (built once per session)."""

import keras
import numpy as np


def branchy(width: int = 64) -> keras.Model:
    inp = keras.Input((16,), name="features")
    towers = []
    for i in range(4):
        h = keras.layers.Dense(width, activation="relu", name=f"tower{i}_a")(inp)
        h = keras.layers.Dense(width, activation="relu", name=f"tower{i}_b")(h)
        towers.append(h)
    out = keras.layers.Dense(3, name="head")(keras.layers.Concatenate(name="join")(towers))
    return keras.Model(inp, out, name="branchy")


def dense_chain(inputs: int, width: int, outputs: int, name: str) -> keras.Model:
    """Two ReLU dense layers of ``width`` (``d1``, ``d2``) and a linear ``head``, the weights seeded."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((inputs,), name="x")
    h = keras.layers.Dense(width, activation="relu", name="d1")(inp)
    h = keras.layers.Dense(width, activation="relu", name="d2")(h)
    return keras.Model(inp, keras.layers.Dense(outputs, name="head")(h), name=name)


def recommender(rows: int, dim: int, history: int = 6, name: str = "recommender",
                optimizer: keras.optimizers.Optimizer | None = None) -> keras.Model:
    """A user's ``history`` item ids → an item table of ``rows`` × ``dim`` (``items``) averaged → a small head;
    compiled with ``optimizer`` (default SGD: sparse updates of the table; Adam updates it densely) and MSE, the
    weights seeded."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((history,), dtype="int32", name="history")
    h = keras.layers.GlobalAveragePooling1D(name="pool")(keras.layers.Embedding(rows, dim, name="items")(inp))
    h = keras.layers.Dense(16, activation="relu", name="hidden")(h)
    model = keras.Model(inp, keras.layers.Dense(1, name="score")(h), name=name)
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.5), loss="mse")
    return model


def sequential() -> keras.Model:
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="tanh"),
                             keras.layers.Dense(32, activation="relu"), keras.layers.Dense(5)], name="seq")


class Subclassed(keras.Model):
    def __init__(self) -> None:
        super().__init__(name="subclassed")
        self.a = keras.layers.Dense(24, activation="relu")
        self.b = keras.layers.Dense(24, activation="relu")
        self.out = keras.layers.Dense(2)

    def call(self, x):
        return self.out(self.a(x) + self.b(x))


def subclassed() -> keras.Model:
    m = Subclassed()
    m(np.zeros((1, 10), "float32"))  # builds the layers and records the input shape
    return m


def multi_input() -> keras.Model:
    x1 = keras.Input((8,), name="left")
    x2 = keras.Input((6, 4), name="right")
    h1 = keras.layers.Dense(16, activation="relu", name="l1")(x1)
    h2 = keras.layers.Flatten(name="flat")(keras.layers.Conv1D(8, 3, name="c1")(x2))
    h = keras.layers.Concatenate(name="cat")([h1, h2])
    return keras.Model([x1, x2], [keras.layers.Dense(4, name="o1")(h), keras.layers.Dense(1, name="o2")(h)],
                       name="multi_input")


def mobilenet() -> keras.Model:
    return keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10)


def resnet50() -> keras.Model:
    return keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)


def sample(model: keras.Model, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    inputs = getattr(model, "inputs", None)
    shapes = [(batch, *t.shape[1:]) for t in inputs] if inputs else [(batch, 10)]
    xs = [rng.standard_normal(s).astype("float32") for s in shapes]
    return xs[0] if len(xs) == 1 else xs


#: name → (factory, planning batch size)
MODELS = {
    "branchy": (branchy, 8),
    "sequential": (sequential, 8),
    "subclassed": (subclassed, 8),
    "multi_input": (multi_input, 8),
    "mobilenet_v2": (mobilenet, 2),
    "resnet50": (resnet50, 2),
}
