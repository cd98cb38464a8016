"""Which strategy is fastest on two TF gRPC workers: autoplace's default against what users run instead.

Two worker processes on 127.0.0.1, each pinned to one core with one thread
(``placer.LocalCluster``), connected with ``placer.connect``. Per workload
(a forward pass at one batch), measured interleaved in one run:

* ``one worker/m=M``: the model cloned onto worker 0, its weights copied
  there, the batch as ``M`` micro-batches, the output received on the caller
  inside the function as autoplace's are (``placer.measure.links.on_caller``)
  (the best of these is the single-worker baseline);
* ``copy per worker (by hand)``: the model cloned onto each worker with its
  weights, each running half the batch, one ``tf.function`` (data
  parallelism as a user writes it);
* ``tf.distribute MirroredStrategy``: the model built under a
  ``MirroredStrategy`` over both workers' CPUs, ``strategy.run`` on the
  distributed batch (where it runs; the error is recorded where not);
* ``autoplace default``: ``placer.autoplace(model, devices)`` with its
  defaults (``replicas="auto"``: model parallelism, micro-batches or a copy
  per device, whichever is predicted fastest);
* ``autoplace replicas=1``: autoplace's best single-copy plan (placement and
  micro-batches);
* ``autoplace replicas=2``: the copies forced.

Each step fetches its outputs. Medians of ``--repeats`` interleaved rounds
(``speedup.interleaved_times``), spread = half the IQR; the predicted step of
every autoplace row beside its measurement. Runs itself inside a loopback-only
network namespace.

    python benchmarks/strategy.py [--models decoder towers] [--repeats 7] [--links none 10gbit 1gbit]
                                  [--gradient-compression] [--out benchmarks/results/strategy.md]

Workloads (``--models``, :data:`CASES`): a 4-block decoder and a 4-tower MLP (inference), ResNet50 and
InceptionV3 inference (96 px images, batch 16: the speedup benchmark's), training steps of a Transformer
encoder, the 4-tower MLP, a 105M-parameter wide MLP and ResNet50 (64 px).

``--links``: the loopback link shaped to each rate in turn (``placer.measure.cluster.shape_loopback``: a
token bucket inside the namespace; ``none``: loopback as it is); autoplace calibrates the shaped link.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from isolation import isolated  # noqa: E402
from markdown import MarkdownOut  # noqa: E402
from speedup import ROUNDS_TEXT, build_model, interleaved_times, median_spread, pipeline_ceiling  # noqa: E402

from placer.measure.cluster import LINK_RATES, shape_loopback  # noqa: E402


def decoder(vocab: int = 2000, seq: int = 64, dim: int = 256, heads: int = 4, blocks: int = 4) -> "object":
    """A 4-block causal decoder (a chain): token embedding, attention + feed-forward blocks, a vocabulary head."""
    import keras

    ids = keras.Input((seq,), dtype="int32", name="ids")
    h = keras.layers.Embedding(vocab, dim, name="embed")(ids)
    for b in range(blocks):
        a = keras.layers.MultiHeadAttention(heads, dim // heads, name=f"att{b}")(h, h, use_causal_mask=True)
        h = keras.layers.LayerNormalization(name=f"ln{b}a")(h + a)
        f = keras.layers.Dense(4 * dim, activation="gelu", name=f"ff{b}a")(h)
        h = keras.layers.LayerNormalization(name=f"ln{b}b")(h + keras.layers.Dense(dim, name=f"ff{b}b")(f))
    return keras.Model(ids, keras.layers.Dense(vocab, name="head")(h), name="decoder")


def towers(width: int = 512) -> "object":
    """A 4-tower MLP (branchy): 4 × 2 dense layers of ``width`` over one input, concatenated."""
    import keras

    inp = keras.Input((256,), name="features")
    outs = [keras.layers.Dense(width, activation="relu", name=f"t{i}b")(
        keras.layers.Dense(width, activation="relu", name=f"t{i}a")(inp)) for i in range(4)]
    return keras.Model(inp, keras.layers.Dense(10, name="head")(keras.layers.Concatenate()(outs)), name="towers")


def transformer() -> "object":
    """The speedup benchmark's Transformer encoder (4 layers of 128, sequence 64)."""
    from workloads import transformer_encoder

    return transformer_encoder(seq=64, dim=128, heads=4, layers=4)


