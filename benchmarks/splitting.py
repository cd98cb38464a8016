"""Operator splitting on two TF gRPC workers: a table larger than one worker, and a wide MLP at small batch.

**The recommender** (``--workloads recommender``): each worker process runs under an enforced memory limit
(``LocalCluster(memory_limit_bytes=)``, RLIMIT_DATA, with oneDNN's allocator pool capped at ``--pool-mib``: what
``device_specs`` gives a plan); an item table about ``--table-ratio`` × that pool. On one worker autoplace refuses it before running (``InsufficientMemoryError`` naming the
table and the shortfall) and the model placed there by hand fails; on two workers autoplace splits the
lookup by table rows (each worker holds half the table and applies its rows' SGD updates) and it trains:
per-step losses and the weights against ``model.fit`` on this process (no limit), the predictions, each
worker's peak memory while training (``VmHWM``, reset after placing; and its allocator's most bytes in use,
from the allocator's events under the workers' profilers) beside the plan's predicted peak (the workers' BFC
pools replayed: ``DeviceSpec.memory_pool_bytes``), and while placing (the costs stage profiles on worker 0
with a stand-in of the table's first rows), the step time measured and predicted. Nothing without splitting
can run it here, so there is no other row to compare.
``--optimizer adam``: Adam updates the table and its two moments densely (the ratio counts the three); each
part sums its rows' gradient and updates its shards of the three. ``--rec-workers N`` (default 2) spreads it
over more workers, pinned to the cores in turn (more workers than cores: a memory check, not a timing). The
one-worker refusal runs after the memory is measured (a refused profile can leave memory on worker 0).

**The wide MLP** (``--workloads wide``):
A chain of ``--layers`` dense layers of ``--width`` (ReLU; 4 × 8192 by default: 1 GiB of float32 weights)
reads its whole weights once per step: at batch 1-8 its time is the time to stream them from memory, and no
placement of whole ops can shorten a step (each layer waits for the one before). Two worker processes on
127.0.0.1, each pinned to one core with one thread (``placer.LocalCluster``). Per batch size, measured
interleaved in one run:

* ``one worker``: the model cloned onto worker 0 with its weights, one ``tf.function`` (its output received on
  the caller inside it, as autoplace's are: ``placer.measure.links.on_caller``);
* ``copy per worker (by hand)``: data parallelism, a clone with its weights on each worker, half the batch
  each (batch ≥ 2);
* ``autoplace splits='none'``: autoplace's best plan of whole ops (model parallelism, micro-batches or a
  copy per worker: ``replicas="auto"``), the tool's alternative without splitting;
* ``autoplace, products by columns only``: ``split_pairs=False`` (each split product joins its columns before
  the next layer: the plan the default made before Megatron pairs);
* ``autoplace splits='all' (pairs)``: every product split, consecutive ones as Megatron pairs, kept whatever
  the prediction (to measure the pairs beside the columns);
* ``autoplace, largest-first subsets only`` (the mixed chain only): ``split_toggles=0``: the largest weight, the
  largest half and all of them split, without the layer-by-layer search after them (the default's search
  before 2026-12-07);
* ``autoplace default``: ``placer.autoplace(model, devices, batch_size=b)`` (``splits="auto"``: large
  products split into one part per worker, their weights sharded, consecutive ones paired — the first by
  output columns, the next by input rows, one sum — where predicted faster; which layers, searched from the
  largest-first subsets layer by layer);
* two ``ceiling`` rows, bounds rather than strategies: one worker multiplying the input by every whole kernel
  (no chain, no bias), and each worker multiplying it by its half of every kernel's columns at once (no
  transfer). Their ratio is what a two-way column split can gain at that batch on these two cores, which
  share the machine's memory bandwidth (not a strict bound: on 2026-12-07 the default's Megatron pairs at
  batch 1 ran 7% faster than the halves' streams).

**The mixed chain** (``--workloads mixed``): the same rows for dense layers of uneven widths
(``--mixed-widths``: by default four 4096-wide layers, then four 512-wide ones), where splitting every large
layer, or the largest ones first, is not what pays most.

Each step fetches its outputs. Medians of ``--repeats`` interleaved rounds, spread = half the IQR, the
predicted step of every autoplace row beside its measurement, and the split outputs' largest relative
difference from the model's. Runs itself inside a loopback-only network namespace.

    python benchmarks/splitting.py [--workloads recommender wide mixed] [--batches 1 4 8] [--width 8192]
                                   [--layers 4] [--mixed-widths 4096 4096 ...] [--activation relu|gelu]
                                   [--repeats 7] [--pool-mib 528] [--table-ratio 1.36] [--optimizer sgd|adam]
                                   [--rec-workers 2] [--out benchmarks/results/splitting.md]
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
from speedup import ROUNDS_TEXT, interleaved_times, median_spread  # noqa: E402
from worker_trace import allocator_peaks, process_memory  # noqa: E402


def wide_mlp(width: int, layers: int, activation: str = "relu") -> "object":
    """``layers`` dense layers of ``width`` with ``activation`` (ReLU; GELU: a Transformer's feed-forward
    activation, several element-wise ops) on a ``width``-wide input."""
    return chain_mlp([width] * (layers + 1), activation, "wide_mlp")


def chain_mlp(widths: list[int], activation: str = "relu", name: str = "mixed_mlp") -> "object":
    """Dense layers of ``widths[1:]`` with ``activation`` on a ``widths[0]``-wide input."""
    import keras

    inp = keras.Input((widths[0],), name="features")
    h = inp
    for i, width in enumerate(widths[1:]):
        h = keras.layers.Dense(width, activation=activation, name=f"wide{i}")(h)
    return keras.Model(inp, h, name=name)


#: ``--optimizer`` → how many table-sized slots it keeps: SGD updates the table's rows (sparse), Adam the whole
#: table and its two moments (dense).
SLOTS = {"sgd": 0, "adam": 2}


def optimizer(name: str) -> "object":
    """A fresh optimizer of :data:`SLOTS` ``name``."""
    import keras

    return keras.optimizers.SGD(0.5) if name == "sgd" else keras.optimizers.Adam(1e-2)


def recommender(rows: int, dim: int, history: int, optimizer_name: str = "sgd") -> "object":
    """A user's ``history`` item ids → an item table of ``rows`` × ``dim`` averaged → Dense(64, relu) →
    Dense(1); :func:`optimizer` ``optimizer_name``, MSE; seeded, so two builds hold the same weights."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((history,), dtype="int32", name="history")
    h = keras.layers.GlobalAveragePooling1D(name="pool")(keras.layers.Embedding(rows, dim, name="items")(inp))
    h = keras.layers.Dense(64, activation="relu", name="hidden")(h)
    model = keras.Model(inp, keras.layers.Dense(1, name="score")(h), name="recommender")
    model.compile(optimizer=optimizer(optimizer_name), loss="mse")
    return model


