"""Placed calls on gRPC workers that never hang: a watchdog that probes the workers while a call runs.

TensorFlow 2.21 gives a remote call no deadline: with a worker frozen
(``SIGSTOP``, swapping, a deadlock) a placed call blocks forever, and neither
``context.check_alive`` (it blocks too, holding the GIL) nor a
``CancellationManager`` (it does not interrupt the pending remote run)
gets it back. ``ConfigProto.operation_timeout_in_ms`` must be set before the
eager context starts, which is the user's, not ours.

So :class:`Watchdog` runs each call that touches a remote worker in a helper
thread (the call releases the GIL while it waits). The helper threads are kept
and reused (:class:`_Callers`): TensorFlow sets up a thread's eager context on
its first call, and against two gRPC workers a fresh thread per call cost a
4-tower MLP's forward pass about 3 ms (8.4 ms called directly, 11.0 ms in a
fresh thread each call, 2026-12-06; a sparse-table training step showed no
such cost), which ``placed.measure`` counted against the placed model. If the call has not
returned after :data:`PROBE_AFTER_S`, every worker it uses is probed with
:func:`placer.measure.health.probe_worker` (a ``GetStatus`` RPC with a
deadline), again and again while the call runs. A worker that does not
answer within ``timeout_s``, or refuses the connection, ends the wait with a
:class:`~placer.errors.WorkerError` naming it. The abandoned helper thread
returns when TensorFlow gives up on the worker (at once when it dies; it
never does while the worker stays frozen). TensorFlow's own
``UnavailableError``/``DeadlineExceededError`` (a killed worker) become a
``WorkerError`` as well. Calls on local devices run directly, with no thread.

Keras' ``fit``/``evaluate``/``predict`` are watched as a whole, not only
their steps: their data iterator synchronises the eager executor before each
batch, and that waits for an abandoned call too, outside any step. A call
made inside a watched call (the steps) runs in the same helper thread.

Examples
--------
>>> Watchdog({}, timeout_s=10.0).call(lambda a: a + 1, 1)
2
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from cost_models.profile import one_piece, row_pieces

from ..errors import WorkerError
from ..measure.health import WorkerStatus, probe_worker
from ..measure.links import CLIENT_DEVICE

#: A call that has not returned after this many seconds gets its workers probed.
PROBE_AFTER_S = 2.0
#: Default of ``PlacementOptions.worker_timeout_s``: how long a worker may leave a probe unanswered.
DEFAULT_WORKER_TIMEOUT_S = 10.0
#: A helper thread left without a call this many seconds ends (the next call starts another).
CALLER_IDLE_S = 60.0

_WORKER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)


def worker_addresses(device_names: Iterable[str]) -> dict[str, str]:
    """``/job:J/replica:0/task:T`` → ``host:port`` of every remote task among ``device_names``.

    Read from the cluster this process connected to
    (``tf.config.experimental_connect_to_cluster``); empty when it connected
    to none or every device is local.
    """
    server_def = context.context().get_server_def()
    if server_def is None:
        return {}
    jobs = {job.name: dict(job.tasks) for job in server_def.cluster.job}
    out: dict[str, str] = {}
    for name in device_names:
        spec = tf.DeviceSpec.from_string(name)
        if spec.job and spec.job != server_def.job_name and spec.task in jobs.get(spec.job, {}):
            out[f"/job:{spec.job}/replica:{spec.replica or 0}/task:{spec.task}"] = jobs[spec.job][spec.task]
    return out


def _advice(bad: list[WorkerStatus], names: Mapping[str, str]) -> str:
    what = "; ".join(f"{names[s.address]} at {s.address} is {s.state.value} ({s.detail})" for s in bad)
    return (f"{what}. Restart the worker (or the cluster) and connect again, or place the model on the devices "
            "that are left; the abandoned call is not retried")


@dataclass
class _Callers:
    """Helper threads that run watched calls, each kept for the next call once its call has returned.

    A call that never returns (a frozen worker) keeps its thread: the next call gets another. A thread idle
    for ``idle_s`` ends. Calls from several threads at once each get their own helper.

    Examples
    --------
    >>> import threading
    >>> callers, seen = _Callers(), []
    >>> for _ in range(2):
    ...     _ = callers.run(lambda: seen.append(threading.get_ident())).wait(10)
    >>> len(seen), seen[0] == seen[1] != threading.get_ident()
    (2, True)
    """

    idle_s: float = CALLER_IDLE_S
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _idle: list[queue.SimpleQueue] = field(default_factory=list, repr=False)

    def run(self, job: Callable[[], None]) -> threading.Event:
        """Start ``job()`` (which keeps its own result or error) in an idle helper thread, or in a new one when
        none is idle; the event is set once it returned and its thread is idle again."""
        with self._lock:
            jobs = self._idle.pop() if self._idle else None
        if jobs is None:
            jobs = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(jobs,), name="autoplace-placed-call", daemon=True).start()
        done = threading.Event()
        jobs.put((job, done))
        return done

    def _serve(self, jobs: queue.SimpleQueue) -> None:
        while True:
            try:
                job, done = jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if any(q is jobs for q in self._idle):  # nobody took this thread: end it
                        self._idle.remove(jobs)
                        return
                continue  # taken just now: its job is on the way
            try:
                job()
            finally:  # idle again before the caller wakes, so that its next call finds this thread
                with self._lock:
                    self._idle.append(jobs)
                done.set()
                # an idle thread holds nothing of its last call: the job's closure holds the placed function,
                # whose captured variables on workers would outlive the placed model by ``idle_s``
                job = done = None


@dataclass(frozen=True)
class Watchdog:
    """Runs placed calls, failing with :class:`~placer.errors.WorkerError` instead of hanging on a bad worker.

    Parameters
    ----------
    workers : Mapping[str, str]
        Task name → ``host:port`` of each remote worker the calls use
        (:func:`worker_addresses`); empty: calls run directly.
    timeout_s : float
        How long a worker may leave a health probe unanswered.
    """

    workers: Mapping[str, str]
    timeout_s: float = DEFAULT_WORKER_TIMEOUT_S
    _inside: threading.local = field(default_factory=threading.local, repr=False, compare=False)
    _callers: _Callers = field(default_factory=_Callers, repr=False, compare=False)

    def check(self, timeout_s: float | None = None) -> None:
        """Probe every worker once (each for at most ``timeout_s``, default ``self.timeout_s``).

        Raises
        ------
        WorkerError
            Naming each worker that is not answering or not reachable.
        """
        by_address = {a: t for t, a in self.workers.items()}
        wait = self.timeout_s if timeout_s is None else timeout_s
        bad = [s for s in (probe_worker(a, timeout_s=wait) for a in by_address) if not s.alive]
        if bad:
            raise WorkerError(_advice(bad, by_address))

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, watched while it runs (see the module docstring)."""
        if not self.workers:
            return fn(*args, **kwargs)
        if getattr(self._inside, "watched", False):  # already in a watched call (a step inside ``fit``)
            return self._translate(fn, *args, **kwargs)
        box: dict[str, Any] = {}

        def run() -> None:
            self._inside.watched = True
            try:
                box["value"] = self._translate(fn, *args, **kwargs)
            except BaseException as e:  # handed to the caller below
                box["error"] = e

        done = self._callers.run(run)
        while not done.wait(PROBE_AFTER_S):
            try:
                self.check()
            except WorkerError:
                if done.is_set():  # it finished (or failed on its own) while we probed
                    break
                raise
        if "error" in box:
            raise box["error"]
        return box["value"]

    def guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` wrapped by :meth:`call` (marked, so it is not wrapped twice); ``fn`` itself without workers."""
        if not self.workers or getattr(fn, "_autoplace_watched", False):
            return fn

        def watched(*args: Any) -> Any:
            return self.call(fn, *args)

        watched._autoplace_watched = True  # type: ignore[attr-defined]
        return watched

    def _translate(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except _WORKER_ERRORS as e:
            self.check(timeout_s=min(self.timeout_s, 2.0))  # names the worker that went away, if one did
            raise WorkerError(f"a placed call failed with TensorFlow's {type(e).__name__} although every worker "
                              f"({', '.join(sorted(self.workers))}) answers now: the connection "
                              "broke during the call. Run it again; if it keeps failing, restart the cluster") from e


def _dense_reads(variable: tf.Variable) -> None:
    """Turn ``variable``'s copy-on-read mode off (``DisableCopyOnRead``, where it lives): a slice assignment or a
    sparse read puts a variable in it, and from then on every whole read (``ReadVariableOp``) copies it. Off,
    whole reads share the buffer again; the next sparse op (a lookup's gather, a scatter) turns it on again.
    Measured here: a 256 MiB variable's whole read took 23 ms after a slice assignment, 0.2 ms after this."""
    with tf.device(variable.device):
        tf.raw_ops.DisableCopyOnRead(resource=variable.handle)


def write_rows(variable: tf.Variable, value: tf.Tensor) -> None:
    """Assign ``variable`` (on any device) ``value`` (a tensor here) in pieces of rows
    (:data:`~cost_models.profile.PIECE_BYTES`), then turn its copy-on-read mode off (:func:`_dense_reads`)."""
    if one_piece(value.shape, value.dtype.size):
        with tf.device(variable.device):
            variable.assign(value)
        return
    rest = list(value.shape[1:])
    for a, b in row_pieces(value.shape, value.dtype.size):
        with tf.device(value.device):  # cut where the value is: only the piece travels
            piece = value[a:b]
        with tf.device(variable.device):
            tf.raw_ops.ResourceStridedSliceAssign(ref=variable.handle, begin=[a] + [0] * len(rest), end=[b] + rest,
                                                  strides=[1] * (1 + len(rest)), value=piece)
            # wait for it: remote eager ops are queued, and pieces sent faster than the worker writes them pile
            # up in its memory (a 360 MiB shard's pieces took 232 MB more and failed under a limit)
            tf.raw_ops.VarIsInitializedOp(resource=variable.handle).numpy()
    _dense_reads(variable)


def read_rows(variable: tf.Variable) -> tf.Tensor:
    """``variable``'s value, fetched here in pieces of rows (:data:`~cost_models.profile.PIECE_BYTES`; gathered,
    so a variable in copy-on-read mode, as a table with sparse updates is, is never copied whole where it
    lives)."""
    if one_piece(variable.shape, variable.dtype.size):
        with tf.device(CLIENT_DEVICE):
            return tf.identity(variable.read_value())
    pieces = []
    for a, b in row_pieces(variable.shape, variable.dtype.size):
        with tf.device(variable.device):
            piece = variable.sparse_read(tf.range(a, b))
        pieces.append(piece.numpy())  # fetched before the next piece is gathered there
    _dense_reads(variable)  # (the gathers turned copy-on-read on)
    with tf.device(CLIENT_DEVICE):
        return tf.constant(np.concatenate(pieces, axis=0))


def variable_on(device: str, value: tf.Tensor, *, name: str | None = None) -> tf.Variable:
    """A non-trainable variable on ``device`` holding ``value`` (a tensor here): made there as zeros, then
    filled in pieces of rows (:func:`write_rows`), so no transfer carries more than
    :data:`~cost_models.profile.PIECE_BYTES`.

    A slice assignment, like a sparse update, puts a variable in TensorFlow's copy-on-read mode, in which every
    whole read (``ReadVariableOp``) copies it (a product with a 256 MiB weight written so took 39 ms on a
    worker, 16 ms with the weight sent whole; a table's Adam moments, read whole twice each per step, ran out
    of a worker's memory limit): :func:`write_rows` turns the mode off after the pieces (:func:`_dense_reads`).

    >>> v = variable_on("/CPU:0", tf.reshape(tf.range(6.0), (3, 2)))
    >>> v.numpy().tolist(), v.trainable
    ([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], False)
    """
    with tf.device(device):
        variable = tf.Variable(tf.zeros(value.shape, value.dtype), trainable=False, name=name)
    write_rows(variable, value)
    return variable