def wide(width: int = 4096, layers: int = 7, features: int = 1024) -> "object":
    """A wide MLP of about 105M parameters (``layers`` dense layers of ``width``): data parallelism sums a
    gradient as large as the model (420 MB) every step."""
    import keras

    h = inp = keras.Input((features,), name="features")
    for i in range(layers):
        h = keras.layers.Dense(width, activation="relu", name=f"wide{i}")(h)
    return keras.Model(inp, keras.layers.Dense(16, name="head")(h), name="wide")


def _images(rng, n: int, size: int):
    """A batch of ``n`` random ``size`` × ``size`` RGB images (the speedup benchmark's CNN inputs)."""
    return rng.standard_normal((n, size, size, 3)).astype("float32")


#: name -> (builder, batch, input maker, training; the CNNs are the speedup benchmark's, ``speedup.CASES``)
CASES = {
    "decoder": (decoder, 32, lambda rng, n: rng.integers(0, 2000, (n, 64)).astype("int32"), False),
    "towers": (towers, 256, lambda rng, n: rng.standard_normal((n, 256)).astype("float32"), False),
    "transformer_training": (transformer, 16, lambda rng, n: rng.standard_normal((n, 64, 128)).astype("float32"),
                             True),
    "towers_training": (towers, 256, lambda rng, n: rng.standard_normal((n, 256)).astype("float32"), True),
    "wide_training": (wide, 32, lambda rng, n: rng.standard_normal((n, 1024)).astype("float32"), True),
    "resnet50": (partial(build_model, "resnet50_inference"), 16, lambda rng, n: _images(rng, n, 96), False),
    "inception_v3": (partial(build_model, "inception_v3_inference"), 16, lambda rng, n: _images(rng, n, 96), False),
    "resnet50_training": (partial(build_model, "resnet50_training"), 8, lambda rng, n: _images(rng, n, 64), True),
}


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import placer

    out = MarkdownOut()
    failed = []
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        out("## Strategies on 2 TF gRPC workers (one pinned core, one thread each)")
        out()
        out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/strategy.py --models {' '.join(args.models)} "
            f"--repeats {args.repeats} --links {' '.join(args.links)}"
            f"{' --gradient-compression' if args.gradient_compression else ''}`; "
            f"{args.repeats} interleaved rounds after 2 warm-up calls ({ROUNDS_TEXT}); speedup = the best "
            "one-worker step / this step (the same batch); predicted = the plan's predicted step (simulated, plus "
            "its measured fixed cost per call). Inference rows fetch the outputs; training rows run one Keras step "
            "as `fit` does (`placer.tf.measuring.fit_step`: no metric reset per step; SGD, MSE). "
            "`tf.distribute`: `MirroredStrategy` over the two workers' CPUs is "
            "refused by TensorFlow 2.21 (in-graph multi-worker is not supported in eager mode); "
            "`MultiWorkerMirroredStrategy` and `ParameterServerStrategy` need the program running in every "
            "worker or a coordinator with parameter-server tasks, not one client on plain gRPC workers. So the "
            "data-parallel baselines are a copy per worker by hand (inference) and autoplace's `replicas=2` "
            "(training: Keras' step per replica, gradients summed on worker 0).")
        out()
        out("| link | workload | strategy | measured ms | ± | speedup over one worker | predicted ms | "
            "prediction error |")
        out("|---|---|---|---|---|---|---|---|")
        summary = []
        errors: list[float] = []
        for link in args.links:
            shape_loopback(link)
            for case in args.models:
                try:
                    summary.append((link, *_run_case(case, link, args, out, devices, errors)))
                except Exception as e:  # recorded, then the next case
                    failed.append(f"{case}@{link}")
                    traceback.print_exc()
                    out(f"| {link} | {case} | failed: {type(e).__name__}: {str(e).splitlines()[0][:160]} "
                        "| | | | | |")
        shape_loopback("none")
        out()
        for link, case, best_label, best_ms, auto_ms, auto_pred, chosen, ceiling in summary:
            out(f"- {case} at {link}: autoplace's default ({chosen}) {best_ms / auto_ms:.2f}× the best alternative "
                f"measured ({best_label}); its prediction {100 * (auto_pred - auto_ms) / auto_ms:+.1f}% off its "
                f"measurement{ceiling}")
        if errors:
            out(f"- predicted against measured over every autoplace row: median |error| "
                f"{100 * float(np.median(np.abs(errors))):.1f}%, worst {100 * float(np.max(np.abs(errors))):.1f}%")
    out.write(args.out)
    return 1 if failed else 0