def _reset_peak(pid: int) -> bool:
    """Reset ``VmHWM`` of ``pid`` to its current RSS (``clear_refs`` 5); whether the kernel allowed it."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def run_recommender(args: argparse.Namespace, out: MarkdownOut) -> None:
    """A table about ``--table-ratio`` × each worker's allocator pool: refused on one worker, an
    unplaced run fails there, split over two workers it trains like ``model.fit`` (module docstring)."""
    import keras
    import tensorflow as tf

    import placer
    from placer.measure.cluster import WORKER_RUNTIME_BYTES

    usable = args.pool_mib << 20
    limit = WORKER_RUNTIME_BYTES + usable  # device_specs: the pool's cap (oneDNN on: TensorFlow's default)
    slots = SLOTS[args.optimizer]
    rows = int(args.table_ratio * usable / (4 * args.dim * (1 + slots)))  # the table with its slots: that ratio
    batch, steps, history = args.rec_batch, args.rec_steps, 8
    model, reference = (recommender(rows, args.dim, history, args.optimizer) for _ in range(2))
    table_mib = rows * args.dim * 4 / 2**20
    rng = np.random.default_rng(0)
    x = rng.integers(0, rows, (batch * steps, history)).astype("int32")
    x[:, 0] = rng.integers(0, 64, batch * steps)  # popular items: rows updated by many steps, some twice a batch
    y = rng.standard_normal((batch * steps, 1)).astype("float32")
    out("## A table larger than one worker: the recommender on workers with an enforced memory limit")
    out()
    out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/splitting.py --workloads recommender --pool-mib "
        f"{args.pool_mib} --table-ratio {args.table_ratio} --dim {args.dim} --optimizer {args.optimizer} "
        f"--rec-workers {args.rec_workers}`; "
        "each worker process limited to "
        f"{limit / 2**20:.0f} MiB of data (`LocalCluster(memory_limit_bytes=)`: RLIMIT_DATA; its runtime holds "
        f"{WORKER_RUNTIME_BYTES >> 20} MiB, so `device_specs` gives a plan the allocator pool's cap, "
        f"{args.pool_mib} MiB per worker); an item table of "
        f"{rows:,} × {args.dim} float32 ({table_mib:.0f} MiB"
        + (f", {table_mib * (1 + slots):.0f} MiB with its {slots} slots" if slots else "")
        + f", {table_mib * (1 + slots) / args.pool_mib:.2f}× that) averaged over {history} ids → Dense(64) → "
        f"Dense(1), {args.optimizer}; batch {batch}, {steps} steps; {args.rec_workers} workers.")
    out()
    rows_out: list[tuple[str, str]] = []

    def batches(model: "object", x: np.ndarray = x) -> tuple[list[float], list[float]]:
        """``fit`` over the batches (its epoch loss), then ``train_on_batch`` on each again (per-step losses)."""
        epoch = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0).history["loss"]
        return epoch, [float(model.train_on_batch(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]))
                       for i in range(steps)]

    # the reference first, before this process connects to the cluster: Keras' fit on a client connected to
    # TF workers trained nothing (loss 0.0) in this setup, with or without autoplace
    theirs = batches(reference)
    pred_theirs = reference.predict(x, batch_size=batch, verbose=0)
    weights_theirs = reference.get_weights()
    # what placing and training cost a worker besides the model: the same flow with a table of 1,024 rows
    runtime_growth = []
    with placer.LocalCluster(args.rec_workers, pin_cores=True, threads=1, memory_limit_bytes=limit,
                             profiler=True) as cluster:
        devices = placer.connect(cluster)
        pids = [proc.pid for proc in cluster.procs]
        before = [process_memory(pid) for pid in pids]
        _ = [_reset_peak(pid) for pid in pids]
        small = placer.autoplace(recommender(1024, args.dim, history, args.optimizer), cluster.device_specs(devices),
                                 training=True, batch_size=batch)
        placing_growth = [process_memory(pid)["VmHWM"] - b["VmRSS"] for pid, b in zip(pids, before)]
        _ = [_reset_peak(pid) for pid in pids]
        batches(small, x % 1024)
        runtime_growth = [process_memory(pid)["VmHWM"] - b["VmRSS"] for pid, b in zip(pids, before)]
    print(f"  runtime growth (a 1,024-row table): placing {[g >> 20 for g in placing_growth]} MiB, training "
          f"{[g >> 20 for g in runtime_growth]} MiB", file=sys.stderr)
    with placer.LocalCluster(args.rec_workers, pin_cores=True, threads=1, memory_limit_bytes=limit,
                             profiler=True) as cluster:
        devices = placer.connect(cluster)
        specs = cluster.device_specs(devices)
        pids = [proc.pid for proc in cluster.procs]
        before = [process_memory(pid) for pid in pids]
        reset = all(_reset_peak(pid) for pid in pids)
        t = time.perf_counter()
        try:
            placed = placer.autoplace(model, specs, training=True, batch_size=batch)
        except placer.InsufficientMemoryError as e:  # the plan's memory check (the workers' pools) refused it
            out("| what | result |")
            out("|---|---|")
            out(f"| autoplace on {args.rec_workers} workers | refused before running after "
                f"{time.perf_counter() - t:.1f} s: `{type(e).__name__}`: {str(e)[:600]}… |")
            out()
            return
        placed_s = time.perf_counter() - t
        placing = [process_memory(pid) for pid in pids]  # the costs stage profiles on a worker: its peak is placing's
        reset = reset and all(_reset_peak(pid) for pid in pids)
        plan = placed.plan
        print(f"  placed: {plan.splits}; predicted peaks "
              f"{[round(b / 2**20) for b in plan.predicted_peak_memory_bytes]} MiB", file=sys.stderr, flush=True)
        t = time.perf_counter()
        ours = batches(placed)
        fit_s = time.perf_counter() - t
        after = [process_memory(pid) for pid in pids]
        rel = max(abs(a - b) / abs(b) for a, b in zip(ours[0] + ours[1], theirs[0] + theirs[1]))
        print(f"  losses, placed: {ours}\n  losses, the model: {theirs}", file=sys.stderr, flush=True)
        pred_ours = placed.predict(x, batch_size=batch, verbose=0)
        pred_rel = float(np.max(np.abs(pred_ours - pred_theirs)) / max(float(np.max(np.abs(pred_theirs))), 1e-30))
        weights_rel = max(float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))
                          for a, b in zip(placed.get_weights(), weights_theirs))
        # the step timed last (it trains on): the original cannot run on these workers to compare with. The
        # placed step itself (Keras' train_on_batch adds its metric resets and data handling)
        xb, yb = tf.constant(x[:batch]), tf.constant(y[:batch])
        (step_s, spread_s), = [median_spread(ts) for ts in interleaved_times(
            [lambda: tf.nest.map_structure(lambda t: t.numpy(), placed.train_step((xb, yb)))], args.repeats)]
        predicted_s = plan.predicted_step_time_s
        # a short trace: the profiler's buffers count against the worker's limit (with 1,500 ms, about one run in
        # six ended worker 0, whose pool and runtime fill its limit, while it was traced)
        in_use = allocator_peaks(cluster, lambda: placed.train_step((xb, yb)), trace_ms=400)
        rows_out.append((f"autoplace on {args.rec_workers} workers",
                         f"placed in {placed_s:.1f} s: {plan.summary().splitlines()[0]}; "
                         f"{len(plan.splits)} op split {max(plan.splits.values()) if plan.splits else 1} ways"))
        rows_out.append((f"losses (`fit` of {steps} steps, then `train_on_batch` on each batch again) vs the "
                         "model's on this process (no limit)", f"largest relative difference {rel:.1e} over "
                         f"{steps + 1} losses"))
        rows_out.append(("predictions and weights after training vs the model's", f"largest relative difference "
                         f"{pred_rel:.1e} (predictions), {weights_rel:.1e} (weights, the table gathered from its "
                         "shards)"))
        rows_out.append((f"training step on {args.rec_workers} workers (`placed.train_step`, its logs fetched)",
                         f"measured {step_s * 1e3:.1f} ± "
                         f"{spread_s * 1e3:.1f} ms, predicted {predicted_s * 1e3:.1f} ms "
                         f"({100 * (predicted_s - step_s) / step_s:+.1f}%)"))
        rows_out.append(("fit and the steps again", f"{fit_s:.1f} s ({2 * steps} steps)"))
        # after the memory was measured: a refused placement may leave its profile's memory on worker 0
        try:
            placer.autoplace(recommender(rows, args.dim, history, args.optimizer), specs[:1], training=True,
                             batch_size=batch)
            rows_out.insert(0, ("autoplace on one worker", "**placed** (expected a refusal)"))
        except placer.InsufficientMemoryError as e:
            rows_out.insert(0, ("autoplace on one worker", f"refused before running: `{type(e).__name__}`: "
                                f"{str(e)[:260]}…"))
        # last: a failed run on a worker cancels that client's later operations there (TF's eager executor)
        try:
            with tf.device(devices[0]):
                clone = keras.models.clone_model(model)
            clone.compile(optimizer=optimizer(args.optimizer), loss="mse")
            clone.fit(x[:batch], y[:batch], batch_size=batch, verbose=0)
            rows_out.append(("the model on one worker, unplaced (`tf.device`)", "**ran** (expected to fail)"))
        except (tf.errors.ResourceExhaustedError, tf.errors.UnavailableError, tf.errors.InternalError) as e:
            first = str(e).strip().splitlines()[0][:200]
            rows_out.append(("the model on one worker, unplaced (`tf.device`)", f"fails: `{type(e).__name__}`: "
                             f"{first}"))
        peaks = dict(zip(plan.devices, plan.predicted_peak_memory_bytes))
        for i, (b, p, a) in enumerate(zip(before, placing, after)):
            grew = a["VmHWM"] - b["VmRSS"] - runtime_growth[i]
            placed_grew = p["VmHWM"] - b["VmRSS"] - placing_growth[i]
            predicted = peaks.get(specs[i].name)
            err = f" ({100 * (predicted - grew) / grew:+.1f}%)" if predicted and grew > 0 else ""
            pool = (f"; its allocator's peak in use {in_use[i] / 2**20:.1f} MiB"
                    + (f" ({100 * (predicted - in_use[i]) / in_use[i]:+.1f}%)" if predicted else "")
                    if np.isfinite(in_use[i]) else "; no allocator events")
            rows_out.append((f"worker {i} memory", f"measured peak while training {grew / 2**20:.0f} MiB (resident "
                             f"growth over the worker's before placing, VmHWM {'reset' if reset else 'since start'} "
                             f"after placing, less the {runtime_growth[i] / 2**20:.0f} MiB the same flow grew with a "
                             f"1,024-row table); predicted peak "
                             + (f"{predicted / 2**20:.0f} MiB{err}" if predicted else "none") + pool
                             + f"; while placing {placed_grew / 2**20:.0f} MiB (less the same flow's "
                             f"{placing_growth[i] / 2**20:.0f} MiB); VmData {a['VmData'] / 2**20:.0f} of "
                             f"{limit / 2**20:.0f} MiB allowed"))
    out("| what | result |")
    out("|---|---|")
    for what, result in rows_out:
        out(f"| {what} | {result} |")
    out()


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = MarkdownOut()
    if "recommender" in args.workloads:
        run_recommender(args, out)
    import keras

    if "wide" in args.workloads:
        keras.utils.set_random_seed(0)
        keras_model = wide_mlp(args.width, args.layers, args.activation)
        run_chain(args, out, keras_model, f"a chain of {args.layers} dense layers of {args.width} ({args.activation})",
                  f"--width {args.width} --layers {args.layers} --activation {args.activation}", largest_first=False)
    if "mixed" in args.workloads:
        keras.utils.set_random_seed(0)
        keras_model = chain_mlp(args.mixed_widths, args.activation)
        run_chain(args, out, keras_model, f"dense layers of {', '.join(map(str, args.mixed_widths[1:]))} on a "
                  f"{args.mixed_widths[0]}-wide input ({args.activation})",
                  f"--workloads mixed --mixed-widths {' '.join(map(str, args.mixed_widths))} --activation "
                  f"{args.activation}")
    out.write(args.out)
    return 0


def run_chain(args: argparse.Namespace, out: MarkdownOut, model: "object", what: str, flags: str,
              largest_first: bool = True) -> None:
    """A chain of dense layers at small batch, ``what`` in words, ``flags`` its command line's (module
    docstring); ``largest_first``: with the row of the largest-first subsets alone (the wide MLP leaves it out:
    its layers are alike, so the layer-by-layer search has nothing to add; a fifth placement of its 1 GiB a batch
    once ran the workers out of 24 GB, when an idle call thread kept each dropped placed model's weights on the
    workers for a minute, fixed since)."""
    import tensorflow as tf

    import placer
    from placer.measure.links import on_caller
    from placer.tf.measuring import copy_per_device

    width = int(model.input_shape[-1])
    weight_mb = sum(int(np.prod(w.shape)) * 4 for w in model.weights) / 2**20
    out("## Operator splitting on 2 TF gRPC workers (one pinned core, one thread each)")
    out()
    out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/splitting.py --batches "
        f"{' '.join(map(str, args.batches))} {flags} --repeats {args.repeats}`; {what}, {weight_mb:.0f} MiB "
        f"of float32 weights; {args.repeats} interleaved rounds after 2 warm-up calls ({ROUNDS_TEXT}); "
        "speedup = one worker's step / this step (the same batch); predicted = the plan's predicted step "
        "(simulated, plus its measured fixed cost per call). Every row fetches its outputs.")
    out()
    out("| batch | strategy | measured ms | ± | speedup over one worker | predicted ms | prediction error | "
        "max rel. diff from the model |")
    out("|---|---|---|---|---|---|---|---|")
    summary, ceilings = [], []
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        by_hand, (w0, _w1) = copy_per_device(model, devices)
        streams = _weight_streams(model, devices)
        for batch in args.batches:
            x = np.random.default_rng(batch).standard_normal((batch, width)).astype("float32")
            xs = tf.constant(x)
            ref = model(xs, training=False).numpy()

            @tf.function(autograph=False)
            def one(v):
                with tf.device(devices[0]):
                    y = w0(v, training=False)
                return on_caller(y)  # received inside the call, as autoplace's outputs are

            configs: list[tuple[str, object, float | None, object]] = [
                ("one worker", lambda f=one: f(xs).numpy(), None, None)]
            if batch >= 2:
                configs.append(("copy per worker (by hand)", lambda: by_hand(xs).numpy(), None, None))
            configs += [(label, lambda f=f: f(xs).numpy(), None, None) for label, f in streams]
            rows = [("autoplace splits='none'", dict(splits="none")),
                    ("autoplace, products by columns only", dict(split_pairs=False)),
                    ("autoplace splits='all' (pairs)", dict(splits="all")),
                    ("autoplace, largest-first subsets only", dict(split_toggles=0)),
                    ("autoplace default", {})]
            for label, options in rows if largest_first else rows[:3] + rows[4:]:
                t = time.perf_counter()
                p = placer.autoplace(model, devices, batch_size=batch, **options)
                plan = p.plan
                print(f"  batch {batch} {label}: placed in {time.perf_counter() - t:.1f} s: "
                      f"{len(plan.splits)} split ops, replicas {plan.replicas}, m {plan.microbatches}, "
                      f"{len(set(plan.assignment.values()))} worker(s)", file=sys.stderr, flush=True)
                configs.append((label, lambda p=p: p(xs).numpy(), plan.predicted_step_time_s, p))
            times = interleaved_times([step for _, step, _, _ in configs], args.repeats)
            medians = [median_spread(ts) for ts in times]
            base = medians[0][0]
            for (label, step, pred, p), (med, spread) in zip(configs, medians):
                detail, diff = "", ""
                if p is not None:
                    plan = p.plan
                    detail = (f" ({len(plan.splits)} ops split {max(plan.splits.values())} ways, "
                              f"{len(plan.pairs)} pairs: {_layers(plan)})" if plan.splits else
                              f" ({plan.replicas} copies)" if plan.replicas > 1 else
                              f" (whole ops, m={plan.microbatches}, {len(set(plan.assignment.values()))} worker(s))")
                    got = step()
                    diff = f"{float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30)):.1e}"
                pred_s = f"{pred * 1e3:.1f}" if pred is not None else ""
                err = f"{100 * (pred - med) / med:+.1f}%" if pred is not None else ""
                out(f"| {batch} | {label}{detail} | {med * 1e3:.1f} | {spread * 1e3:.1f} | {base / med:.2f}× | "
                    f"{pred_s} | {err} | {diff} |")
            labels = [c[0] for c in configs]
            ia = labels.index("autoplace default")
            best_ms, best_label = min((medians[i][0], labels[i]) for i in range(len(labels))
                                      if i != ia and not labels[i].startswith(STREAM))
            ceilings.append((batch, medians[labels.index(streams[0][0])][0] / medians[labels.index(streams[1][0])][0]))
            auto = configs[ia][3].plan
            summary.append((batch, base / medians[ia][0], best_label, best_ms / medians[ia][0],
                            (auto.predicted_step_time_s - medians[ia][0]) / medians[ia][0], bool(auto.splits)))
    out()
    for batch, ceiling in ceilings:
        out(f"- batch {batch}: the two workers stream the kernels {ceiling:.2f}× as fast as one (each its half at "
            "once, no transfer: the two `ceiling` rows; what a column split can gain, not a strict bound)")
    for batch, speedup, best_label, vs_best, err, split in summary:
        out(f"- batch {batch}: autoplace's default ({'split' if split else 'whole ops'}) {speedup:.2f}× one "
            f"worker, {vs_best:.2f}× the best alternative measured ({best_label}); its prediction "
            f"{100 * err:+.1f}% off its measurement")


def _layers(plan: "object") -> str:
    """The layers ``plan`` splits (``wide0, wide1``), by their ops' scopes."""
    return ", ".join(sorted(op.split("/")[-2].rsplit("_", 1)[0] for op in plan.splits))


