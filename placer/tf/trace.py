"""Stage 1 — trace a Keras model's forward pass into ``tf.function`` graphs.

Two concrete functions are traced from the same Python call: one with the
planning batch size (every shape static, so tensor bytes are exact) and one
with an unknown batch dimension (what the placed model runs, so it accepts
any batch). TensorFlow gives ops the same names in both traces (see
``../shared/notes/tf-facts.md``), which is what lets a plan made on the first
be applied to the second; :func:`trace_model` checks it.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from ..core.validate import MAX_BATCH_SIZE, integer
from ..errors import InputSignatureError, ModelError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TracedModel:
    """The traced forward pass of one model.

    Attributes
    ----------
    model : keras.Model
        The user's model (read, never modified).
    input_specs : tuple of tf.TensorSpec
        Input signature with an unknown batch dimension.
    batch_size : int
        Batch size used for planning and profiling.
    fixed, dynamic : ConcreteFunction
        Traces with the fixed and with an unknown batch dimension.
    input_names, output_names : tuple of str
        Tensor names of the user inputs and outputs (same in both traces).
    variables : Mapping[str, keras.Variable]
        Captured resource placeholder op name → the Keras variable behind it.
    constants : Mapping[str, tf.Tensor]
        Other captured placeholder op names → captured eager tensor.
    step : str
        ``"predict"`` (the forward pass, inputs are the model's), ``"train"``
        or ``"test"`` (Keras' own ``train_step``/``test_step``: inputs are the
        flattened ``(x, y[, sample_weight])`` batch, outputs the metric logs).
    data_structure : nested structure of tf.TensorSpec or None
        For steps: the batch structure the flat inputs are packed into.
    optimizer_scope : str or None
        For training steps: the name scope of the optimizer's update ops.
    fixed_variables, fixed_constants : Mapping or None
        The captures of the ``fixed`` trace, where it is another trace than ``dynamic`` (a captured
        constant's placeholder is named by a process-wide counter, so the two traces name it differently);
        ``None``: the same as ``variables``/``constants``. Read them through :attr:`fixed_captures`.
    """

    model: Any
    input_specs: tuple[tf.TensorSpec, ...]
    batch_size: int
    fixed: Any
    dynamic: Any
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    variables: Mapping[str, Any]
    constants: Mapping[str, Any]
    step: str = "predict"
    data_structure: Any = None
    optimizer_scope: str | None = None
    fixed_variables: Mapping[str, Any] | None = None
    fixed_constants: Mapping[str, Any] | None = None

    @property
    def fixed_captures(self) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        """``(variables, constants)`` captured by the ``fixed`` trace, keyed by its placeholders' names."""
        return (self.variables if self.fixed_variables is None else self.fixed_variables,
                self.constants if self.fixed_constants is None else self.fixed_constants)

    @property
    def single_input(self) -> bool:
        """Whether the model is called with one tensor rather than a list."""
        return len(self.input_specs) == 1


def random_batch(specs: Sequence[tf.TensorSpec], batch_size: int, seed: int,
                 bounds: Sequence[int | None] = ()) -> list[np.ndarray]:
    """One random batch for ``specs``: standard normal floats; integers uniform in ``[0, bounds[i])`` where
    ``bounds`` gives input ``i`` one (:func:`index_bounds`: the rows of the tables it indexes), else zeros
    (valid indices of anything).

    Examples
    --------
    >>> specs = [tf.TensorSpec((None, 3), "int32"), tf.TensorSpec((None,), "int64")]
    >>> ids, other = random_batch(specs, 4, seed=0, bounds=(10, None))
    >>> ids.shape, bool(ids.min() >= 0 and ids.max() < 10), int(other.max())
    ((4, 3), True, 0)
    """
    rng = np.random.default_rng(seed)
    out = []
    for i, spec in enumerate(specs):
        shape = (batch_size, *spec.shape[1:])
        bound = bounds[i] if i < len(bounds) else None
        if spec.dtype.is_floating:
            out.append(rng.standard_normal(shape).astype(spec.dtype.as_numpy_dtype))
        elif bound and spec.dtype.is_integer:
            out.append(rng.integers(0, bound, shape).astype(spec.dtype.as_numpy_dtype))
        else:
            out.append(np.zeros(shape, dtype=spec.dtype.as_numpy_dtype))
    return out


#: How an integer input's values pass through an op on their way to a gather (:func:`index_bounds`):
#: ``"values"``: the output holds input values (moved, cast or selected); ``"ignore"``: the output says
#: nothing about them (a shape, a comparison); ``"wrap"``: Keras' negative-id wrap ``where(x < 0, x + n, x)``
#: (``x + n`` is only selected for negative ids: followed no further). Any other op: the input's values
#: mean something else there (a label, a length), and it keeps zeros.
INDEX_PASS_OPS: Mapping[str, str] = {
    **dict.fromkeys(("Identity", "Cast", "Reshape", "ExpandDims", "Squeeze", "Transpose", "StridedSlice", "Slice",
                     "Tile", "ConcatV2", "Pack", "Select", "SelectV2"), "values"),
    **dict.fromkeys(("Shape", "ShapeN", "Size", "Rank", "Less", "LessEqual", "Greater", "GreaterEqual", "Equal",
                     "NotEqual"), "ignore"),
    **dict.fromkeys(("AddV2", "Add"), "wrap"),
}

#: Op type → (the input of its row indices, where the rows' count is): ``("params", k)``: the static first
#: dimension of input ``k`` (``GatherV2``: the dimension its axis names); ``("count", k)``: the constant input
#: ``k`` (a segment count; not constant: no bound, as a segment sum drops ids past it rather than fail);
#: ``("variable", k)``: the rows of the variable whose handle is input ``k``.
INDEX_OPS: Mapping[str, tuple[int, tuple[str, int]]] = {
    "GatherV2": (1, ("params", 0)),
    "ResourceGather": (1, ("variable", 0)),
    **dict.fromkeys(("SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN"), (1, ("params", 0))),
    "UnsortedSegmentSum": (1, ("count", 2)),
    **dict.fromkeys(("ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterUpdate", "ResourceScatterMul",
                     "ResourceScatterDiv", "ResourceScatterMin", "ResourceScatterMax"), (1, ("variable", 0))),
}


def _indexed_rows(op: tf.Operation, variable_rows: Mapping[str, int]) -> int | None:
    """How many rows ``op``'s indices select from (:data:`INDEX_OPS`; static), or ``None``."""
    kind, k = INDEX_OPS[op.type][1]
    source = op.inputs[k]
    if kind == "variable":
        return variable_rows.get(source.op.name)
    if kind == "count":
        value = tf.get_static_value(source)
        return None if value is None or np.ndim(value) else int(value)
    axis = tf.get_static_value(op.inputs[2]) if op.type == "GatherV2" else 0
    if axis is None or np.ndim(axis):
        return None
    axis, shape = int(axis), source.shape
    if source.op.type == "ReadVariableOp" and axis == 0 and variable_rows.get(source.op.inputs[0].op.name):
        return variable_rows[source.op.inputs[0].op.name]  # a training trace may not know the read's shape
    if shape.rank is None or not -shape.rank <= axis < shape.rank:
        return None
    return shape[axis]


def _index_bound(graph: tf.Graph, name: str, variable_rows: Mapping[str, int]) -> int | None:
    """The largest valid index of input ``name``'s values plus one: the fewest rows of a table it indexes
    (through :data:`INDEX_PASS_OPS` to :data:`INDEX_OPS`), where every use of its values ends in such an op;
    else ``None``."""
    bounds: list[int] = []
    seen: set[tuple[str, int]] = set()
    stack = [graph.get_tensor_by_name(name)]
    while stack:
        t = stack.pop()
        for consumer in t.consumers():
            for position, x in enumerate(consumer.inputs):
                if x.name != t.name or (consumer.name, position) in seen:
                    continue
                seen.add((consumer.name, position))
                if consumer.type in INDEX_OPS and position == INDEX_OPS[consumer.type][0]:
                    rows = _indexed_rows(consumer, variable_rows)
                    if rows is not None:
                        bounds.append(rows)
                    elif INDEX_OPS[consumer.type][1][0] != "count":  # a segment sum drops ids past its count
                        return None
                    continue
                how = INDEX_PASS_OPS.get(consumer.type)
                wrapped = consumer.outputs[0].name if how == "wrap" else ""
                if how == "wrap" and all(c.type in ("Select", "SelectV2") and c.inputs[0].name != wrapped
                                         for c in consumer.outputs[0].consumers()):
                    continue
                if how == "ignore" or (consumer.type in ("Select", "SelectV2") and position == 0):
                    continue
                if how != "values":
                    return None
                stack.extend(consumer.outputs)
    return min(bounds) if bounds else None


def index_bounds(traced: TracedModel, table_rows: Mapping[str, int] | None = None) -> tuple[int | None, ...]:
    """Per input of ``traced`` (its flat inputs, in order): the valid indices' bound of an integer input whose
    values only index tables (an ``Embedding``'s ids: the table's rows), else ``None``. ``table_rows``: resource
    placeholder → the rows a stand-in of that table has (:func:`placer.tf.graphdef.row_tables`), instead of its
    variable's.

    Profiling and timing feed such inputs random ids below the bound (:func:`random_batch`): fed zeros, every
    lookup reads and every sparse update writes one row, which stays in cache, and a 98 MiB table's gather
    and update were profiled 4× and 1.5× faster than they ran in the step (2026-12-06).

    Examples
    --------
    >>> import keras
    >>> ids = keras.Input((3,), dtype="int32")
    >>> m = keras.Model(ids, keras.layers.Embedding(50, 4)(ids))
    >>> index_bounds(trace_model(m, batch_size=2))
    (50,)
    """
    graph, variables = traced.fixed.graph, traced.fixed_captures[0]
    rows = {name: int(v.shape[0]) for name, v in variables.items() if len(v.shape) and v.shape[0] is not None}
    rows.update(table_rows or {})
    return tuple(_index_bound(graph, name, rows) if spec.dtype.is_integer else None
                 for name, spec in zip(traced.input_names, traced.input_specs))


def traced_batch(traced: TracedModel, seed: int, table_rows: Mapping[str, int] | None = None) -> list[np.ndarray]:
    """One random batch of ``traced``'s planning batch size for its flat inputs (:func:`random_batch` with
    :func:`index_bounds`, ``table_rows`` as there): what the costs stage profiles and timings run."""
    return random_batch(traced.input_specs, traced.batch_size, seed, index_bounds(traced, table_rows))


def _specs_from_model(model: Any) -> list[tf.TensorSpec]:
    try:
        symbolic = model.inputs  # functional and Sequential models; subclassed ones lack it
    except (AttributeError, ValueError):
        symbolic = None
    if symbolic:
        flat = tf.nest.flatten(symbolic)
        return [tf.TensorSpec(t.shape, t.dtype, name=getattr(t, "name", None)) for t in flat]
    shapes = getattr(model, "_build_shapes_dict", None)
    if model.built and shapes and len(shapes) == 1:
        shape = next(iter(shapes.values()))
        if shape is not None and isinstance(shape, (tuple, list)) and all(
            s is None or isinstance(s, int) for s in shape
        ):
            dtype = getattr(model, "input_dtype", None) or "float32"
            return [tf.TensorSpec(tuple(shape), dtype)]
    raise InputSignatureError(
        f"cannot tell the input shapes of model {model.name!r}: it has no symbolic inputs and was not "
        "built with a single input shape. Call model.build(shape) or model(x) once, or pass "
        "input_signature=[tf.TensorSpec((batch, ...), 'float32')]."
    )


def is_shape(entry: Any) -> bool:
    """Whether ``entry`` is a shape: a tuple or list of ints and ``None``."""
    return isinstance(entry, (tuple, list)) and all(
        d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in entry)


def as_spec(entry: Any, what: str) -> tf.TensorSpec:
    """``entry`` as a ``tf.TensorSpec``: a spec as it is, a shape as float32.

    Raises
    ------
    InputSignatureError
        If ``entry`` is neither (``what`` names the option in the message).

    Examples
    --------
    >>> as_spec((None, 3), "input_signature")
    TensorSpec(shape=(None, 3), dtype=tf.float32, name=None)
    """
    if isinstance(entry, tf.TensorSpec):
        return entry
    if is_shape(entry):
        return tf.TensorSpec(tuple(entry), "float32")
    raise InputSignatureError(f"{what} entry {entry!r} is neither a tf.TensorSpec nor a shape tuple")


def _normalise_specs(
    model: Any, input_signature: Sequence[Any] | None, batch_size: int | None
) -> tuple[tuple[tf.TensorSpec, ...], int]:
    if input_signature is not None:
        if isinstance(input_signature, tf.TensorSpec):
            input_signature = [input_signature]
        elif isinstance(input_signature, Mapping):  # by input name, as a dict-input model takes its inputs
            keys = input_keys(model)
            if keys is None or set(map(str, input_signature)) != set(keys):
                raise InputSignatureError(
                    f"input_signature names the inputs {sorted(map(str, input_signature))}; model {model.name!r} "
                    + (f"takes {list(keys)} by name" if keys is not None else "does not take its inputs as a dict: "
                       "give a list of specs in the model's input order"))
            input_signature = [_named(as_spec(input_signature[k], f"input_signature[{k!r}]"), k) for k in keys]
        elif not isinstance(input_signature, (list, tuple)) or is_shape(input_signature):
            input_signature = [input_signature]
        specs = [as_spec(s, "input_signature") for s in input_signature]
    else:
        specs = _specs_from_model(model)
    batches = {s.shape[0] for s in specs if s.shape.rank and s.shape[0] is not None}
    if batch_size is not None:
        batch = integer("batch_size", batch_size, minimum=1, maximum=MAX_BATCH_SIZE, error=InputSignatureError)
    elif len(batches) == 1:
        batch = batches.pop()
    else:
        raise InputSignatureError(
            f"the batch dimension of model {model.name!r} is unknown (input shapes "
            f"{[tuple(s.shape) for s in specs]}); pass batch_size=N (the batch you will run) "
            "or an input_signature with a fixed batch"
        )
    for s in specs:
        if s.shape.rank is None or s.shape.rank == 0:
            raise InputSignatureError(f"input {s.name!r} needs a known rank of at least 1 (a batch dimension)")
        if any(d is None for d in s.shape[1:]):
            raise InputSignatureError(
                f"input {s.name!r} has unknown non-batch dimensions {tuple(s.shape)}; "
                "pass an input_signature with every non-batch dimension known"
            )
    _check_batch_fits(specs, batch)
    dyn = tuple(with_batch(s, None) for s in specs)
    return dyn, batch


def _named(spec: tf.TensorSpec, name: str) -> tf.TensorSpec:
    return spec if spec.name else tf.TensorSpec(spec.shape, spec.dtype, name=name)


def signature_from_sample(model: Any, sample: Any) -> tuple[list[tf.TensorSpec], int]:
    """``(input_signature, batch size)`` of a sample batch of ``model``'s inputs (one array, a list in the
    model's input order, or a dict by input name): each spec with an unknown batch dimension and the sample's
    other dimensions, which need not be the model's declared ones (a sequence length the model leaves open).

    Raises
    ------
    InputSignatureError
        A sample that is not arrays, arrays of different batch sizes, or a dict that names other inputs.

    Examples
    --------
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((None, 3)), keras.layers.Dense(2)])
    >>> specs, batch = signature_from_sample(m, np.zeros((4, 7, 3), "float32"))
    >>> [tuple(s.shape) for s in specs], batch
    ([(None, 7, 3)], 4)
    """
    keys = input_keys(model)
    if isinstance(sample, Mapping):
        if keys is None or set(map(str, sample)) != set(keys):
            raise InputSignatureError(f"the sample names the inputs {sorted(map(str, sample))}; model {model.name!r} "
                                      + (f"takes {list(keys)}" if keys else "does not take a dict"))
        flat, names = [sample[k] for k in keys], list(keys)
    else:
        flat = list(sample) if isinstance(sample, (list, tuple)) else [sample]
        names = [None] * len(flat)
    specs, batches = [], set()
    for value, name in zip(flat, names):
        try:
            t = tf.convert_to_tensor(value)
        except (TypeError, ValueError) as e:
            raise InputSignatureError(f"the sample holds a {type(value).__name__}, not an array: "
                                      f"{str(e).splitlines()[0][:120]}") from None
        if t.shape.rank is None or t.shape.rank < 1:
            raise InputSignatureError("each array of the sample needs a batch dimension")
        specs.append(tf.TensorSpec((None, *t.shape[1:]), t.dtype, name=name))
        batches.add(int(t.shape[0]))
    if len(batches) != 1:
        raise InputSignatureError(f"the sample's arrays have different batch sizes {sorted(batches)}")
    return specs, batches.pop()


def _check_batch_fits(specs: Sequence[tf.TensorSpec], batch: int) -> None:
    """Planning materialises one batch of every input (and more): refuse one that cannot fit in memory."""
    nbytes = batch * sum(int(np.prod(s.shape[1:], dtype=np.float64)) * s.dtype.size for s in specs)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: no check
        return
    if nbytes > ram / 4:
        raise InputSignatureError(
            f"one planning batch of {batch} rows takes {nbytes / 2**30:.3g} GiB of inputs alone, more than a quarter "
            f"of this machine's {ram / 2**30:.3g} GiB; plan at a smaller batch_size (the placed model runs any "
            "batch size)")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def keras_message(error: BaseException) -> str:
    """The reason inside a Keras call error, on one line, without terminal colour codes."""
    text = _ANSI.sub("", str(error))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    body = [ln for ln in lines if not ln.startswith(("Exception encountered", "Arguments received", "•"))]
    return " ".join(body or lines)[:400].rstrip(".")


def _advice_for(error: BaseException) -> str:
    text = str(error)
    if "unknown TensorShape" in text or "unknown rank" in text:
        return ("A layer's output has no static shape (tf.py_function and tf.numpy_function give none): set it in "
                "the layer's call, e.g. y = tf.ensure_shape(y, (None, 3)), or y.set_shape(x.shape)")
    return "Check input_signature and batch_size (the model must run on inputs of these shapes)"


def check_model(model: Any) -> None:
    """Raise :class:`ModelError` unless ``model`` is a built Keras 3 model (autoplace never builds it)."""
    if not isinstance(model, keras.Model):
        raise ModelError(
            f"autoplace needs a keras.Model (Keras 3, TensorFlow backend), got {type(model).__name__}"
        )
    if keras.backend.backend() != "tensorflow":
        raise ModelError(f"Keras backend is {keras.backend.backend()!r}; set KERAS_BACKEND=tensorflow")
    if not model.built:
        raise InputSignatureError(
            f"model {model.name!r} is not built (it has no weights yet), and autoplace never builds or changes "
            "your model: call model.build(input_shape) or model(x) once first (an input_signature alone "
            "does not build it)")


def input_keys(model: Any) -> tuple[str, ...] | None:
    """The keys of a model whose inputs are a dict, in the order of ``model.inputs``; else None."""
    try:
        structure = model.input
    except (AttributeError, ValueError):  # subclassed models have no symbolic input
        return None
    return tuple(sorted(structure)) if isinstance(structure, Mapping) else None


def model_inputs(model: Any, xs: Sequence[Any]) -> Any:
    """What ``model`` takes for the flat inputs ``xs``: a dict by key for dict-input models, else one or a list."""
    keys = input_keys(model)
    if keys is not None and len(keys) == len(xs):
        return dict(zip(keys, xs))
    return xs[0] if len(xs) == 1 else list(xs)


def _captures(fn: Any, known_variables: Sequence[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Captured resource placeholders → Keras variables, other captures → tensors."""
    by_handle = {id(v.value.handle): v for v in known_variables}
    variables: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    for external, internal in fn.graph.captures:
        if internal.dtype == tf.resource:
            var = by_handle.get(id(external))
            if var is None:
                lookup = "Lookup" in internal.op.name or "table" in internal.op.name.lower()
                raise ModelError(
                    f"op {internal.op.name!r} captures a resource that is not one of the model's variables "
                    "(a lookup table or a variable created outside the model); autoplace cannot move it yet. "
                    + ("Run StringLookup/IntegerLookup/TextVectorization outside the placed model (in the "
                       "tf.data pipeline, dataset.map(lookup), or a separate preprocessing model) and place the "
                       "model that takes their integer output" if lookup else
                       "Create every variable inside the model's layers (self.add_weight)"))
            variables[internal.op.name] = var
        else:
            constants[internal.op.name] = external
    return variables, constants


def trace_model(model: Any, *, batch_size: int | None = None,
                input_signature: Sequence[Any] | None = None, training: bool = False) -> TracedModel:
    """Trace ``model(x, training=training)`` with fixed and unknown batch size.

    Parameters
    ----------
    model : keras.Model
    batch_size : int, optional
        Planning batch size; required when the model's batch is unknown.
    input_signature : sequence of tf.TensorSpec or shape tuples, optional
        Overrides the model's own input shapes (needed for subclassed models
        that were never built).
    training : bool
        The forward pass in training mode (dropout on, batch statistics).

    Raises
    ------
    ModelError, InputSignatureError

    Examples
    --------
    >>> import keras
    >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> t = trace_model(m, batch_size=4)
    >>> t.batch_size, [tuple(s.shape) for s in t.input_specs]
    (4, [(None, 3)])
    """
    check_model(model)
    specs, batch = _normalise_specs(model, input_signature, batch_size)

    def forward(*xs: tf.Tensor) -> Any:
        return model(model_inputs(model, xs), training=training)

    fn = tf.function(forward, autograph=False)
    fixed_specs = [with_batch(s, batch) for s in specs]
    try:
        fixed = fn.get_concrete_function(*fixed_specs)
        dynamic = fn.get_concrete_function(*specs)
    except (TypeError, ValueError) as e:
        raise InputSignatureError(
            f"calling model {model.name!r} on inputs {[tuple(s.shape) for s in fixed_specs]} failed: "
            f"{keras_message(e)}. {_advice_for(e)}") from e
    names_fixed = {op.name for op in fixed.graph.get_operations()}
    names_dyn = [op.name for op in dynamic.graph.get_operations()]
    extra = [n for n in names_dyn if n not in names_fixed]
    if extra:
        # e.g. Flatten/Reshape compute the batch dimension at run time; the emitter
        # places these few shape ops next to their neighbours.
        log.info("%d ops exist only in the unknown-batch trace (shape computations), e.g. %s", len(extra),
                 extra[:3])
    variables, constants = _captures(dynamic, model.variables)
    fixed_variables, fixed_constants = _captures(fixed, model.variables)
    n_user = len(specs)
    log.info("traced %s: %d ops, %d variables, batch %d", model.name, len(names_dyn), len(variables), batch)
    return TracedModel(
        model=model,
        input_specs=specs,
        batch_size=batch,
        fixed=fixed,
        dynamic=dynamic,
        input_names=tuple(t.name for t in dynamic.inputs[:n_user]),
        output_names=tuple(t.name for t in dynamic.outputs),
        variables=variables,
        constants=constants,
        fixed_variables=fixed_variables,
        fixed_constants=fixed_constants,
    )


def with_batch(spec: Any, batch: int | None) -> tf.TensorSpec:
    """``spec`` with batch dimension ``batch`` (``None``: unknown), its other dimensions and name kept."""
    return tf.TensorSpec((batch, *spec.shape[1:]), spec.dtype, name=spec.name)


def trace_step(shell: Any, step: str, data_structure: Any, *, batch_size: int | None,
               known_variables: Sequence[Any], body: Any = None) -> TracedModel:
    """Trace Keras' own ``train_step`` or ``test_step`` of ``shell`` on one batch structure.

    ``shell`` is the compiled :class:`~placer.tf.placed_model.PlacedModel`
    before placement: it calls the user's model, so the traced step is the
    same math as ``model.fit`` / ``model.evaluate`` (loss, regularisation
    losses, gradients, the optimizer's update and the metric updates).

    Parameters
    ----------
    shell : keras.Model
    step : str
        ``"train"`` or ``"test"``.
    data_structure : nested structure of tf.TensorSpec
        ``(x, y)`` or ``(x, y, sample_weight)``, batch dimension ``None``.
    batch_size : int or None
        Batch size of the trace (``None``: any batch; what the placed step runs).
    known_variables : sequence of keras.Variable
        Every variable the step may capture (model, optimizer, metrics).
    body : callable, optional
        ``body(shell, data)`` to trace instead of Keras' own step (the
        replicated training step).

    Raises
    ------
    InputSignatureError
        If the model cannot be called on the batch (e.g. labels of the wrong shape).
    """
    import keras

    base = body or {"train": keras.Model.train_step, "test": keras.Model.test_step}[step]
    specs = [with_batch(s, batch_size) for s in tf.nest.flatten(data_structure)]

    def run(*flat: tf.Tensor) -> Any:
        return base(shell, tf.nest.pack_sequence_as(data_structure, list(flat)))

    fn = tf.function(run, autograph=False)
    try:
        concrete = fn.get_concrete_function(*specs)
    except (TypeError, ValueError) as e:
        shapes = tf.nest.map_structure(lambda s: tuple(s.shape), data_structure)
        raise InputSignatureError(
            f"tracing the {step} step of {shell.name!r} on a batch of shapes {shapes} failed: {e}. "
            "Check that the labels match the model's outputs (shape and structure) and the loss") from e
    variables, constants = _captures(concrete, known_variables)
    log.info("traced the %s step: %d ops, %d variables, batch %s", step, len(concrete.graph.get_operations()),
             len(variables), batch_size)
    optimizer = getattr(shell, "optimizer", None)
    return TracedModel(
        model=shell, input_specs=tuple(tf.nest.flatten(data_structure)), batch_size=batch_size or 0,
        fixed=concrete, dynamic=concrete, input_names=tuple(t.name for t in concrete.inputs[:len(specs)]),
        output_names=tuple(t.name for t in tf.nest.flatten(concrete.structured_outputs)),
        variables=variables, constants=constants, step=step, data_structure=data_structure,
        optimizer_scope=optimizer.name if step == "train" and optimizer is not None else None)


def trace_training_step(model: Any, *, batch_size: int | None = None, loss: Any = "mean_squared_error",
                        optimizer: Any = "adam", input_signature: Sequence[Any] | None = None) -> TracedModel:
    """Trace one full training step: forward, loss, gradients and the optimizer update.

    The returned :class:`TracedModel` is for *planning* (op graph, profiling,
    solving): its ``fixed`` trace takes the model inputs followed by one target
    per model output, returns the loss, and updates the variables; ``dynamic``
    is the same fixed-batch trace (placed training is not emitted yet).

    Parameters
    ----------
    model : keras.Model
    batch_size : int, optional
    loss, optimizer : str or Keras object
        Anything ``keras.losses.get`` / ``keras.optimizers.get`` accept; the
        optimizer is a fresh copy, built on the model's trainable variables
        (its slots count as resident memory).

    Examples
    --------
    >>> import keras
    >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> t = trace_training_step(m, batch_size=4)
    >>> len(t.variables)   # kernel, bias, Adam's 2 slots each, iteration, learning rate
    8
    """
    import keras

    check_model(model)
    specs, batch = _normalise_specs(model, input_signature, batch_size)
    opt = keras.optimizers.get(optimizer)
    opt = opt.__class__.from_config(opt.get_config())
    loss_fn = keras.losses.get(loss)
    trainable = list(model.trainable_variables)
    opt.build(trainable)
    fixed_specs = [with_batch(s, batch) for s in specs]
    try:
        sample = model(model_inputs(model, [tf.zeros(s.shape, s.dtype) for s in fixed_specs]), training=False)
    except (TypeError, ValueError) as e:
        raise InputSignatureError(f"calling model {model.name!r} on {[tuple(s.shape) for s in fixed_specs]} "
                                  f"failed: {e}") from e
    outputs = tf.nest.flatten(sample)
    target_specs = [tf.TensorSpec(o.shape, o.dtype, name=f"target_{i}") for i, o in enumerate(outputs)]
    n_in = len(specs)

    def step(*args: tf.Tensor) -> tf.Tensor:
        xs, ys = args[:n_in], args[n_in:]
        with tf.GradientTape() as tape:
            preds = tf.nest.flatten(model(model_inputs(model, xs), training=True))
            total = tf.add_n([tf.reduce_mean(loss_fn(y, p)) for y, p in zip(ys, preds)])
            if model.losses:
                total = total + tf.add_n(model.losses)
        grads = tape.gradient(total, trainable)
        opt.apply(grads, trainable)
        return total

    fn = tf.function(step, autograph=False)
    fixed = fn.get_concrete_function(*fixed_specs, *target_specs)
    variables, constants = _captures(fixed, [*model.variables, *opt.variables])
    log.info("traced the training step of %s: %d ops, %d variables, batch %d", model.name,
             len(fixed.graph.get_operations()), len(variables), batch)
    return TracedModel(
        model=model,
        input_specs=(*specs, *(with_batch(t, None) for t in target_specs)),
        batch_size=batch,
        fixed=fixed,
        dynamic=fixed,
        input_names=tuple(t.name for t in fixed.inputs[: n_in + len(target_specs)]),
        output_names=tuple(t.name for t in fixed.outputs),
        variables=variables,
        constants=constants,
    )