def _run_case(case: str, link: str, args: argparse.Namespace, out, devices: list[str],
              errors: list[float]) -> tuple:
    import keras
    import tensorflow as tf

    import placer
    from placer.measure.links import on_caller
    from placer.tf.measuring import copy_per_device

    builder, batch, make_x, training = CASES[case]
    keras.utils.set_random_seed(0)
    model = builder()
    x = make_x(np.random.default_rng(0), batch)
    if training:
        return _run_training_case(case, link, args, out, devices, errors, model, x, batch)
    xs = tf.constant(x)
    configs: list[tuple[str, object, float | None]] = []  # (label, step, predicted s)

    by_hand, (w0, _w1) = copy_per_device(model, devices)
    for m in (1, 2, 4):
        @tf.function(autograph=False)
        def one(v, m=m):
            with tf.device(devices[0]):
                y = tf.concat([w0(p, training=False) for p in tf.split(v, m)], axis=0)
            return on_caller(y)  # received inside the call, as autoplace's outputs are (else 2-3x the fetch)
        configs.append((f"one worker/m={m}", lambda f=one: f(xs).numpy(), None))

    configs.append(("copy per worker (by hand)", lambda: by_hand(xs).numpy(), None))
    try:
        strategy = tf.distribute.MirroredStrategy(devices=devices)
        with strategy.scope():
            mirrored = keras.models.clone_model(model)
            mirrored.set_weights(model.get_weights())
        dist = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.split(xs, 2)[ctx.replica_id_in_sync_group])

        @tf.function(autograph=False)
        def mirrored_step(d):
            return strategy.gather(strategy.run(lambda v: mirrored(v, training=False), args=(d,)), axis=0)

        mirrored_step(dist)
        configs.append(("tf.distribute MirroredStrategy", lambda: mirrored_step(dist).numpy(), None))
    except Exception as e:  # what runs here is the finding
        out(f"| {link} | {case} | tf.distribute MirroredStrategy | does not run: {type(e).__name__}: "
            f"{str(e).splitlines()[0][:140]} | | | | |")

    placed = {}
    for label, options in (("autoplace default", {}), ("autoplace replicas=1", dict(replicas=1)),
                           ("autoplace replicas=2", dict(replicas=2))):
        t = time.perf_counter()
        p = placer.autoplace(model, devices, batch_size=batch, profile_cache=False, **options)
        print(f"  {case} {label}: placed in {time.perf_counter() - t:.1f} s: replicas {p.plan.replicas}, "
              f"m {p.plan.microbatches}, {len(set(p.plan.assignment.values()))} device(s), "
              f"{len(p.plan.splits)} split ops; {next((s for s in p.plan.log if 'operator splits' in s), '')}",
              file=sys.stderr, flush=True)
        placed[label] = p
        configs.append((label, lambda p=p: [v.numpy() for v in tf.nest.flatten(p(xs))],
                        p.plan.predicted_step_time_s))
    ref = model(xs, training=False).numpy()
    for label, p in placed.items():
        got = np.asarray(tf.nest.flatten(p(xs))[0])
        assert np.allclose(got, ref, rtol=1e-4, atol=1e-4), f"{label}: outputs differ from the model's"
    times = interleaved_times([step for _, step, _ in configs], args.repeats)
    medians = [median_spread(ts) for ts in times]
    ones = [i for i, (label, _, _) in enumerate(configs) if label.startswith("one worker")]
    best_one = min(medians[i][0] for i in ones)
    for (label, _, pred), (med, spread) in zip(configs, medians):
        p = placed.get(label)
        detail = ""
        if p is not None:
            plan = p.plan
            detail = (f" ({plan.replicas} copies × m={plan.microbatches})" if plan.replicas > 1 else
                      f" (m={plan.microbatches}, {len(set(plan.assignment.values()))} worker(s))")
        pred_s = f"{pred * 1e3:.1f}" if pred is not None else ""
        err = f"{100 * (pred - med) / med:+.1f}%" if pred is not None else ""
        if pred is not None:
            errors.append((pred - med) / med)
        out(f"| {link} | {case} | {label}{detail} | {med * 1e3:.1f} | {spread * 1e3:.1f} | {best_one / med:.2f}× | "
            f"{pred_s} | {err} |")
    others = [(medians[i][0], configs[i][0]) for i in range(len(configs))
              if configs[i][0] != "autoplace default"]
    best_ms, best_label = min(others)
    ia = [c[0] for c in configs].index("autoplace default")
    auto = placed["autoplace default"].plan
    chosen = f"{auto.replicas} copies × m={auto.microbatches}" if auto.replicas > 1 else \
        f"one copy, m={auto.microbatches}, {len(set(auto.assignment.values()))} worker(s)"
    same = best_label in placed and _strategy(placed[best_label].plan) == _strategy(auto)
    note = (" (the best is the default's own strategy placed again: the difference is the spread between "
            "placements of one plan, not the choice)") if same else ""
    return case, best_label, best_ms, medians[ia][0], configs[ia][2], chosen, note