#: The label prefix of the ceiling rows (:func:`_weight_streams`): bounds, not strategies.
STREAM = "ceiling:"


def _weight_streams(model, devices: list[str]) -> list[tuple[str, object]]:
    """Two functions that stream ``model``'s kernels as a column split would, without its chain or transfers: one
    worker multiplying the input by every whole kernel, and each worker multiplying it by its half of every
    kernel's columns (its own copies), both at once. Their ratio is what a perfect two-way column split can gain
    on these workers at that batch: the parts share the machine's memory bandwidth."""
    import tensorflow as tf

    from placer.measure.links import on_caller

    kernels = [w.numpy() for w in model.weights if len(w.shape) == 2]
    with tf.device(devices[0]):
        whole = [tf.Variable(k, trainable=False) for k in kernels]
    halves = []
    for i, device in enumerate(devices[:2]):
        with tf.device(device):
            halves.append([tf.Variable(np.array_split(k, 2, axis=1)[i], trainable=False) for k in kernels])

    def streamed(v, ws):  # each kernel times the input, cut (or tiled) to the kernel's rows
        def rows(w):
            n = int(w.shape[0])
            return tf.tile(v, [1, -(-n // int(v.shape[1]))])[:, :n]
        return tf.add_n([tf.reduce_sum(tf.matmul(rows(w), w)) for w in ws])

    @tf.function(autograph=False)
    def one(v):
        with tf.device(devices[0]):
            y = streamed(v, whole)
        return on_caller(y)

    @tf.function(autograph=False)
    def both(v):
        parts = []
        for device, ws in zip(devices, halves):
            with tf.device(device):
                parts.append(on_caller(streamed(v, ws)))
        return tf.add_n(parts)

    return [(f"{STREAM} one worker streams every kernel (x @ W each, no chain)", one),
            (f"{STREAM} each worker streams its half of every kernel, both at once", both)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 4, 8])
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--activation", default="relu", choices=("relu", "gelu"),
                    help="wide: the layers' activation (gelu: pairs through its element-wise graph)")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved measured rounds per strategy")
    ap.add_argument("--workloads", nargs="+", choices=("recommender", "wide", "mixed"),
                    default=["recommender", "wide", "mixed"])
    ap.add_argument("--mixed-widths", nargs="+", type=int, default=[4096, 4096, 4096, 4096, 512, 512, 512, 512],
                    help="mixed: the input's width, then each dense layer's")
    ap.add_argument("--pool-mib", type=int, default=528, help="recommender: the cap of each worker's allocator "
                    "pool, what LocalCluster.device_specs gives a plan (the worker's limit: this and its runtime's; "
                    "before 2026-12-08 the flag was --worker-mib, 128 MiB less at the same limit)")
    ap.add_argument("--table-ratio", type=float, default=1.36, help="recommender: the table's size (with the "
                    "optimizer's table-sized slots) over that")
    ap.add_argument("--optimizer", choices=sorted(SLOTS), default="sgd", help="recommender: SGD (sparse "
                    "updates of the table) or Adam (dense: the table and its two moments updated whole)")
    ap.add_argument("--dim", type=int, default=64, help="recommender: the table's width")
    ap.add_argument("--rec-batch", type=int, default=256, help="recommender: the batch size")
    ap.add_argument("--rec-workers", type=int, default=2, help="recommender: workers (pinned to the cores in "
                    "turn: more workers than cores share them, fine for memory, not for timing)")
    ap.add_argument("--rec-steps", type=int, default=20, help="recommender: steps of fit compared")
    ap.add_argument("--out", default=str(HERE / "results" / "splitting.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
