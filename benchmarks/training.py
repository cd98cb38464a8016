"""Placed training on two real TF gRPC workers: step time, bytes on the wire and loss per codec.

Two worker processes on 127.0.0.1 (``placer.measure.cluster.LocalCluster``),
each pinned to one core with one intra- and one inter-op thread. The links
are calibrated once (``placer.measure.links.calibrate_links``) and given to
the planner. Per model (ResNet50 on small images, a Transformer encoder):

1. place the training step once with ``algorithm="contiguous"`` (a two-stage
   split, so cut edges exist) and no compression, and re-apply that plan with
   ``bf16``, ``int8`` and ``auto`` compression: the same placement, only the
   codecs differ; each placement has its own copy of the weights, starting
   equal;
2. train each for ``--steps`` steps with Keras' ``fit`` (``shuffle=False``, the
   same batches), in ``--rounds`` interleaved rounds so that drift of the
   machine's speed hits every codec alike; a callback times every step;
3. report the median step time and its spread (IQR) per codec, the bytes
   that cross workers per step (at the planning batch size: the cut edges'
   tensors, compressed ones at their wire size), the compressed edges' ratio
   after/before, ``auto``'s step time against the best fixed codec, and the
   loss after the last step next to ``none``'s.

Every time printed is *measured*. Runs itself inside a loopback-only network
namespace (``unshare -rn``) because TF's servers listen on all interfaces;
exits with a message where that is not possible.

    python benchmarks/training.py [--models resnet50 transformer] [--steps 50] [--rounds 5]
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

from isolation import isolated  # noqa: E402
from markdown import MarkdownOut  # noqa: E402

CODECS = ["none", "bf16", "int8", "auto"]
#: name → (builder kwargs, batch, classes)
MODELS = {"resnet50": (dict(size=32), 8, 10), "transformer": (dict(seq=32, dim=64, heads=4, layers=2), 8, 8)}


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    client_cores = sorted(os.sched_getaffinity(0) - {0, 1})
    if client_cores:
        os.sched_setaffinity(0, client_cores)
    import keras
    import tensorflow as tf
    import workloads

    import placer
    from placer.core.devices import resolve_devices
    from placer.measure.cluster import LocalCluster
    from placer.measure.links import calibrate_links

    out = MarkdownOut()

    class StepTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []
            self.losses: list[float] = []
            self._t = 0.0

        def on_train_batch_begin(self, batch, logs=None):
            self._t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.seconds.append(time.perf_counter() - self._t)
            self.losses.append(float(logs["loss"]))

    with LocalCluster(2, pin_cores=True, threads=1) as cluster:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster.spec))
        names = [cluster.device(0), cluster.device(1)]
        devset, fits = calibrate_links(resolve_devices(names), repeats=5)
        link = fits[(0, 1)].link
        devices = [placer.DeviceSpec(n, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s, latency_s=link.latency_s)
                   for n in names]
        out("## Placed training on 2 TF gRPC workers (one pinned core, one thread each)")
        out()
        out(f"- link (calibrated): latency {link.latency_s * 1e3:.3f} ms, bandwidth "
            f"{link.bandwidth_bytes_per_s / 1e9:.3g} GB/s, R² {fits[(0, 1)].r2:.4f}")
        out(f"- {args.steps} steps per codec in {args.rounds} interleaved rounds; step times measured by a Keras "
            "callback around each `fit` step (the first step of each placement excluded: tracing)")
        out("- the same two-stage contiguous plan for every codec; bytes are per step at the planning batch")
        out()
        out("| model | codec | compressed edges | bytes across / step | compressed after/before | median step ms "
            "| IQR ms | vs none | loss after last step | loss vs none |")
        out("|---|---|---|---|---|---|---|---|---|---|")
        for name in args.models:
            kwargs, batch, classes = MODELS[name]
            builder = workloads.resnet50 if name == "resnet50" else workloads.transformer_encoder
            keras.utils.set_random_seed(0)
            model = builder(**kwargs)
            rng = np.random.default_rng(0)
            shape = (args.steps * batch, *model.inputs[0].shape[1:])
            x = rng.standard_normal(shape).astype("float32")
            y = rng.integers(0, classes, args.steps * batch).astype("int32")
            if name == "transformer":  # the encoder outputs a sequence: regress onto a fixed random one
                y = 0.5 * rng.standard_normal((args.steps * batch, *model.outputs[0].shape[1:])).astype("float32")
                settings = dict(optimizer="sgd", loss="mse")
                targets = None
            else:
                settings = dict(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=False))
                targets = tf.TensorSpec((None,), "int32")
            model.compile(**settings)
            t0 = time.perf_counter()
            placed = {"none": placer.autoplace(model, devices, training=True, batch_size=batch, targets=targets,
                                               algorithm="contiguous", objective="latency", time_limit_s=10)}
            for codec in CODECS[1:]:
                placed[codec] = placer.autoplace(model, devices, training=True, batch_size=batch, targets=targets,
                                                 plan=placed["none"].plan, compression=codec)
            print(f"# {name}: placed 4 ways in {time.perf_counter() - t0:.0f} s", flush=True)
            timers = {c: StepTimer() for c in CODECS}
            per_round = args.steps // args.rounds
            for r in range(args.rounds):
                for codec in CODECS:
                    part = slice(r * per_round * batch, (r + 1) * per_round * batch)
                    placed[codec].fit(x[part], y[part], batch_size=batch, epochs=1, shuffle=False, verbose=0,
                                      callbacks=[timers[codec]])
                print(f"# {name}: round {r + 1}/{args.rounds}", flush=True)
            traffic = float(np.asarray(placed["none"].report_data["traffic_bytes"]["matrix"]).sum())
            base = None
            results = {}
            for codec in CODECS:
                edges = placed[codec].compressed_edges
                before = sum(e.bytes_before for e in edges)
                after = sum(e.bytes_after for e in edges)
                secs = np.array(timers[codec].seconds[1:]) * 1e3
                med, iqr = float(np.median(secs)), float(np.subtract(*np.percentile(secs, [75, 25])))
                loss = timers[codec].losses[-1]
                results[codec] = med
                if base is None:
                    base = (med, loss)
                kinds = sorted({e.codec for e in edges})
                out(f"| {name} | {codec} | {len(edges)} {kinds if codec == 'auto' else ''} | "
                    f"{traffic - before + after:,.0f} | {after / before if before else float('nan'):.3f} | "
                    f"{med:.1f} | {iqr:.1f} | {med / base[0]:.3f} | {loss:.5f} | {loss - base[1]:+.2e} |")
            best_fixed = min(results[c] for c in ("none", "bf16", "int8"))
            out(f"| {name} | auto vs best fixed | | | | | | {results['auto'] / best_fixed:.3f} | | |")
    out()
    out(f"(`python benchmarks/training.py --models {' '.join(args.models)} --steps {args.steps} "
        f"--rounds {args.rounds}`)")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "training.md"))
    args = ap.parse_args()
    if args.steps % args.rounds:
        ap.error("--steps must be a multiple of --rounds")
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
