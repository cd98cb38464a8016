"""Measured per-op compute time (TensorFlow step stats).

The traced ``GraphDef`` is imported into a TF1 graph, every resource
placeholder is mapped to a fresh resource variable holding the same value,
and the graph runs in a ``Session`` with ``FULL_TRACE``; each op's kernel time
is read from ``RunMetadata.step_stats``. With ``grappler=False`` (this
function's default) Grappler is switched off so that no op is fused or
folded away (with it on, only ~15% of ResNet50's compute ops keep their own
time); :func:`placer.tf.costs.compute_costs` profiles with it on by default, as
the placed function runs. The first ``warmup`` runs are discarded; the median of
``repeats`` runs is the estimate and the inter-quartile range its spread.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import step_stats_pb2

log = logging.getLogger(__name__)

_PREFIX = "profiled"
#: Default deadline of each run of a profiling session on a gRPC worker (``target``), in seconds: a frozen,
#: swapping or dead worker otherwise holds the session forever (a 200 MiB stand-in table hung one, 2026-12-06).
#: TensorFlow enforces it through the session's ``operation_timeout_in_ms``; closing the session on a worker
#: that stopped answering takes as long again.
REMOTE_RUN_TIMEOUT_S = 300.0
#: Length of ``_PREFIX + "/"``, cut from the imported graph's node names.
_CUT = len(_PREFIX) + 1
#: The most bytes one transfer of a variable's value to a worker carries: a larger value travels in pieces of
#: rows (a tensor sent whole needs its size again in the receiver's gRPC buffers, which a worker under a memory
#: limit may not have: an allocation that fails there kills the worker, not a clean error). Also the pieces of
#: ``placer.tf.remote``.
PIECE_BYTES = 16 << 20


def one_piece(shape: Sequence[int], itemsize: int) -> bool:
    """Whether a tensor of ``shape`` (items of ``itemsize`` bytes) is a scalar or fits one piece
    (:data:`PIECE_BYTES`).

    >>> one_piece((), 4), one_piece((4, 1 << 20), 4), one_piece((5, 1 << 20), 4)
    (True, True, False)
    """
    return len(shape) == 0 or itemsize * int(np.prod(shape, dtype=np.int64)) <= PIECE_BYTES


def row_pieces(shape: Sequence[int], itemsize: int) -> list[tuple[int, int]]:
    """``[start, stop)`` rows of a tensor of ``shape`` in pieces of at most :data:`PIECE_BYTES` (one row at
    least).

    >>> row_pieces((10, 1 << 20), 4)[:2]
    [(0, 4), (4, 8)]
    """
    row = max(1, int(itemsize * int(np.prod(shape[1:], dtype=np.int64))))
    step = max(1, PIECE_BYTES // row)
    return [(a, min(a + step, shape[0])) for a in range(0, max(1, shape[0]), step)]


def _piecewise(var: tf.Variable, value: np.ndarray, i: int) -> tuple[list, tf.Operation]:
    """Graph ops that write ``value`` into ``var`` (made as zeros where it lives) in :func:`row_pieces`, then turn
    its copy-on-read mode off (a slice assignment turns it on: every whole read would copy it): ``(the pieces'
    (op, feeds) pairs, the op that turns it off)``."""
    rest = list(value.shape[1:])
    piece = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), [None, *rest], name=f"autoplace_piece_{i}")
    begin = tf.compat.v1.placeholder(tf.int64, [len(value.shape)], name=f"autoplace_begin_{i}")
    end = tf.compat.v1.placeholder(tf.int64, [len(value.shape)], name=f"autoplace_end_{i}")
    write = tf.raw_ops.ResourceStridedSliceAssign(ref=var.handle, begin=begin, end=end,
                                                  strides=tf.ones([len(value.shape)], tf.int64), value=piece)
    runs = [(write, {piece: value[a:b], begin: [a] + [0] * len(rest), end: [b] + rest})
            for a, b in row_pieces(value.shape, value.dtype.itemsize)]
    return runs, tf.raw_ops.DisableCopyOnRead(resource=var.handle)


class ProfileOutOfMemory(ValueError):
    """A profiling run (or its variables' initialisation) ran out of the device's memory (TensorFlow's
    ``ResourceExhaustedError``: a worker under a memory limit that holds the weights but not the step's peak)."""


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
        TensorFlow's allocation records (median over the traced runs): the
        peak of the bytes the step's ops requested from the device's
        allocators and had not yet freed (:func:`requested_peak_bytes`). That
        is what the step needs on top of the resident state; neither the
        variables nor the fed inputs (allocated by the session, not by an op)
        count, nor the allocator's rounding. None when the runtime reported
        no allocation records.
    step_s : float or None
        With ``measure_step=True``: median wall time of one step run
        *without* tracing (as many runs as ``repeats``), as the client sees
        it: op times plus the executor's per-op overhead plus the session's
        fixed cost; otherwise None.
    call_s : float or None
        With ``measure_step=True``: median wall time of the step's fixed cost,
        a run on the device that is sent the same feeds and returns one
        element of each (no compute); otherwise None.
    """

    device: str
    median_us: Mapping[str, float]
    spread_us: Mapping[str, float]
    missing: tuple[str, ...]
    repeats: int
    wall_s: float
    activation_peak_bytes: float | None = None
    step_s: float | None = None
    call_s: float | None = None

    @property
    def op_sum_s(self) -> float:
        """Sum of the median op times, in seconds."""
        return float(sum(self.median_us.values())) / 1e6

    @property
    def ops_run(self) -> int:
        """How many ops took time (ran with a kernel of their own)."""
        return sum(1 for us in self.median_us.values() if us > 0)

    @property
    def overhead_us(self) -> float | None:
        """The executor's overhead per op that ran, in µs, or None without ``measure_step``.

        ``(step_s - call_s - op_sum_s) / ops_run``: what an untraced step
        costs beyond its ops' kernel times and its fixed cost, spread over the
        ops. Negative when the traced kernel times add up to more than the
        untraced step (tracing slowed them).
        """
        if self.step_s is None or self.call_s is None or not self.ops_run:
            return None
        return (self.step_s - self.call_s - self.op_sum_s) / self.ops_run * 1e6

    def calibrated_us(self) -> dict[str, float]:
        """Per-op µs whose sum is the untraced step less its fixed cost.

        A non-negative :attr:`overhead_us` is added to every op that ran (the
        executor pays it per op, on whichever device the op is placed); a
        negative one scales the ops down in proportion instead, so that no
        op's time turns negative. Without ``measure_step`` the medians are
        returned unchanged.

        Examples
        --------
        Two ops of 100 and 300 µs, one folded away; the untraced step took
        600 µs of which 100 µs were its fixed cost, so each op that ran pays
        50 µs of executor overhead:

        >>> med = {"a": 100.0, "b": 0.0, "c": 300.0}
        >>> p = OpProfile("/CPU:0", med, dict.fromkeys(med, 0.0), (), 3, 1.0, step_s=600e-6, call_s=100e-6)
        >>> {k: round(v, 6) for k, v in p.calibrated_us().items()}
        {'a': 150.0, 'b': 0.0, 'c': 350.0}
        """
        over = self.overhead_us
        if over is None:
            return dict(self.median_us)
        if over >= 0:
            return {n: us + over if us > 0 else 0.0 for n, us in self.median_us.items()}
        scale = max(self.step_s - self.call_s, 0.0) / self.op_sum_s
        return {n: us * scale for n, us in self.median_us.items()}


def requested_peak_bytes(step_stats: step_stats_pb2.StepStats) -> float | None:
    """The peak of bytes requested and not yet freed over one traced step, from its allocation records.

    With ``FULL_TRACE``, every op's allocations and their later frees come
    back as records of ``alloc_bytes`` (negative for a free) and time. An
    allocator that tracks sizes (TF's BFC allocator) records the size of the
    chunk it handed out, which depends on the allocator's history: the same
    Transformer step peaked at 4.72, 5.24 or 6.29 MB of chunks in different
    processes, but always at 4.72 MB requested. So each allocation of an
    op's output is counted at the ``requested_bytes`` of the output with
    that chunk size (temporaries, which have no description, at their chunk
    size), and the records of all ops are replayed in time order, allocations
    before frees at the same microsecond. Host-memory allocators of an
    accelerator (names containing ``host``) are left out.

    Parameters
    ----------
    step_stats : StepStats
        ``RunMetadata.step_stats`` of a ``FULL_TRACE`` run.

    Returns
    -------
    float or None
        Peak bytes above what was in use when the step started; None if there
        are no allocation records.

    Examples
    --------
    Op ``a`` gets a 1024-byte chunk for a 1000-byte output and frees it at
    t=5; op ``b`` allocates 512 bytes of scratch from t=2 to t=3:

    >>> from tensorflow.core.framework.step_stats_pb2 import AllocationRecord as Rec, StepStats
    >>> ss = StepStats()
    >>> a = ss.dev_stats.add().node_stats.add(node_name="a")
    >>> desc = a.output.add().tensor_description.allocation_description
    >>> desc.requested_bytes, desc.allocated_bytes = 1000, 1024
    >>> a.memory.add(allocator_name="cpu").allocation_records.extend(
    ...     [Rec(alloc_micros=1, alloc_bytes=1024), Rec(alloc_micros=5, alloc_bytes=-1024)])
    >>> b = ss.dev_stats[0].node_stats.add(node_name="b")
    >>> b.memory.add(allocator_name="cpu").allocation_records.extend(
    ...     [Rec(alloc_micros=2, alloc_bytes=512), Rec(alloc_micros=3, alloc_bytes=-512)])
    >>> requested_peak_bytes(ss)
    1512.0
    """
    events: list[tuple[int, int, int]] = []  # (time, 0 = allocation / 1 = free, ±requested bytes)
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            requested: dict[int, list[int]] = defaultdict(list)  # chunk size -> requested sizes of outputs
            for out in ns.output:
                desc = out.tensor_description.allocation_description
                if desc.allocated_bytes > 0:
                    requested[desc.allocated_bytes].append(desc.requested_bytes or desc.allocated_bytes)
            for mem in ns.memory:
                if "host" in mem.allocator_name.lower():
                    continue
                live: dict[int, list[int]] = defaultdict(list)  # chunk size -> requested sizes not yet freed
                for rec in mem.allocation_records:
                    size = abs(rec.alloc_bytes)
                    if rec.alloc_bytes > 0:
                        req = requested[size].pop(0) if requested[size] else size
                        live[size].append(req)
                        events.append((rec.alloc_micros, 0, req))
                    elif rec.alloc_bytes < 0:
                        events.append((rec.alloc_micros, 1, -(live[size].pop(0) if live[size] else size)))
    if not events:
        return None
    in_use = peak = 0
    for _, _, delta in sorted(events):
        in_use += delta
        peak = max(peak, in_use)
    return float(peak)


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
        Also time ``repeats`` untraced steps (``OpProfile.step_s``) and as
        many runs of the step's fixed cost (``OpProfile.call_s``), which give
        the executor's per-op overhead (``OpProfile.overhead_us``).

    Raises
    ------
    ValueError
        If ``repeats < 1`` or a run fails (the message names the op and device).

    See Also
    --------
    GraphProfiler : the same measurement one round at a time, e.g. interleaved
        with other work so that a drifting machine affects both alike.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    with GraphProfiler(graph_def, feeds, resources, fetches, constants=constants, device=device, warmup=warmup,
                       target=target, grappler=grappler, measure_step=measure_step) as prof:
        for _ in range(repeats):
            prof.round()
        return prof.result()


class GraphProfiler:
    """An open profiling session of one graph on one device, run a round at a time.

    Each :meth:`round` runs one traced step (every op's kernel time from the
    step stats) and, with ``measure_step``, one untraced step and one run of
    the step's fixed cost; :meth:`result` summarises all rounds so far. The
    arguments are those of :func:`profile_graph`; ``warmup`` runs happen on
    entering the context, and leaving it closes the session. On a worker
    (``target``) each run has a deadline of ``timeout_s`` seconds
    (:data:`REMOTE_RUN_TIMEOUT_S`): a run past it is a ``ValueError`` that
    names the worker, not a hang.

    Examples
    --------
    >>> import numpy as np, tensorflow as tf
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
    ...     y = tf.linalg.matmul(x, x, name="mm")
    >>> feeds = {"x:0": np.ones((4, 4), np.float32)}
    >>> with GraphProfiler(g.as_graph_def(), feeds, {}, ["mm:0"], measure_step=True) as p:
    ...     for _ in range(3):
    ...         p.round()
    ...     prof = p.result()
    >>> prof.repeats, prof.median_us["mm"] > 0, prof.step_s > 0
    (3, True, True)
    """

    def __init__(
        self,
        graph_def: tf.compat.v1.GraphDef,
        feeds: Mapping[str, np.ndarray],
        resources: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        *,
        constants: Mapping[str, np.ndarray] | None = None,
        device: str = "/device:CPU:0",
        warmup: int = 2,
        target: str = "",
        grappler: bool = False,
        measure_step: bool = False,
        timeout_s: float = REMOTE_RUN_TIMEOUT_S,
    ) -> None:
        self.device = device
        self._t0 = time.perf_counter()
        device_type = tf.DeviceSpec.from_string(device).device_type or "CPU"
        gd = tf.compat.v1.GraphDef()
        gd.CopyFrom(graph_def)
        for node in gd.node:
            node.device = ""
        g = tf.Graph()
        # On a worker (``target``) a graph's variables outlive the session in the server's resource manager,
        # named by container and variable name: a container of its own keeps two profiles from ever sharing
        # (a second model's ``autoplace_var_3`` met the first's, of another dtype), and :meth:`close` frees it.
        self._target, self._container = target, f"autoplace_profile_{uuid.uuid4().hex}"
        with g.as_default(), g.device(device), g.container(self._container):
            input_map = {}
            self._feeds = {}
            for i, (name, value) in enumerate(feeds.items()):
                ph = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape, name=f"autoplace_feed_{i}")
                input_map[name] = ph
                self._feeds[ph] = value
            # each variable's value is fed to its initializer, one at a time: a value in the graph would travel
            # in its GraphDef (a message of at most 2 GB, serialised whole: minutes for a 1 GB model on a worker);
            # a value larger than PIECE_BYTES is made as zeros there and fed in pieces of rows
            initial: list[tuple[object, dict]] = []
            for i, (name, value) in enumerate(resources.items()):
                value = np.asarray(value)
                if not one_piece(value.shape, value.itemsize):  # zeros of a fed shape: never a folded constant
                    dims = tf.compat.v1.placeholder(tf.int64, [value.ndim], name=f"autoplace_dims_{i}")
                    var = tf.compat.v1.Variable(tf.fill(dims, tf.zeros([], tf.as_dtype(value.dtype))),
                                                shape=value.shape, use_resource=True, name=f"autoplace_var_{i}")
                    runs, dense = _piecewise(var, value, i)
                    initial += [(var.initializer, {dims: list(value.shape)}), *runs, (dense, {})]
                else:
                    ph = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape, name=f"autoplace_init_{i}")
                    var = tf.compat.v1.Variable(ph, use_resource=True, name=f"autoplace_var_{i}")
                    initial.append((var.initializer, {ph: value}))
                input_map[name] = var.handle
            for name, value in (constants or {}).items():
                input_map[name] = tf.constant(value)
            self._outs = tf.graph_util.import_graph_def(gd, input_map=input_map, return_elements=list(fetches),
                                                        name=_PREFIX)
            # the step's fixed cost: the same feeds sent, one element of each used, no compute
            self._fixed = [tf.reshape(ph, [-1])[:1] for ph in self._feeds] or [tf.constant(0.0)]
        mapped = {name.rsplit(":", 1)[0] for name in (*feeds, *resources, *(constants or {}))}
        self._samples: dict[str, list[float]] = {n.name: [] for n in gd.node if n.name not in mapped}
        self._peaks: list[float] = []
        self._steps: list[float] = []
        self._calls: list[float] = []
        self._measure_step = measure_step
        self._warmup = warmup
        config = _session_config(device_type, grappler)
        if target:
            config.allow_soft_placement = False
            config.device_count.clear()
            config.operation_timeout_in_ms = max(1, int(timeout_s * 1000))
        self._config, self._timeout_s = config, timeout_s
        self._sess = tf.compat.v1.Session(target, graph=g, config=config)
        try:
            for op, feed in initial:
                self._run(op, feed_dict=feed)
        except BaseException:
            self.close()
            raise

    def _run(self, fetches: object, feed_dict: Mapping[object, object], **kwargs: object) -> object:
        """``session.run``, a run past the deadline on a worker a ``ValueError`` that says what to check, a run
        out of the device's memory :class:`ProfileOutOfMemory`."""
        try:
            return self._sess.run(fetches, feed_dict, **kwargs)
        except tf.errors.DeadlineExceededError as e:
            raise ValueError(self._deadline_message("a profiling run")) from e
        except tf.errors.ResourceExhaustedError as e:
            op = e.op.name[_CUT:] if e.op is not None and e.op.name.startswith(_PREFIX) else e.op
            raise ProfileOutOfMemory(f"profiling ran out of memory at op {op!r} on {self.device}: "
                                     f"{e.message.strip().splitlines()[0]}. Profile a smaller batch "
                                     "(batch_size=), or plan with an analytic model (hardware=)") from e

    def _deadline_message(self, what: str) -> str:
        return (f"{what} on {self.device} ({self._target}) did not finish within {self._timeout_s:g} s: the worker "
                "is frozen, swapping or out of memory. Check it (LocalCluster.check, or restart the worker) and "
                "place again; a model whose profile legitimately runs longer needs a larger "
                "cost_models.profile.REMOTE_RUN_TIMEOUT_S")

    def __enter__(self) -> "GraphProfiler":
        try:
            for _ in range(self._warmup):
                self._traced_run()
                if self._measure_step:
                    self._run(self._fixed, self._feeds)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the session and, on a worker, free this profile's variables there (idempotent)."""
        try:
            self._sess.close()
        except tf.errors.DeadlineExceededError as e:  # the worker does not answer: leave its variables be
            self._container = ""
            raise ValueError(self._deadline_message("closing the profiling session")) from e
        if self._target and self._container:
            container, self._container = self._container, ""
            try:
                tf.compat.v1.Session.reset(self._target, [container], config=self._config)
            except tf.errors.DeadlineExceededError as e:
                raise ValueError(self._deadline_message("freeing the profile's variables")) from e

    def _traced_run(self) -> tf.compat.v1.RunMetadata:
        md = tf.compat.v1.RunMetadata()
        opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        try:
            self._run(self._outs, self._feeds, options=opts, run_metadata=md)
        except tf.errors.OpError as e:
            op = e.op.name[_CUT:] if e.op is not None and e.op.name.startswith(_PREFIX) else e.op
            raise ValueError(f"profiling failed at op {op!r} on {self.device}: {e.message}") from e
        return md

    def clear(self) -> None:
        """Forget the rounds run so far (the session and its warm state stay)."""
        for xs in (*self._samples.values(), self._peaks, self._steps, self._calls):
            xs.clear()

    def round(self) -> None:
        """One traced step (and, with ``measure_step``, one untraced step and one fixed-cost run)."""
        md = self._traced_run()
        seen: dict[str, float] = {}
        peak = requested_peak_bytes(md.step_stats)
        if peak is not None:
            self._peaks.append(peak)
        for dev in md.step_stats.dev_stats:
            for ns in dev.node_stats:
                if ns.node_name.startswith(_PREFIX + "/"):
                    name = ns.node_name[_CUT:]
                    dt = max(ns.op_end_rel_nanos - ns.op_start_rel_nanos, 0) / 1e3
                    seen[name] = seen.get(name, 0.0) + dt
        for name, dt in seen.items():
            if name in self._samples:
                self._samples[name].append(dt)
        if self._measure_step:  # the untraced step and its fixed cost, timed in the same round
            t = time.perf_counter()
            self._run(self._outs, self._feeds)
            self._steps.append(time.perf_counter() - t)
            t = time.perf_counter()
            self._run(self._fixed, self._feeds)
            self._calls.append(time.perf_counter() - t)

    def result(self) -> OpProfile:
        """Medians and spreads over the rounds run so far.

        Raises
        ------
        ValueError
            If no round has run yet.
        """
        rounds = max((len(xs) for xs in self._samples.values()), default=0)
        if rounds == 0:
            raise ValueError("no profiling round has run yet; call round() first")
        median, spread, missing = {}, {}, []
        for name, xs in self._samples.items():
            if not xs:
                missing.append(name)
                median[name], spread[name] = 0.0, 0.0
                continue
            q1, q2, q3 = np.percentile(xs, [25, 50, 75])
            median[name], spread[name] = float(q2), float(q3 - q1)
        wall = time.perf_counter() - self._t0
        log.info("profiled %d ops on %s (%d runs) in %.1f s; %d never ran", len(self._samples), self.device,
                 rounds, wall, len(missing))
        med = lambda xs: float(np.median(xs)) if xs else None  # noqa: E731
        return OpProfile(self.device, median, spread, tuple(sorted(missing)), rounds, wall, med(self._peaks),
                         med(self._steps), med(self._calls))
