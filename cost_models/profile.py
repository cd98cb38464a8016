"""Measured per-op compute time (TensorFlow step stats).

The traced ``GraphDef`` is imported into a TF1 graph, every resource
placeholder is mapped to a fresh resource variable holding the same value,
and the graph runs in a ``Session`` with ``FULL_TRACE``; each op's kernel time
is read from ``RunMetadata.step_stats``. With ``grappler=False`` (this
function's default) Grappler is switched off so that no op is fused or
folded away (with it on, only ~15% of ResNet50's compute ops keep their own
time); :func:`placer.costs.compute_costs` profiles with it on by default, as
the placed function runs. The first ``warmup`` runs are discarded; the median of
``repeats`` runs is the estimate and the inter-quartile range its spread.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

log = logging.getLogger(__name__)

_PREFIX = "profiled"


@dataclass(frozen=True)
class OpProfile:
    """Per-op kernel times of one graph on one device kind.

    Attributes
    ----------
    device : str
        The device the ops ran on (e.g. ``/device:CPU:0``).
    median_us, spread_us : Mapping[str, float]
        Median and inter-quartile range per op name, in microseconds.
    missing : tuple of str
        Ops that never appeared in the step stats (time taken as 0); the
        placeholders replaced by feeds and variables are not counted.
    repeats : int
    wall_s : float
        Time spent profiling.
    activation_peak_bytes : float or None
        TensorFlow's allocator: the median over runs of (highest minus lowest
        bytes in use during the step) on the profiled device, i.e. the peak of
        what the step allocates on top of the resident state; None when the
        runtime reported no memory statistics.
    step_s : float or None
        With ``measure_step=True``: median wall time of one step run
        *without* tracing (as many runs as ``repeats``), as the client sees
        it: op times plus the executor's per-op overhead plus the session's
        fixed cost; otherwise None.
    """

    device: str
    median_us: Mapping[str, float]
    spread_us: Mapping[str, float]
    missing: tuple[str, ...]
    repeats: int
    wall_s: float
    activation_peak_bytes: float | None = None
    step_s: float | None = None

    @property
    def op_sum_s(self) -> float:
        """Sum of the median op times, in seconds."""
        return float(sum(self.median_us.values())) / 1e6


def _session_config(device_type: str, grappler: bool = False) -> tf.compat.v1.ConfigProto:
    cfg = tf.compat.v1.ConfigProto(allow_soft_placement=False)
    if not grappler:
        cfg.graph_options.rewrite_options.disable_meta_optimizer = True
        cfg.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
        cfg.graph_options.optimizer_options.do_constant_folding = False
        cfg.graph_options.optimizer_options.do_function_inlining = False
    if device_type != "CPU":
        cfg.device_count[device_type] = 1
    return cfg


def profile_graph(
    graph_def: tf.compat.v1.GraphDef,
    feeds: Mapping[str, np.ndarray],
    resources: Mapping[str, np.ndarray],
    fetches: Sequence[str],
    *,
    constants: Mapping[str, np.ndarray] | None = None,
    device: str = "/device:CPU:0",
    repeats: int = 5,
    warmup: int = 2,
    target: str = "",
    grappler: bool = False,
    measure_step: bool = False,
) -> OpProfile:
    """Measure every op of ``graph_def`` on ``device``.

    Parameters
    ----------
    graph_def : GraphDef
        The traced graph (node devices are ignored).
    feeds : Mapping[str, numpy.ndarray]
        Input tensor name (``"x:0"``) → value.
    resources : Mapping[str, numpy.ndarray]
        Resource placeholder tensor name → the variable's value.
    fetches : sequence of str
        Output tensor names.
    constants : Mapping[str, numpy.ndarray], optional
        Other captured placeholder tensor names → values.
    device : str
        Where to run, e.g. ``/device:CPU:0`` or ``/device:GPU:0``.
    repeats, warmup : int
        Measured and discarded runs.
    target : str
        Session target: ``""`` runs in this process; ``"grpc://host:port"``
        runs on a TF server (then ``device`` names one of its devices, e.g.
        ``/job:worker/replica:0/task:0/device:CPU:0``), so ops are timed under
        that worker's own thread settings.
    grappler : bool
        Run with TensorFlow's graph optimizer on, as a placed ``tf.function``
        runs. A fused op's time then lands on the op whose name the fused op
        keeps (e.g. a convolution, its bias and activation are timed as one,
        under the activation's name); ops folded away are timed as 0.
    measure_step : bool
        Also time ``repeats`` untraced steps (``OpProfile.step_s``), to
        compare the sum of op times with what a whole step costs.

    Raises
    ------
    ValueError
        If ``repeats < 1`` or a run fails (the message names the op and device).
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    t0 = time.perf_counter()
    device_type = tf.DeviceSpec.from_string(device).device_type or "CPU"
    gd = tf.compat.v1.GraphDef()
    gd.CopyFrom(graph_def)
    for node in gd.node:
        node.device = ""
    g = tf.Graph()
    with g.as_default(), g.device(device):
        input_map = {}
        feed_ph = {}
        for i, (name, value) in enumerate(feeds.items()):
            ph = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape, name=f"autoplace_feed_{i}")
            input_map[name] = ph
            feed_ph[ph] = value
        for i, (name, value) in enumerate(resources.items()):
            var = tf.compat.v1.Variable(value, use_resource=True, name=f"autoplace_var_{i}")
            input_map[name] = var.handle
        for name, value in (constants or {}).items():
            input_map[name] = tf.constant(value)
        outs = tf.graph_util.import_graph_def(gd, input_map=input_map, return_elements=list(fetches),
                                              name=_PREFIX)
        init = tf.compat.v1.global_variables_initializer()
    opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    mapped = {name.rsplit(":", 1)[0] for name in (*feeds, *resources, *(constants or {}))}
    samples: dict[str, list[float]] = {n.name: [] for n in gd.node if n.name not in mapped}
    cut = len(_PREFIX) + 1
    peaks: list[float] = []
    config = _session_config(device_type, grappler)
    if target:
        config.allow_soft_placement = False
        config.device_count.clear()
    with tf.compat.v1.Session(target, graph=g, config=config) as sess:
        sess.run(init)
        for r in range(warmup + repeats):
            md = tf.compat.v1.RunMetadata()
            try:
                sess.run(outs, feed_ph, options=opts, run_metadata=md)
            except tf.errors.OpError as e:
                op = e.op.name[cut:] if e.op is not None and e.op.name.startswith(_PREFIX) else e.op
                raise ValueError(f"profiling failed at op {op!r} on {device}: {e.message}") from e
            if r < warmup:
                continue
            seen: dict[str, float] = {}
            in_use = [m.allocator_bytes_in_use for dev in md.step_stats.dev_stats for ns in dev.node_stats
                      for m in ns.memory if m.allocator_bytes_in_use > 0]
            if in_use:
                peaks.append(float(max(in_use) - min(in_use)))
            for dev in md.step_stats.dev_stats:
                for ns in dev.node_stats:
                    if ns.node_name.startswith(_PREFIX + "/"):
                        name = ns.node_name[cut:]
                        dt = max(ns.op_end_rel_nanos - ns.op_start_rel_nanos, 0) / 1e3
                        seen[name] = seen.get(name, 0.0) + dt
            for name, dt in seen.items():
                if name in samples:
                    samples[name].append(dt)
        steps = []
        for _ in range(repeats if measure_step else 0):
            t = time.perf_counter()
            sess.run(outs, feed_ph)
            steps.append(time.perf_counter() - t)
    median, spread, missing = {}, {}, []
    for name, xs in samples.items():
        if not xs:
            missing.append(name)
            median[name], spread[name] = 0.0, 0.0
            continue
        q1, q2, q3 = np.percentile(xs, [25, 50, 75])
        median[name], spread[name] = float(q2), float(q3 - q1)
    wall = time.perf_counter() - t0
    log.info("profiled %d ops on %s (%d runs) in %.1f s; %d never ran", len(samples), device, repeats, wall,
             len(missing))
    return OpProfile(device, median, spread, tuple(sorted(missing)), repeats, wall,
                     float(np.median(peaks)) if peaks else None, float(np.median(steps)) if steps else None)