def _strategy(plan) -> tuple:
    """What a plan chose (copies, micro-batches, which workers, which ops split how), not where each op went."""
    return (plan.replicas, plan.microbatches, frozenset(plan.assignment.values()), tuple(sorted(plan.splits.items())))


def _run_training_case(case: str, link: str, args: argparse.Namespace, out, devices: list[str], errors: list[float],
                       model, x, batch: int) -> tuple:
    """One training step (as ``fit`` runs it: :func:`placer.tf.measuring.fit_step`; SGD, MSE): one worker
    (1 and 4 micro-batches: the perfect two-stage pipeline's ceiling is computed from them,
    :func:`speedup.pipeline_ceiling`), ``replicas=2`` (data parallelism: no ``tf.distribute`` strategy runs with
    one client and plain gRPC workers, see the note in the results), autoplace's default, its one-copy plan, its
    plan without operator splits (``splits="none"``) and its pipeline search (``microbatches="auto"``)."""
    import keras

    import placer
    from placer.tf.measuring import fit_step

    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    y = np.random.default_rng(1).standard_normal((batch, *model.outputs[0].shape[1:])).astype("float32")
    placed = {}
    one = dict(algorithm="single", replicas=1, calibrate_links=False, splits="none")
    # batch normalization: micro-batches and copies only with split_batch_norm (per-part statistics, as
    # tf.distribute's replicas normalise by their own rows); the default and replicas=1 rows keep model.fit's math
    bn = dict(split_batch_norm=True) if any(type(layer).__name__ == "BatchNormalization"
                                            for layer in model._flatten_layers()) else {}  # noqa: SLF001
    tag = ", split_batch_norm" if bn else ""
    rows = [("one worker", one), (f"one worker, 4 micro-batches{tag}", dict(one, microbatches=4, **bn)),
            (f"data parallel (autoplace replicas=2{tag})", dict(replicas=2, **bn)),
            ("autoplace default", {}), ("autoplace replicas=1", dict(replicas=1)),
            ("autoplace splits='none'", dict(splits="none")),
            (f"autoplace microbatches='auto'{tag}", dict(microbatches="auto", **bn))]
    if args.gradient_compression:  # the copies' weights and gradients in bf16, forced and searched
        rows += [(f"data parallel, bf16 parameter traffic (replicas=2, gradient_compression='bf16'{tag})",
                  dict(replicas=2, gradient_compression="bf16", **bn)),
                 ("autoplace default, gradient_compression='auto'", dict(gradient_compression="auto"))]
    for label, options in rows:
        t = time.perf_counter()
        p = placer.autoplace(model, devices, batch_size=batch, training=True, profile_cache=False, **options)
        print(f"  {case} {label}: placed in {time.perf_counter() - t:.1f} s: {_copies(p)} copies, "
              f"m {p.plan.microbatches}, {len(set(p.plan.assignment.values()))} device(s)", file=sys.stderr,
              flush=True)
        placed[label] = p
    labels = list(placed)
    times = interleaved_times([lambda p=placed[k]: fit_step(p, x, y) for k in labels], args.repeats)
    medians = [median_spread(ts) for ts in times]
    one = min(medians[0][0], medians[1][0])
    for label, (med, spread) in zip(labels, medians):
        p = placed[label]
        detail = (f" ({_copies(p)} copies)" if _copies(p) > 1 else
                  f" (m={p.plan.microbatches}, {len(set(p.plan.assignment.values()))} worker(s)"
                  + (f", {len(p.plan.splits)} products split" if p.plan.splits else "") + ")")
        pred = p.plan.predicted_step_time_s
        errors.append((pred - med) / med)
        out(f"| {link} | {case} | {label}{detail} | {med * 1e3:.1f} | {spread * 1e3:.1f} | {one / med:.2f}× | "
            f"{pred * 1e3:.1f} | {100 * (pred - med) / med:+.1f}% |")
    ia = labels.index("autoplace default")
    best_ms, best_label = min((medians[i][0], labels[i]) for i in range(len(labels)) if i != ia)
    auto = placed["autoplace default"]
    chosen = (f"{_copies(auto)} copies" if _copies(auto) > 1 else
              f"one copy, m={auto.plan.microbatches}, {len(set(auto.plan.assignment.values()))} worker(s)"
              + (f", {len(auto.plan.splits)} products split" if auto.plan.splits else ""))
    ceiling, cm = pipeline_ceiling({1: medians[0][0], 4: medians[1][0]})
    ip = labels.index(f"autoplace microbatches='auto'{tag}")
    pipe = placed[labels[ip]].plan
    # a perfect two-stage GPipe pipeline, from the one-worker steps at 1 and 4 micro-batches; a placement without
    # micro-batches may pass it (a training step's weight and input gradients are independent ops)
    reached = (f"; its pipeline search (`microbatches='auto'`) chose m={pipe.microbatches}, "
               f"{one / medians[ip][0]:.2f}× one worker; a perfect two-stage pipeline's ceiling {ceiling:.2f}× at "
               f"m={cm}" + (f" ({one / medians[ip][0] / ceiling:.2f} of it)" if pipe.microbatches > 1 else ""))
    return case, best_label, best_ms, medians[ia][0], auto.plan.predicted_step_time_s, chosen, reached


def _copies(placed) -> int:
    """A training placement's data-parallel copies (its step's groups are copies × micro-batches)."""
    return max(1, len(placed.placement.replica_groups) // placed.plan.microbatches)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--repeats", type=int, default=7, help="interleaved measured rounds per strategy")
    ap.add_argument("--links", nargs="+", default=["none"], choices=["none", *LINK_RATES],
                    help="loopback shaped to these rates in turn (tc tbf inside the namespace); none: as it is")
    ap.add_argument("--gradient-compression", action="store_true",
                    help="training cases: add the copies with bf16 weights and gradients (gradient_compression="
                    "'bf16') and autoplace's default with gradient_compression='auto'")
    ap.add_argument("--out", default=str(HERE / "results" / "strategy.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
