"""Models no one here wrote: every ``keras.applications`` family (and ``keras_hub`` backbones where installed),
placed across 4 logical CPU devices with a forced spread, checked bit for bit, exported and reloaded.

For each architecture (random weights, a small input): ``autoplace`` with ``algorithm="round_robin"`` (every
layer group dealt out over the four devices, so every kind of layer crosses devices), ``placed.predict``
against ``model.predict`` (bit-identical), then ``placed.export`` and ``placer.load`` (the reloaded outputs
bit-identical too). ``keras_hub`` backbones take a dict of token ids whose sequence length only a sample
batch tells (``autoplace(..., sample=x)``); they run where keras_hub is installed (an optional extra: ``pip
install --no-deps keras-hub regex tokenizers sentencepiece``; its tensorflow-text dependency is not needed
for the backbones). Writes ``benchmarks/results/model_zoo.md``.

    python benchmarks/model_zoo.py [--models ConvNeXtTiny ResNet50 ...] [--out benchmarks/results/model_zoo.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["AUTOPLACE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autoplace-zoo-")

import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

import keras  # noqa: E402
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import placer  # noqa: E402
from placer.tf.trace import input_keys  # noqa: E402

DEVICES = [f"/CPU:{i}" for i in range(4)]
#: One architecture of each keras.applications family, and its input side (the smallest it takes, or 96).
APPLICATIONS = {
    "ConvNeXtTiny": 32, "DenseNet121": 32, "EfficientNetB0": 32, "EfficientNetV2B0": 32,
    "InceptionResNetV2": 75, "InceptionV3": 75, "MobileNet": 32, "MobileNetV2": 32, "MobileNetV3Small": 32,
    "NASNetMobile": 32, "ResNet50": 32, "ResNet50V2": 32, "VGG16": 32, "Xception": 71,
}
#: keras_hub backbones at small configurations (run only where keras_hub is installed).
HUB = {
    "GPT2Backbone": dict(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64,
                         max_sequence_length=16),
    "BertBackbone": dict(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64,
                         max_sequence_length=16),
}


def _application(name: str, side: int) -> tuple[keras.Model, list[np.ndarray], dict]:
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(weights=None, input_shape=(side, side, 3), classes=10)
    x = np.random.default_rng(0).standard_normal((2, side, side, 3)).astype("float32")
    return model, x, {"batch_size": 2}


def _hub(name: str, config: dict) -> tuple[keras.Model, dict, dict]:
    import keras_hub  # lazy: an optional extra

    keras.utils.set_random_seed(0)
    model = getattr(keras_hub.models, name)(**config)
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(1, 100, (2, 8)).astype("int32"), "padding_mask": np.ones((2, 8), "int32")}
    if name == "BertBackbone":
        x["segment_ids"] = np.zeros((2, 8), "int32")
    return model, x, {"sample": x}


def check(model: keras.Model, x, options: dict) -> dict:
    t = time.perf_counter()
    placed = placer.autoplace(model, DEVICES, algorithm="round_robin", time_limit_s=2, shared_capacity=None,
                              measure_call=False, profile_repeats=2, **options)
    placed_s = time.perf_counter() - t
    want = tf.nest.flatten(model.predict(x, verbose=0))
    got = tf.nest.flatten(placed.predict(x, verbose=0))
    same = len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    with tempfile.TemporaryDirectory() as tmp:
        loaded = placer.load(placed.export(os.path.join(tmp, "saved")))
        flat = [x[k] for k in input_keys(model)] if isinstance(x, dict) else [x]  # the model's input order
        back = [np.asarray(t) for t in tf.nest.flatten(loaded(*flat))]
        reloaded = len(back) == len(want) and all(np.array_equal(a, b) for a, b in zip(back, want))
        diff = max((float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(back, want)),
                   default=0.0)
    return {"ops": len(placed.plan.assignment), "devices": len(set(placed.plan.assignment.values())),
            "bit_identical": same, "reloaded_bit_identical": reloaded, "reloaded_rel_diff": diff,
            "seconds": placed_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=[*APPLICATIONS, *HUB])
    ap.add_argument("--out", default=str(HERE / "results" / "model_zoo.md"))
    args = ap.parse_args()
    try:
        import keras_hub  # noqa: F401  (lazy: an optional extra)
        hub = True
    except ImportError:
        hub = False
    rows = []
    for name in args.models:
        if name in HUB and not hub:
            rows.append((name, "skipped: keras_hub is not installed (pip install --no-deps keras-hub regex "
                               "tokenizers sentencepiece)"))
            print(rows[-1], flush=True)
            continue
        try:
            model, x, options = _application(name, APPLICATIONS[name]) if name in APPLICATIONS else \
                _hub(name, HUB[name])
            r = check(model, x, options)
            reloaded = "yes" if r["reloaded_bit_identical"] else f"NO (max rel. diff {r['reloaded_rel_diff']:.1e})"
            rows.append((name, f"{r['ops']} ops on {r['devices']} devices | {'yes' if r['bit_identical'] else 'NO'} | "
                               f"{reloaded} | {r['seconds']:.1f}"))
        except Exception as e:  # noqa: BLE001  (a row of the table: what failed, and why)
            traceback.print_exc()
            rows.append((name, f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:160]}"))
        print(rows[-1], flush=True)
    lines = [f"# Model zoo: placed with a forced spread on 4 logical CPUs ({datetime.date.today()})", "",
             "`python benchmarks/model_zoo.py`: each model with random weights at a small input, "
             "`algorithm=\"round_robin\"` over 4 logical CPU devices (2 cores), `predict` against the original's "
             "`predict`, then exported and reloaded with `placer.load`.", "",
             "| model | placement | bit-identical | reloaded bit-identical | autoplace s |", "|---|---|---|---|---|"]
    for name, result in rows:
        lines.append(f"| {name} | {result} |" if "|" in result else f"| {name} | {result} | | | |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"written: {args.out}")
    return 0 if all("FAILED" not in r and "| NO" not in r and not r.startswith("NO") for _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
