"""What autoplace's own stages leave in a limited worker's allocator pool, measured beside its replay.

A TF worker started by ``LocalCluster(memory_limit_bytes=)`` carves its tensors from oneDNN's BFC pool, capped
at the limit less its runtime (528 MiB at a 1,936 MiB limit). The pool keeps every region it takes, so what ran
there before a placement decides which region a large tensor gets, whether its chunk is split, and whether it
fits at all. autoplace records what its stages put there (``DeviceSet.pool_history``) and replays it before a
plan's step (``cost_models.pool.replay_pool(before=)``). Each scenario here runs on fresh limited workers:

* a probe tensor (``--probe-mib``, 360 by default: the SGD recommender's shard) placed after nothing, after the
  link calibration, after weight copies of 40 and 100 MiB (the shared-capacity probe's and the runtime
  factor's, ``placer.tf.timing.weight_copies``, dropped), and after a profile of a chain of four 4096-wide
  layers (``placer.tf.runner.profile``: the fed weights, then the runtime factor's copies); measured: the bytes
  the worker's allocator has in use with the probe placed (the least over a traced loop of a small step that
  reads it, from its allocator's events) or its ``ResourceExhaustedError``; replayed: the same history's
  events, then the probe;
* a chain that fits one worker placed on two limited workers by ``autoplace`` (its profile, calibration and
  probes first): each worker's predicted peak against its allocator's most bytes in use while the placed
  model is called.

Runs itself inside a loopback-only network namespace (~4 min).

    python benchmarks/pool_history.py [--probe-mib 360] [--out benchmarks/results/pool_history.md]
"""

from __future__ import annotations

import argparse
import gc
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

MiB = 1 << 20
LIMIT = 1936 * MiB


def _chain(widths: list[int]):
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((widths[0],))
    h = inp
    for i, w in enumerate(widths[1:]):
        h = keras.layers.Dense(w, activation="relu", name=f"d{i}")(h)
    return keras.Model(inp, h)


