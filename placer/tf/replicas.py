"""Replicas of a training step: data-parallel groups of devices and the micro-batches of a pipeline.

A training step runs as ``R`` *replicas* when the plan's devices are split
into data-parallel groups (``replicas=``) or its batch into micro-batches
(``microbatches=``), or both: :func:`replica_groups` lists each replica's
devices, :func:`replicated_train_step` is the step Keras' ``train_step``
becomes (each replica's forward pass, loss and gradients under
``replica_{r}/``, the gradients summed where the variables live, one
update), and :func:`replica_assignment` maps the plan of one replica's step
onto every replica's ops. The ``gates`` rewrite then orders each device's
micro-batches (:mod:`placer.tf.rewrites.gates`).

Examples
--------
>>> replica_groups([("/CPU:0", "/CPU:1")], 1), replica_groups([("/CPU:0",), ("/CPU:1",)], 1)
((), (('/CPU:0',), ('/CPU:1',)))
>>> replica_groups([("/CPU:0",), ("/CPU:1",)], 2)
(('/CPU:0',), ('/CPU:0',), ('/CPU:1',), ('/CPU:1',))
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

import keras
import tensorflow as tf

from .graphdef import GRADIENT_SCOPE, GRADIENT_SUM_SCOPE, GRADIENT_TOTAL_SCOPE, REPLICA_SCOPE, layer_of


def replica_groups(groups: Sequence[Sequence[str]], microbatches: int) -> tuple[tuple[str, ...], ...]:
    """Each replica's devices: the data-parallel ``groups`` (the plan's devices first), each repeated once per
    micro-batch; ``()`` for one group without micro-batches (the step is not replicated)."""
    if len(groups) == 1 and microbatches <= 1:
        return ()
    return tuple(tuple(g) for g in groups for _ in range(max(microbatches, 1)))


def replicated_train_step(model: Any, data: Any, groups: Sequence[Sequence[str]]) -> Any:
    """One training step of ``model`` split over replicas (``groups``: each replica's devices, one entry
    per replica): the math of the full-batch step.

    The batch is split in ``R = len(groups)`` parts of sizes differing by at most one row;
    replica ``r`` (ops under the name scope ``replica_r/``) runs the forward
    pass, the loss and the gradients of its part, its loss weighted by its
    share of the rows, so the gradients' sum is the gradient of the
    full-batch loss. Each group of devices sums its replicas' gradients as
    they come (a running sum per variable, replica ``r``'s under the name
    scope ``autoplace_gradient_sum_r/``, beside the gradients it adds: the
    micro-batches of one data-parallel group send one sum, not each its
    own); the groups' sums (``autoplace_gradient_total_r/``, ``r`` the
    group) and the single optimizer update run where the variables live
    (the first group's devices); the metrics see the whole batch. Random
    ops draw per replica (dropout masks differ from the unsplit step); batch
    normalization is refused (:func:`placer.tf.training.check_replicable`) unless ``split_batch_norm``
    accepts GPipe's semantics: each replica normalises by its own part's statistics and its moving-statistics
    update runs in replica order (the tape's order: automatic control dependencies serialise the writes).
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    groups = [tuple(g) for g in groups]
    replicas = len(groups)
    n = tf.shape(tf.nest.flatten(x)[0])[0]
    sizes = [(n + replicas - 1 - r) // replicas for r in range(replicas)]

    def part(t: Any, r: int) -> Any:
        return None if t is None else tf.split(t, sizes, axis=0)[r]

    def add(a: list[Any], b: list[Any]) -> list[Any]:
        return [g if s is None else s if g is None else sum_gradients(s, g) for s, g in zip(a, b)]

    group_of = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    trainable = model.trainable_weights
    sums: dict[int, list[Any]] = {}  # per group of devices: the running sum of its replicas' gradients
    total_loss = tf.constant(0.0)
    preds = []
    for r in range(replicas):
        xr, yr, swr = (tf.nest.map_structure(lambda t, r=r: part(t, r), v) for v in (x, y, sample_weight))
        share = tf.cast(sizes[r], "float32") / tf.cast(n, "float32")
        with tf.name_scope(f"{REPLICA_SCOPE}_{r}"):
            with tf.GradientTape() as tape:
                y_pred = model(xr, training=True)
                loss = model._compute_loss(x=xr, y=yr, y_pred=y_pred, sample_weight=swr,  # noqa: SLF001
                                           training=True) * share
                scaled = model.optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, trainable)
        group = group_of[groups[r]]
        if group not in sums:
            sums[group] = grads
        else:
            with tf.name_scope(f"{GRADIENT_SUM_SCOPE}_{r}"):  # the running sums, named for hold_gradient_sums
                sums[group] = add(sums[group], grads)
        total_loss = total_loss + loss
        preds.append(y_pred)
    total_grads = sums[0]
    for group in range(1, len(sums)):
        with tf.name_scope(f"{GRADIENT_TOTAL_SCOPE}_{group}"):
            total_grads = add(total_grads, sums[group])
    model._loss_tracker.update_state(total_loss, sample_weight=n)  # noqa: SLF001
    model.optimizer.apply_gradients(zip(total_grads, trainable))
    y_pred = tf.nest.map_structure(lambda *ps: tf.concat(ps, axis=0), *preds)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def sum_gradients(a: Any, b: Any) -> Any:
    """``a + b`` for two gradients of one variable, sparse ones kept sparse.

    Two ``tf.IndexedSlices`` (an ``Embedding``'s gradient: rows of the
    table) are summed by concatenating their rows and values, as one batch's
    gradient repeats an id that occurs twice; the optimizer's sparse update
    adds the repeated rows, so nothing is densified. A sparse and a dense
    gradient give a dense sum (the dense one already has the table's
    shape).

    Examples
    --------
    >>> s = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([3]), tf.constant([5, 2]))
    >>> total = sum_gradients(s, s)
    >>> type(total).__name__, total.indices.numpy().tolist(), total.values.shape.as_list()
    ('IndexedSlices', [3, 3], [2, 2])
    >>> float(tf.reduce_sum(sum_gradients(s, tf.ones((5, 2)))))
    13.0
    """
    sparse_a, sparse_b = isinstance(a, tf.IndexedSlices), isinstance(b, tf.IndexedSlices)
    if sparse_a and sparse_b:
        return tf.IndexedSlices(tf.concat([a.values, b.values], axis=0), tf.concat([a.indices, b.indices], axis=0),
                                a.dense_shape if a.dense_shape is not None else b.dense_shape)
    if sparse_a or sparse_b:
        return tf.math.add_n([tf.convert_to_tensor(a), tf.convert_to_tensor(b)])
    return a + b


def replica_assignment(graph: tf.Graph, plan: Mapping[str, str], layer_devices: Mapping[str, str],
                       groups: Sequence[Sequence[str]], once: Collection[str] = ()) -> dict[str, str]:
    """Op → device for a replicated step: ``replica_r/<op>`` gets ``<op>``'s planned device, mapped to group ``r``.

    Reads of variables stay on the variable's device. Ops outside the
    replica scopes (gradient sums, the update, metrics)
    keep the plan's names and devices (the first group, where the variables
    live); :func:`placer.tf.graphdef.complete_assignment` places the rest. A
    replica's op whose name the plan gives an op that runs once per step
    (``once``, the op graph's ``update`` phase) shares only the name with
    it (``replica_0/mul``, the loss scaled by the replica's rows, against
    the plan's ``mul`` of the loss tracker), so it goes with its first
    placed producer. A replica's gradient op that the plan does not name (the
    gradient of that scaling) runs with the forward op it differentiates, as
    TensorFlow's ``colocate_gradients_with_ops`` would place it: left to its
    first producer (the gradient seed, wherever the plan put the
    unreplicated step's), it sat on another device than the loss, and with
    micro-batches gated per device every micro-batch's backward pass there
    waited for the previous one's on the seed's device (measured:
    ``benchmarks/results/pipeline_orders.md``).
    """
    maps = [dict(zip(groups[0], g)) for g in groups]
    out: dict[str, str] = {}
    for op in graph.get_operations():
        parts = op.name.split("/")
        at = 1 if parts[0] == GRADIENT_SCOPE and len(parts) > 2 else 0  # gradient_tape/replica_r/<forward op>
        scope, _, replica = parts[at].rpartition("_")
        if scope == REPLICA_SCOPE and replica.isdigit():
            rest = "/".join(parts[:at] + parts[at + 1:])
            device = None
            if rest in once:  # the name is all it shares with the plan's op: with its first placed producer
                device = next((out[t.op.name] for t in op.inputs if t.op.name in out), None)
            else:
                planned = plan.get(rest)
                if planned is None and at == 1:
                    device = _forward_device(parts[1:], out)
                planned = planned or layer_devices.get(layer_of(rest))
                if device is None and planned is not None:
                    # a read of a variable runs where the variable lives (TensorFlow moves it)
                    reads = any(t.dtype == tf.resource for t in op.inputs)
                    device = planned if reads else maps[int(replica)][planned]
            if device is not None:
                out[op.name] = device
        elif op.name in plan:
            out[op.name] = plan[op.name]
    return out


def _forward_device(forward_parts: Sequence[str], devices: Mapping[str, str]) -> str | None:
    """The device of the forward op a gradient op differentiates: the longest prefix of its name (below the
    tape's scope) that names a placed op, e.g. ``replica_0/mul`` for ``gradient_tape/replica_0/mul/Mul``."""
    for end in range(len(forward_parts) - 1, 0, -1):
        device = devices.get("/".join(forward_parts[:end]))
        if device is not None:
            return device
    return None