def _probe(cluster, device: str, probe_bytes: int) -> float | str:
    """The bytes the worker's allocator has in use with a tensor of ``probe_bytes`` placed on ``device`` (the
    least over a traced loop of a step that reads 4 MiB of it), or the error that refused it."""
    import tensorflow as tf
    from worker_trace import allocated_while

    try:
        with tf.device(device):
            v = tf.Variable(tf.zeros([probe_bytes // 4]))
    except tf.errors.ResourceExhaustedError as e:
        return f"{type(e).__name__}"

    @tf.function
    def step():
        with tf.device(device):
            return tf.reduce_sum(v[:1 << 20] * 2.0)

    task = int(device.split("task:")[1].split("/")[0])
    used = allocated_while(cluster, lambda: step().numpy(), 400)[task]
    return float(used.min()) if used.size else float("nan")


def _history(kind: str, cluster, devices, specs) -> tuple[str, int, list]:
    """Run scenario ``kind`` on the workers; ``(what, worker index probed, the history's events)``."""
    import tensorflow as tf

    from cost_models.profile import PIECE_BYTES
    from cost_models.pool import written_weight_events
    from placer.core.devices import resolve_devices
    from placer.measure.links import calibrate_links
    from placer.tf.remote import variable_on

    if kind == "nothing":
        return "nothing", 0, []
    if kind == "calibration":
        devset = calibrate_links(resolve_devices(specs), cross_process_only=True, transfer_cpu=True)[0]
        return "the link calibration (both workers)", 1, list(devset.pool_history[1])
    if kind.startswith("copy"):
        mib = int(kind[4:])
        copy = variable_on(devices[0], tf.ones([mib * MiB // 4]))
        del copy
        gc.collect()
        return f"a {mib} MiB weight copied there and dropped", 0, written_weight_events("c", {"w": mib * MiB},
                                                                                          PIECE_BYTES)
    if kind == "profile":
        from cost_models.pool import fed_weight_events
        from placer.tf.runner import profile

        model = _chain([4096] * 5)
        profile(model, specs[:1], batch_size=16, profile_cache=False)
        sizes = {w.path: float(np.prod(w.shape)) * 4 for w in model.weights}  # as the costs stage records them
        history = fed_weight_events("profile", sizes) + written_weight_events("runtime factor", sizes, PIECE_BYTES)
        return "a profile of a 4 × 4096 chain (its fed weights, then the runtime factor's copies)", 0, history
    raise ValueError(kind)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import placer
    from cost_models.pool import replay_pool
    from worker_trace import allocator_peaks

    out = MarkdownOut()
    probe = args.probe_mib * MiB
    cap = LIMIT - placer.measure.cluster.WORKER_RUNTIME_BYTES
    out("## A limited worker's allocator pool after autoplace's own stages, measured and replayed")
    out()
    out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/pool_history.py --probe-mib {args.probe_mib}`; workers "
        f"limited to {LIMIT // MiB} MiB (pool capped at {cap // MiB} MiB), fresh for each row.")
    out()
    out(f"| before a {args.probe_mib} MiB tensor | measured in use | replayed in use | replayed regions before |")
    out("|---|---|---|---|")
    for kind in ("nothing", "calibration", "copy40", "copy100", "profile"):
        with placer.LocalCluster(2, pin_cores=True, threads=1, memory_limit_bytes=LIMIT, profiler=True) as cluster:
            devices = placer.connect(cluster)
            specs = cluster.device_specs(devices)
            what, worker, history = _history(kind, cluster, devices, specs)
            measured = _probe(cluster, devices[worker], probe)
        before = replay_pool([], cap, before=history)
        use = replay_pool([("probe", probe)], cap, before=history)
        replayed = "no room (refused)" if use.failed is not None else f"{use.peak_bytes / MiB:.1f} MiB"
        regions = f"{before.reserved_bytes / MiB:.0f} MiB"
        shown = measured if isinstance(measured, str) else f"{measured / MiB:.1f} MiB"
        out(f"| {what} | {shown} | {replayed} | {regions} |")
        print(f"  {what}: measured {shown}, replayed {replayed}", file=sys.stderr, flush=True)
    out()
    out("Chains that fit one worker, placed on two limited workers by `autoplace` (batch 16), each worker's "
        "predicted peak against its allocator's most bytes in use while the placed model is called:")
    out()
    out("| chain | plan | predicted peak per worker | allocator's peak per worker |")
    out("|---|---|---|---|")
    for widths in ([2560, 4096, 4096, 2560], [4096] * 5):
        with placer.LocalCluster(2, pin_cores=True, threads=1, memory_limit_bytes=LIMIT, profiler=True) as cluster:
            devices = placer.connect(cluster)
            model = _chain(widths)
            x = tf.constant(np.random.default_rng(0).standard_normal((16, widths[0])).astype("float32"))
            try:
                placed = placer.autoplace(model, cluster.device_specs(devices), batch_size=16, profile_cache=False)
                for _ in range(5):
                    placed(x)
                peaks = allocator_peaks(cluster, lambda: placed(x).numpy(), trace_ms=400)
            except (placer.AutoplaceError, tf.errors.OpError) as e:  # what a user would see, in the table
                out(f"| {' → '.join(map(str, widths))} | failed: `{type(e).__name__}`: "
                    f"{str(e).strip().splitlines()[0][:200]} | | |")
                continue
            predicted = placed.plan.predicted_peak_memory_bytes
            summary = placed.plan.summary().splitlines()[0]
        out(f"| {' → '.join(map(str, widths))} | {summary[:90]} | "
            + " / ".join(f"{p / MiB:.1f} MiB" for p in predicted) + " | "
            + " / ".join(f"{m / MiB:.1f} MiB ({100 * (p - m) / m:+.1f}%)" for p, m in zip(predicted, peaks)) + " |")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--probe-mib", type=int, default=360)
    ap.add_argument("--out", default=str(HERE / "results" / "pool_history.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
