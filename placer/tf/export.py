"""SavedModel export of a placed model, and re-mapping it onto other devices.

An export is a plain SavedModel: per-op devices live in the saved
FunctionDefs, variable devices are kept with ``SAVE_VARIABLE_DEVICES``, and
``tf.saved_model.load(path, options=LOAD_OPTIONS)`` serves it on the same
devices (``serving_default`` takes the inputs by name and returns
``{"output_0": …}``).

It also carries what re-mapping needs, in ``assets.extra/autoplace/`` (a
folder TensorFlow ignores; TF Serving's convention for extra files):

* ``manifest.json`` — format, inputs, outputs, which saved variable feeds
  which placeholder of the graph, the micro-batches and whether awaited
  transfers were acknowledged (``sends``);
* ``graph_def.pb`` — the placed forward GraphDef, before the schedule's
  rewrites (:data:`placer.tf.rewrites.REWRITES`: the planned order,
  micro-batch copies, acknowledgements), captured constants folded in as
  ``Const`` nodes;
* ``plan.json`` and ``ops.json`` — the plan and the cost-annotated op graph
  with its devices (``docs/graph-format.md``);
* where ops are split: ``whole_graph_def.pb`` and ``whole_ops.json`` — the
  forward GraphDef and the op graph before any split — and the manifest's
  ``resplit`` (the splits, by their ops), so that :func:`load` onto another
  number of devices splits the same ops into one part per device (or runs
  them whole on one).

:func:`load` rebuilds the placed function from these alone (no model code)
on the saved devices, or on a **different** device list — fewer, more or
renamed — by re-solving the saved op graph and costs, and runs the same
rewrites on it as :func:`placer.tf.emit.emit` (:func:`~placer.tf.emit.rewrite_graph_def`:
its devices, the plan's order, the manifest's micro-batches and
acknowledged sends) before importing
it the same way (:func:`~placer.tf.emit.import_function`). TensorFlow itself
would silently run everything on the devices that exist (soft placement);
asking for devices this process does not have is a :class:`DeviceError`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError

from ..core.build import build_problem
from ..core.devices import DeviceSet, resolve_devices
from ..core.graph_io import load_graph, save_graph
from ..core.order import MODEL_EXECUTION_ORDER
from ..core.outputs import new_directory
from ..core.plan import Plan
from ..core.replicas import device_groups
from ..core.splits import (Split, is_split_node, pair_ops, resharded, split_from_dict, split_graph,
                           split_map, split_to_dict, spread_parts)
from ..errors import AutoplaceError, DeviceError, ExportError, OutputError, PlanError
from ..planner import MODEL_MEMORY, PlanOptions, plan_problem
from .emit import EmittedModel, copies_in, import_function, observed_devices, rewrite_graph_def, shards_in
from .graphdef import complete_assignment, layer_devices_of, tf_variable
from .remote import variable_on
from .rewrites import RewriteContext, find_record
from .rewrites.sends import send_rule
from .rewrites.split import Shard, splittable

log = logging.getLogger(__name__)

SAVE_OPTIONS = tf.saved_model.SaveOptions(
    experimental_variable_policy=tf.saved_model.experimental.VariablePolicy.SAVE_VARIABLE_DEVICES)
#: Options to pass to ``tf.saved_model.load`` so variables return to their devices.
LOAD_OPTIONS = tf.saved_model.LoadOptions(experimental_variable_policy="save_variable_devices")
#: Where an export keeps its plan, op graph and GraphDef (inside the SavedModel directory).
EXTRA_DIR = os.path.join("assets.extra", "autoplace")
#: Identifies the manifest, and its version (:func:`load` reads this version).
EXPORT_FORMAT, EXPORT_VERSION = "autoplace-export", 1


def _arg_name(spec: tf.TensorSpec, i: int) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", spec.name or "")
    return name if name and name[0].isalpha() else f"input_{i}"


def _structure(x: Any) -> Any:
    """A JSON description of a nest of tensors (``None`` for each tensor)."""
    if isinstance(x, dict):
        return {"dict": {str(k): _structure(v) for k, v in x.items()}}
    if isinstance(x, (list, tuple)):
        return {"list" if isinstance(x, list) else "tuple": [_structure(v) for v in x]}
    return None


def _unstructure(s: Any) -> Any:
    """The inverse of :func:`_structure`, with ``0`` for each tensor (for ``tf.nest.pack_sequence_as``)."""
    if s is None:
        return 0
    if "dict" in s:
        return {k: _unstructure(v) for k, v in s["dict"].items()}
    items = [_unstructure(v) for v in s.get("list", s.get("tuple", []))]
    return items if "list" in s else tuple(items)


def _fold_constants(gd: tf.compat.v1.GraphDef, constants: Mapping[str, Any]) -> str | None:
    """Replace each captured-constant placeholder of ``gd`` by a ``Const`` node; why not, if impossible."""
    by_name = {n.name: n for n in gd.node}
    for name, value in constants.items():
        if value.dtype in (tf.resource, tf.variant):
            return f"the graph captures a {value.dtype.name} tensor ({name!r}) that is not a variable"
        node = by_name[name]
        device = node.device
        node.Clear()
        node.name, node.op, node.device = name, "Const", device
        node.attr["dtype"].type = value.dtype.as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value.numpy()))
    return None


def _unfold_constants(gd: tf.compat.v1.GraphDef, names: Sequence[str]) -> dict[str, tf.Tensor]:
    """Turn the ``Const`` nodes ``names`` of ``gd`` (captured constants an export stored as constants) back into
    placeholders (in place); returns each one's value, to feed as a capture."""
    by_name = {n.name: n for n in gd.node}
    values = {}
    for name in names:
        node = by_name[name]
        value = tf.constant(tf.make_ndarray(node.attr["value"].tensor))
        device = node.device
        node.Clear()
        node.name, node.op, node.device = name, "Placeholder", device
        node.attr["dtype"].type = value.dtype.as_datatype_enum
        node.attr["shape"].shape.CopyFrom(value.shape.as_proto())
        values[name] = value
    return values


def _variable_key(i: int) -> str:
    """Checkpoint key of ``module.placed_variables[i]`` in a SavedModel written here."""
    return f"placed_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"


@dataclass(frozen=True)
class WholeGraphs:
    """What an export of a split placement keeps so that :func:`load` can split the same ops into another number
    of parts (one per device it is loaded on; none on one device).

    Attributes
    ----------
    graph_def : GraphDef
        The forward pass's graph before any rewrite (no op split).
    op_graph : networkx.DiGraph
        The planned step's cost-annotated op graph before any split.
    splits : tuple of Split
        The plan's splits as found on the planned step (their part counts are the export's).
    """

    graph_def: tf.compat.v1.GraphDef
    op_graph: Any
    splits: tuple[Split, ...]


def export_saved_model(emitted: EmittedModel, path: str | os.PathLike, *, plan: Plan, op_graph: Any,
                       devices: DeviceSet, shards: Sequence[Shard] | None = None,
                       whole: WholeGraphs | None = None) -> str:
    """Save the placed forward function with a ``serving_default`` signature, and what re-mapping needs.

    The variables are ``emitted.variables`` (feeding ``emitted.variable_placeholders``) that the placed graph
    reads, and the shards of split ops' weights (``emitted.shard_variables``, each on its device: what
    serving runs); the manifest's ``shards`` maps each shard to its slice of the logical weight (``shards``:
    those of an export being saved again; default ``emitted.shards``); ``whole``, where ops are split, lets
    :func:`load` split them into another number of parts (``whole_graph_def.pb``, ``whole_ops.json`` and the
    manifest's ``resplit``). The
    signature takes the model's inputs by name (``input_0``… when a name is
    unusable) and returns ``{"output_0": …, "output_1": …}`` in the flattened
    order of the model's outputs.

    Raises
    ------
    OutputError
        If ``path`` is a file or a non-empty directory, or cannot be written (a full disk, say).
    ExportError
        If TensorFlow cannot save the function.

    Nothing is left behind on failure: the SavedModel is written to a temporary
    sibling directory and renamed to ``path`` when complete.
    """
    path = os.fspath(path)
    input_specs = emitted.input_specs
    names = [_arg_name(s, i) for i, s in enumerate(input_specs)]
    if len(set(names)) != len(names):
        names = [f"input_{i}" for i in range(len(names))]
    specs = [tf.TensorSpec(s.shape, s.dtype, name=n) for s, n in zip(input_specs, names)]
    function = emitted.function
    shards = tuple(emitted.shards if shards is None else shards)
    present = {n.name for n in emitted.placed_graph_def.node}  # a split weight's placeholder is gone: its shards
    held = [(ph, tf_variable(v)) for ph, v in zip(emitted.variable_placeholders, emitted.variables) if ph in present]
    held += [(s.placeholder, tf_variable(v)) for s, v in zip(emitted.shards, emitted.shard_variables)]
    placeholders, variables = [ph for ph, _ in held], [v for _, v in held]

    def serve(*xs: tf.Tensor) -> dict[str, tf.Tensor]:
        flat = tf.nest.flatten(function(*xs))
        return {f"output_{i}": t for i, t in enumerate(flat)}

    module = tf.Module()
    module.placed_variables = list(variables)
    module.mirror_variables = [tf_variable(v) for v in emitted.mirror_variables]  # data-parallel groups' copies
    module.forward = function
    module.serve = tf.function(serve, input_signature=specs, autograph=False)
    gd = tf.compat.v1.GraphDef()
    gd.CopyFrom(emitted.placed_graph_def)  # the schedule (plan.json's order, the micro-batches) is applied at load
    not_remappable = _fold_constants(gd, emitted.constants)
    whole_gd = None
    if whole is not None and not_remappable is None:
        whole_gd = tf.compat.v1.GraphDef()
        whole_gd.CopyFrom(whole.graph_def)
        unfolded = {n.name for n in whole_gd.node if n.op == "Placeholder"}  # (a loaded export's are folded)
        _fold_constants(whole_gd, {k: v for k, v in emitted.constants.items() if k in unfolded})
    manifest = {
        "format": EXPORT_FORMAT, "version": EXPORT_VERSION,
        "inputs": [{"name": n, "tensor": t, "shape": s.shape.as_list(), "dtype": s.dtype.name}
                   for n, t, s in zip(names, emitted.input_names, input_specs)],
        "outputs": list(emitted.output_names), "output_structure": _structure(emitted.structured_outputs),
        "variables": [{"placeholder": ph, "key": _variable_key(i), "device": v.device, "dtype": v.dtype.name,
                       "shape": v.shape.as_list()}
                      for i, (ph, v) in enumerate(zip(placeholders, variables))],
        # each saved shard of a split op's weight: its slice of the logical (unsplit) variable
        "shards": [{"placeholder": s.placeholder, "variable": s.variable, "start": s.start, "stop": s.stop,
                    "axis": s.axis, "pieces": s.pieces} for s in shards],
        "remappable": not_remappable is None, "not_remappable_because": not_remappable,
        "microbatches": emitted.microbatches // emitted.replicas,
        "replicas": emitted.replicas,
        "sends": "executor" if emitted.sends is None else "prompt",
        # the captured constants stored as Const nodes: fed again as captures at load, as the placed function
        # feeds them (as Consts, Grappler folds arithmetic through them and the last bits change)
        "constants": sorted(emitted.constants) if not_remappable is None else [],
    }
    if whole_gd is not None:  # the splits, to be made again with another part count (their parts: the shards')
        manifest["resplit"] = {"splits": [split_to_dict(s) for s in whole.splits]}  # type: ignore[union-attr]
    with new_directory(path) as tmp:
        try:
            tf.saved_model.save(module, tmp, signatures={"serving_default": module.serve}, options=SAVE_OPTIONS)
            extra = os.path.join(tmp, EXTRA_DIR)
            os.makedirs(extra)
            with open(os.path.join(extra, "graph_def.pb"), "wb") as f:
                f.write(gd.SerializeToString())
            with open(os.path.join(extra, "manifest.json"), "w") as f:
                json.dump(manifest, f, indent=1)
            plan.save(os.path.join(extra, "plan.json"))
            save_graph(os.path.join(extra, "ops.json"), op_graph, devices)
            if whole_gd is not None:
                with open(os.path.join(extra, "whole_graph_def.pb"), "wb") as f:
                    f.write(whole_gd.SerializeToString())
                save_graph(os.path.join(extra, "whole_ops.json"), whole.op_graph, devices)  # type: ignore[union-attr]
        except OSError as e:
            raise OutputError(f"cannot write the SavedModel {path!r}: {e.strerror or e}; nothing was left there") from e
        except AutoplaceError:
            raise
        except Exception as e:  # noqa: BLE001  (TF raises many types here)
            if "No space left" in str(e) or "Read-only file system" in str(e):  # TF's own IO errors
                raise OutputError(f"cannot write the SavedModel {path!r}: {str(e).strip().splitlines()[0]}; "
                                  "nothing was left there") from e
            raise ExportError(f"saving the placed model to {path!r} failed: {e}") from e
    log.info("exported placed model to %s", path)
    return path


@dataclass(frozen=True)
class _Export:
    """What an export directory holds for :func:`load`, read and checked (:func:`read_export`)."""

    path: str
    manifest: Mapping[str, Any]
    graph_def: tf.compat.v1.GraphDef
    plan: Plan
    op_graph: Any
    #: The saved value of each manifest variable, in its order.
    values: tuple[Any, ...]
    #: Where ops are split: what splitting them into another number of parts needs (``None``: not kept).
    whole: WholeGraphs | None = None


#: A manifest's shape (``manifest.json``): every field's type and range, checked before anything is used.
_NAME = {"type": "string", "minLength": 1, "maxLength": 4096}
_TENSOR = {"type": "string", "pattern": r"^[A-Za-z0-9.][A-Za-z0-9_.\-/]*:[0-9]+$", "maxLength": 4096}
MANIFEST_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["format", "version", "inputs", "outputs", "variables", "output_structure"],
    "properties": {
        "format": {"const": EXPORT_FORMAT},
        "version": {"const": EXPORT_VERSION},
        "inputs": {"type": "array", "minItems": 1, "maxItems": 10000, "items": {
            "type": "object", "required": ["name", "tensor", "shape", "dtype"],
            "properties": {"name": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_]*$", "maxLength": 256},
                           "tensor": _TENSOR,
                           "shape": {"type": "array", "minItems": 1, "maxItems": 64,
                                     "items": {"type": ["integer", "null"], "minimum": 0, "maximum": 2**40}},
                           "dtype": {"type": "string", "enum": ["float16", "bfloat16", "float32", "float64", "int8",
                                                                "int16", "int32", "int64", "uint8", "bool",
                                                                "string", "complex64", "complex128"]}}}},
        "outputs": {"type": "array", "minItems": 1, "maxItems": 100000, "items": _TENSOR},
        "variables": {"type": "array", "maxItems": 1000000, "items": {
            "type": "object", "required": ["placeholder", "key"],
            "properties": {"placeholder": _NAME,
                           "key": {"type": "string",
                                   "pattern": r"^placed_variables/[0-9]+/\.ATTRIBUTES/VARIABLE_VALUE$"},
                           "device": {"type": "string", "maxLength": 4096},
                           "dtype": {"type": "string", "maxLength": 32},
                           "shape": {"type": "array", "maxItems": 64,
                                     "items": {"type": "integer", "minimum": 0, "maximum": 2**40}}}}},
        "remappable": {"type": "boolean"},
        "not_remappable_because": {"type": ["string", "null"]},
        "microbatches": {"type": "integer", "minimum": 1, "maximum": 1 << 20},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 1 << 10},
        "sends": {"enum": ["executor", "prompt"]},
        "constants": {"type": "array", "maxItems": 1000000, "items": _NAME},
        "shards": {"type": "array", "maxItems": 1000000, "items": {
            "type": "object", "required": ["placeholder", "variable", "start", "stop", "axis"],
            "properties": {"placeholder": _NAME, "variable": _NAME,
                           "start": {"type": "integer", "minimum": 0, "maximum": 2**40},
                           "stop": {"type": "integer", "minimum": 1, "maximum": 2**40},
                           "axis": {"type": "integer", "minimum": 0, "maximum": 63},
                           "pieces": {"type": "boolean"}}}},
        "resplit": {"type": "object", "required": ["splits"], "properties": {
            "splits": {"type": "array", "minItems": 1, "maxItems": 100000, "items": {"type": "object"}}}},
    },
}
#: At most this many nodes in the graph that runs (micro-batch copies included): a manifest that asks for more
#: (``"microbatches": 100000``) is refused instead of building it.
MAX_LOADED_NODES = 1_000_000


def _fail(path: str, file: str, what: str) -> ExportError:
    return ExportError(f"the export {path!r} is corrupt or was edited: {file}: {what}; export it again")


def _json_file(path: str, name: str) -> Any:
    try:
        with open(os.path.join(path, EXTRA_DIR, name), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else f"{type(e).__name__}: {e}"
        raise _fail(path, f"{EXTRA_DIR}/{name}", f"cannot be read ({why})") from None


def _check_manifest(path: str, manifest: Any) -> None:
    """``manifest.json`` against :data:`MANIFEST_SCHEMA` (:class:`ExportError` naming the field)."""
    import jsonschema  # lazy: not a project import (the schema library loads only to read exports)

    if isinstance(manifest, Mapping) and (manifest.get("format"), manifest.get("version")) != (EXPORT_FORMAT,
                                                                                            EXPORT_VERSION):
        raise ExportError(f"{path!r} is an export of format {manifest.get('format')!r} version "
                          f"{manifest.get('version')!r} ({EXTRA_DIR}/manifest.json); this autoplace reads "
                          f"{EXPORT_FORMAT!r} version {EXPORT_VERSION}")
    try:
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(MANIFEST_SCHEMA).iter_errors(manifest))
    except RecursionError:
        raise _fail(path, f"{EXTRA_DIR}/manifest.json", "nested too deeply") from None
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise _fail(path, f"{EXTRA_DIR}/manifest.json", f"field {where}: {error.message[:200]}")


def _check_names(path: str, manifest: Mapping[str, Any], gd: tf.compat.v1.GraphDef) -> None:
    """Every node the manifest names is in the GraphDef, of the kind it names, and every captured variable of
    the GraphDef has a saved value."""
    nodes = {n.name: n for n in gd.node}
    where = f"{EXTRA_DIR}/manifest.json"

    def node_of(tensor: str, field: str) -> Any:
        name, _, port = tensor.rpartition(":")
        node = nodes.get(name)
        if node is None:
            raise _fail(path, where, f"{field} {tensor!r} is not a tensor of graph_def.pb")
        return node, int(port)

    for i, entry in enumerate(manifest["inputs"]):
        node, port = node_of(entry["tensor"], f"inputs/{i}/tensor")
        if node.op != "Placeholder" or port != 0:
            raise _fail(path, where, f"inputs/{i}/tensor {entry['tensor']!r} is not an input placeholder")
        if tf.dtypes.as_dtype(node.attr["dtype"].type).name != entry["dtype"]:
            raise _fail(path, where, f"inputs/{i}/dtype {entry['dtype']!r} is not the graph's "
                        f"{tf.dtypes.as_dtype(node.attr['dtype'].type).name}")
        shape = tf.TensorShape(node.attr["shape"].shape)
        if not shape.is_compatible_with(tf.TensorShape(entry["shape"])) or shape.rank != len(entry["shape"]):
            raise _fail(path, where, f"inputs/{i}/shape {entry['shape']} does not fit the graph's {shape}")
    for i, tensor in enumerate(manifest["outputs"]):
        node_of(tensor, f"outputs/{i}")  # its port is checked when the function is built (LoadedModel)
    placeholders = [v["placeholder"] for v in manifest["variables"]]
    keys = {v["key"] for v in manifest["variables"]}
    if len(set(placeholders)) != len(placeholders) or len(keys) != len(placeholders):
        raise _fail(path, where, "variables name a placeholder or a saved key twice")
    captured = {n.name for n in nodes.values() if n.op == "Placeholder" and n.attr["dtype"].type == tf.resource}
    for i, name in enumerate(placeholders):
        if name not in captured:
            raise _fail(path, where, f"variables/{i}/placeholder {name!r} is not a variable of graph_def.pb")
    missing = sorted(captured - set(placeholders))
    if missing:
        raise _fail(path, where, f"the graph's variables {missing[:3]} have no saved value")
    for i, shard in enumerate(manifest.get("shards", [])):
        if shard["placeholder"] not in placeholders or shard["start"] >= shard["stop"]:
            raise _fail(path, where, f"shards/{i} {shard['placeholder']!r} is not a saved variable, or its slice "
                        f"[{shard['start']}, {shard['stop']}) is empty")
    for i, name in enumerate(manifest.get("constants", [])):
        if name not in nodes or nodes[name].op != "Const":
            raise _fail(path, where, f"constants/{i} {name!r} is not a constant of graph_def.pb")
    copies = int(manifest.get("microbatches", 1)) * int(manifest.get("replicas", 1)) * len(gd.node)
    if copies > MAX_LOADED_NODES:
        raise _fail(path, where, f"microbatches={manifest.get('microbatches')} × "
                    f"replicas={manifest.get('replicas', 1)} would copy the graph's {len(gd.node)} "
                    f"nodes into {copies:,}, more than {MAX_LOADED_NODES:,}")


def _read_values(path: str, manifest: Mapping[str, Any]) -> tuple[Any, ...]:
    """The saved value of each manifest variable (``variables/``), each of the dtype and shape the manifest says."""
    where = "variables/"
    try:
        reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
        shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError, OSError) as e:
        raise _fail(path, where, f"the checkpoint cannot be read ({type(e).__name__}: "
                    f"{str(e).splitlines()[0][:200]})") from None
    values = []
    for i, v in enumerate(manifest["variables"]):
        key = v["key"]
        if key not in shapes:
            raise _fail(path, where, f"no saved value for manifest variables/{i} ({key!r})")
        if "dtype" in v and dtypes[key].name != v["dtype"]:
            raise _fail(path, where, f"{key!r} is {dtypes[key].name}, the manifest says {v['dtype']}")
        if "shape" in v and list(shapes[key]) != list(v["shape"]):
            raise _fail(path, where, f"{key!r} has shape {shapes[key]}, the manifest says {v['shape']}")
        try:
            values.append(reader.get_tensor(key))
        except (tf.errors.OpError, ValueError, IndexError, OSError) as e:
            raise _fail(path, where, f"{key!r} cannot be read ({type(e).__name__})") from None
    return tuple(values)


def read_export(path: str) -> _Export:
    """Read and check every file of an export (the one place that reads them; :func:`load` calls it).

    Raises
    ------
    ExportError
        Not an autoplace export, or a file that is corrupt, edited or inconsistent with the others (named,
        with the field).
    """
    extra = os.path.join(path, EXTRA_DIR)
    if os.path.islink(path) or not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "saved_model.pb")):
        raise ExportError(f"{path!r} is not a SavedModel directory (no saved_model.pb); give the directory "
                          "placed.export(...) or `autoplace export` wrote")
    if not os.path.isfile(os.path.join(extra, "manifest.json")):
        raise ExportError(f"{path!r} is a SavedModel but not an autoplace export (no {EXTRA_DIR}/manifest.json); "
                          "load it with tf.saved_model.load, or export it again with this version of autoplace")
    manifest = _json_file(path, "manifest.json")
    _check_manifest(path, manifest)
    gd = tf.compat.v1.GraphDef()
    try:
        with open(os.path.join(extra, "graph_def.pb"), "rb") as f:
            gd.ParseFromString(f.read())
    except (OSError, DecodeError, RuntimeWarning) as e:
        raise _fail(path, f"{EXTRA_DIR}/graph_def.pb", f"not a GraphDef ({type(e).__name__})") from None
    _check_names(path, manifest, gd)
    try:
        plan = Plan.load(os.path.join(extra, "plan.json"))
    except PlanError as e:
        raise _fail(path, f"{EXTRA_DIR}/plan.json", str(e)) from None
    for name in ("microbatches", "replicas"):
        if getattr(plan, name) != manifest.get(name, 1):
            raise _fail(path, f"{EXTRA_DIR}/plan.json", f"{name}={getattr(plan, name)}, the manifest's "
                        f"{manifest.get(name, 1)}: the two files are not of one export")
    for device in plan.devices:
        try:
            tf.DeviceSpec.from_string(device)
        except (ValueError, TypeError):
            raise _fail(path, f"{EXTRA_DIR}/plan.json", f"devices: {device!r} is not a device name") from None
    try:
        graph, _ = load_graph(os.path.join(extra, "ops.json"))
        build_problem(graph, resolve_devices(list(plan.devices)), group_by=plan.group_by)  # every cost checked
    except AutoplaceError as e:
        raise _fail(path, f"{EXTRA_DIR}/ops.json", str(e)) from None
    return _Export(path, manifest, gd, plan, graph, _read_values(path, manifest), _read_whole(path, manifest))


def _read_whole(path: str, manifest: Mapping[str, Any]) -> WholeGraphs | None:
    """The export's :class:`WholeGraphs`, read and checked (``None`` where it keeps none)."""
    if "resplit" not in manifest:
        return None
    gd = tf.compat.v1.GraphDef()
    try:
        with open(os.path.join(path, EXTRA_DIR, "whole_graph_def.pb"), "rb") as f:
            gd.ParseFromString(f.read())
    except (OSError, DecodeError, RuntimeWarning) as e:
        raise _fail(path, f"{EXTRA_DIR}/whole_graph_def.pb", f"not a GraphDef ({type(e).__name__})") from None
    try:
        splits = tuple(split_from_dict(d) for d in manifest["resplit"]["splits"])
    except AutoplaceError as e:
        raise _fail(path, f"{EXTRA_DIR}/manifest.json", f"resplit: {e}") from None
    try:
        graph, _ = load_graph(os.path.join(path, EXTRA_DIR, "whole_ops.json"))
        split_graph(graph, splits)  # every split's op, read and placeholder are in the op graph
    except AutoplaceError as e:
        raise _fail(path, f"{EXTRA_DIR}/whole_ops.json", str(e)) from None
    split_vars = {s["placeholder"]: s["variable"] for s in manifest["shards"]}
    known = {v["placeholder"] for v in manifest["variables"] if v["placeholder"] not in split_vars}
    known |= set(split_vars.values())
    captured = {n.name for n in gd.node if n.op == "Placeholder" and n.attr["dtype"].type == tf.resource}
    if captured - known:
        raise _fail(path, f"{EXTRA_DIR}/whole_graph_def.pb", f"the graph's variables {sorted(captured - known)[:3]} "
                    "have no saved value or shards")
    return WholeGraphs(gd, graph, splits)


def _replan(export: _Export, devset: DeviceSet, time_limit_s: float | None, seed: int,
            splits: Sequence[Split] = ()) -> Plan:
    """The saved op graph (``splits`` applied) solved for ``devset`` with the saved objective and grouping; with
    ``splits``, the faster predicted of the solver's plan and the same with each split's parts side by side
    (:func:`~placer.core.splits.spread_parts`, as the splits stage scores them), the splits recorded."""
    kw = {} if time_limit_s is None else {"time_limit_s": time_limit_s}
    options = PlanOptions(objective=export.plan.objective, group_by=export.plan.group_by, memory=MODEL_MEMORY,
                          execution_order=MODEL_EXECUTION_ORDER, seed=seed, **kw)
    built = build_problem(export.op_graph, devset, group_by=options.group_by)
    plan = plan_problem(built, options)
    if not splits:
        return plan
    try:
        apart = plan_problem(built, options, given=spread_parts(plan.assignment, splits, devset.names))
        plan = min((plan, apart), key=lambda p: p.predicted_step_time_s)
    except PlanError as e:  # the parts side by side exceed a device's memory: the solver's plan
        log.info("re-sharded parts side by side do not fit (%s)", e)
    return replace(plan, splits=split_map(splits), pairs=pair_ops(splits))


def _saved_parts(export: _Export) -> int | None:
    """How many parts the export's split weights have (the most of any weight); ``None``: nothing is split."""
    counts: dict[str, int] = {}
    for s in export.manifest.get("shards", []):
        counts[s["variable"]] = counts.get(s["variable"], 0) + 1
    return max(counts.values(), default=None)


def _whole_weights(shards: Iterable[tuple[str, int, int, Any]]) -> dict[str, np.ndarray]:
    """Each split weight whole again, by its variable's placeholder: ``(variable, start, axis, value)`` of each of
    its shards, the values concatenated along the axis in the order of their starts."""
    parts: dict[str, list[tuple[int, int, Any]]] = {}
    for variable, start, axis, value in shards:
        parts.setdefault(variable, []).append((start, axis, value))
    return {name: np.concatenate([np.asarray(v) for _, _, v in sorted(pieces, key=lambda p: p[0])],
                                 axis=pieces[0][1]) for name, pieces in parts.items()}


def _resharded(export: _Export, devset: DeviceSet, time_limit_s: float | None, seed: int) -> tuple[_Export, Plan]:
    """``export`` as its whole graph (:class:`WholeGraphs`) with its split weights whole again (their shards
    concatenated: the logical weights) and the same ops split one part per device of ``devset`` (none on one
    device), and the plan solved for it on the whole op graph split so (each part's cost its share of the
    op's: :func:`~placer.core.splits.split_graph`). :class:`LoadedModel` splits the graph and shards the weights
    as the plan says."""
    whole = export.whole
    assert whole is not None
    m = export.manifest
    values = dict(zip((v["placeholder"] for v in m["variables"]), export.values))
    logical = _whole_weights((s["variable"], s["start"], s["axis"], values[s["placeholder"]]) for s in m["shards"])
    sharded = {s["placeholder"] for s in m["shards"]}
    variables = [v for v in m["variables"] if v["placeholder"] not in sharded]
    kept = [values[v["placeholder"]] for v in variables] + list(logical.values())
    splits = resharded(whole.splits, len(devset))
    op_graph = split_graph(whole.op_graph, splits) if splits else whole.op_graph
    manifest = {**m, "variables": [*variables, *({"placeholder": name} for name in logical)], "shards": []}
    view = replace(export, manifest=manifest, graph_def=whole.graph_def, op_graph=op_graph, values=tuple(kept))
    return view, _replan(view, devset, time_limit_s, seed, splits)


class LoadedModel(tf.Module):
    """A placed model rebuilt from an export (:func:`load`): call it like the model.

    Attributes
    ----------
    plan : Plan
        The placement it runs (the saved one, or a re-solved one).
    devices : tuple of str
        Its devices.
    op_devices : Mapping[str, str]
        Every node of its stored GraphDef → device.
    graph_def : GraphDef
        The graph it runs (the stored graph placed, ordered, copied per micro-batch).
    records : tuple of RewriteRecord
        What each rewrite did to the stored graph (:data:`placer.tf.rewrites.REWRITES`).
    remapped : bool
        Whether the plan was re-solved for other devices.
    order_edges : tuple of (str, str)
        The control edges that run each device's ops in the plan's order (``Plan.op_order``), added at
        load (an export stores its graph without them).
    resharded : bool
        Whether its split ops were split again, into one part per device (:func:`load`).
    """

    def __init__(self, export: _Export, plan: Plan, devices: DeviceSet, remapped: bool) -> None:
        super().__init__(name="autoplace_loaded")
        m = export.manifest
        microbatches = int(m.get("microbatches", 1))  # a re-solved plan (one copy) keeps the export's
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(export.graph_def, name="")
        captured = (*(v["placeholder"] for v in m["variables"]), *m.get("constants", []))
        devices_of = complete_assignment(graph, plan.assignment, layer_devices_of(plan.assignment))
        # a saved split graph holds its parts already; a re-sharded one (whole, no shards saved) is split here
        splits = {} if m.get("shards") else {op: k for op, k in plan.splits.items()
                                             if splittable(graph, op, dict.fromkeys(captured))}
        if splits:
            devices_of.update((n, d) for n, d in plan.assignment.items() if is_split_node(n))
        self.resharded = bool(splits)
        context = RewriteContext(graph=graph, step="predict", devices=devices_of,
                                 inputs=tuple(i["tensor"] for i in m["inputs"]), captured=captured,
                                 splits=splits, pairs=frozenset(op for op in plan.pairs if op in splits),
                                 order=plan.op_order if microbatches == 1 and plan.replicas == 1 else {},
                                 microbatches=microbatches,
                                 replicas=device_groups(plan.devices, plan.replicas) if plan.replicas > 1 else (),
                                 sends=send_rule(plan, export.op_graph) if m.get("sends") == "prompt" else None)
        gd = tf.compat.v1.GraphDef()
        gd.CopyFrom(export.graph_def)
        for node in gd.node:  # a whole graph's shapes are for reading it (``graph``), not for its split parts
            if "_output_shapes" in node.attr:
                del node.attr["_output_shapes"]
        constants = self._constants = _unfold_constants(gd, m.get("constants", []))
        self.placed_graph_def, self.graph_def, records = rewrite_graph_def(gd, context)
        self.op_devices = dict(context.devices)
        order = find_record(records, "order")
        self.order_edges = () if order is None else order.detail
        self.records = records
        placed: list[Any] = []
        in_pieces = {s["placeholder"] for s in m.get("shards", []) if s.get("pieces")}
        new_shards = shards_in(records)  # a re-sharded load's: each a slice of a logical weight, on its device
        split_weights = {s.variable for s in new_shards}
        for v, value in zip(m["variables"], export.values):
            name = v["placeholder"].split("/")[-1]
            if v["placeholder"] in split_weights:  # no whole copy on any device: its shards hold it
                placed.append(None)
                continue
            device = self.op_devices[v["placeholder"]]
            if v["placeholder"] in in_pieces:  # a shard: sent in pieces (placer.tf.remote.variable_on)
                placed.append(variable_on(device, tf.constant(value), name=name))
                continue
            with tf.device(device):
                placed.append(tf.Variable(value, name=name))
        self.placed_variables = placed
        whole = {ph: tf.constant(value) for ph, value in zip((v["placeholder"] for v in m["variables"]),
                                                              export.values) if ph in split_weights}
        self.shard_variables = tuple(variable_on(s.device, s.slice_of(whole[s.variable]),
                                                 name=f"{s.variable.split('/')[-1]}_shard_{s.start}")
                                     for s in new_shards)
        self.plan, self.devices, self.remapped = plan, tuple(plan.devices), remapped
        self._device_set = devices
        specs = [tf.TensorSpec([None if d is None else d for d in i["shape"]], i["dtype"], name=i["name"])
                 for i in m["inputs"]]
        try:
            structure = _unstructure(m["output_structure"])
            flat = tf.nest.flatten(structure)
        except (AttributeError, TypeError, KeyError):
            raise _fail(export.path, f"{EXTRA_DIR}/manifest.json", "output_structure is not a structure of "
                        "outputs") from None
        if len(flat) != len(m["outputs"]):
            raise _fail(export.path, f"{EXTRA_DIR}/manifest.json", f"output_structure holds {len(flat)} outputs, "
                        f"outputs names {len(m['outputs'])}")
        self.forward = import_function(self.graph_def, [i["tensor"] for i in m["inputs"]], m["outputs"],
                                       [(v["placeholder"], var) for v, var in zip(m["variables"], placed)
                                        if var is not None] + list(constants.items())
                                       + [(s.placeholder, var) for s, var in zip(new_shards, self.shard_variables)],
                                       structure, specs,
                                       microbatches=copies_in(records, context))
        try:  # built now, so that a graph that cannot run fails here and not at the first call
            self.forward.get_concrete_function()
        except (AutoplaceError, ValueError, TypeError, KeyError, IndexError, tf.errors.OpError) as e:
            raise _fail(export.path, f"{EXTRA_DIR}/graph_def.pb", f"the placed graph cannot be built "
                        f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from None
        self._export = export

    def __call__(self, *xs: Any) -> Any:
        """The placed outputs for the model's inputs (positional, in the model's input order)."""
        return self.forward(*xs)

    def observed_placement(self, *xs: Any) -> dict[str, str]:
        """Run ``xs`` once; node → device where each op *actually* ran (:func:`~placer.tf.emit.observed_devices`)."""
        return observed_devices(self.forward, [tf.convert_to_tensor(x) for x in xs])

    def export(self, path: str | os.PathLike) -> str:
        """Save this (re-mapped) placement as an export of its own."""
        m = self._export.manifest
        emitted = EmittedModel(self.forward, self.graph_def, self.placed_graph_def, self.records,
                               _unstructure(m["output_structure"]), "predict",
                               tuple(i["tensor"] for i in m["inputs"]), tuple(m["outputs"]),
                               tuple(v["placeholder"] for v in m["variables"]), tuple(self.placed_variables),
                               dict(self._constants),
                               tuple(tf.TensorSpec(s.shape, s.dtype, name=s.name)
                                     for s in self.forward.input_signature),
                               int(m.get("microbatches", 1)) * self.plan.replicas, self.plan.replicas,
                               shard_variables=self.shard_variables)
        return export_saved_model(emitted, path, plan=self.plan, op_graph=self._export.op_graph,
                                  devices=self._device_set, shards=self.shards, whole=self._export.whole)

    @property
    def shards(self) -> tuple[Shard, ...]:
        """The shards of split ops' weights, each on the device this load put it (empty: none split): the saved
        ones, or those a re-sharded load made (:attr:`resharded`)."""
        if self.resharded:
            return shards_in(self.records)
        return tuple(Shard(s["placeholder"], s["variable"], self.op_devices[s["placeholder"]], s["start"], s["stop"],
                           s["axis"], bool(s.get("pieces", False))) for s in self._export.manifest.get("shards", []))

    def logical_weights(self) -> dict[str, Any]:
        """Each split op's weight whole again (its saved shards concatenated), by the traced variable's
        placeholder name: what the model's own weight holds.

        Examples
        --------
        >>> import keras, numpy as np, os, tempfile, placer
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8)])
        >>> placed = placer.autoplace(m, ["/CPU:0", "/CPU:1"], batch_size=2, splits="all", split_min_bytes=0,
        ...                           time_limit_s=1)
        >>> loaded = placer.load(placed.export(os.path.join(tempfile.mkdtemp(), "saved")))
        >>> [bool(np.array_equal(w, m.layers[0].kernel.numpy())) for w in loaded.logical_weights().values()]
        [True]
        """
        values = dict(zip((v["placeholder"] for v in self._export.manifest["variables"]), self.placed_variables))
        values.update((s.placeholder, v) for s, v in zip(shards_in(self.records), self.shard_variables))
        return _whole_weights((s.variable, s.start, s.axis, values[s.placeholder].numpy()) for s in self.shards)


def load(path: str | os.PathLike, devices: Sequence[Any] | None = None, *, time_limit_s: float | None = None,
         seed: int = 0) -> LoadedModel:
    """Rebuild an exported placement from its directory alone, on its devices or on others.

    Parameters
    ----------
    path : path
        A directory written by ``placed.export(path)`` or ``autoplace export``.
    devices : sequence, optional
        Where to run it. ``None``: the devices it was planned for. Another
        list (fewer, more or renamed devices, strings or
        :class:`placer.DeviceSpec`) re-solves the saved op graph and costs
        for them, with the saved objective and grouping; the saved plan is
        reused when the list names the same devices. Where ops are split and
        the list holds another number of devices than their parts, the same
        ops are split again, one part per device (whole on one device), their
        weights re-sharded from the saved shards (each part's cost its share
        of the whole op's: not profiled again); the same number of devices
        keeps the saved parts.
    time_limit_s, seed : optional
        The re-solve's budget and seed (defaults: :class:`placer.PlanOptions`').

    Returns
    -------
    LoadedModel
        Callable like the model (positional inputs); ``.plan`` is the placement it runs.

    Raises
    ------
    ExportError
        Not an autoplace export, a corrupt one, or one whose graph cannot be re-mapped.
    DeviceError
        A device that this process does not have (TensorFlow would silently run elsewhere).

    Examples
    --------
    >>> import keras, numpy as np, os, tempfile, placer
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(3)])
    >>> placed = placer.autoplace(m, ["/CPU:0", "/CPU:1"], batch_size=2, time_limit_s=1)
    >>> path = placed.export(os.path.join(tempfile.mkdtemp(), "saved"))
    >>> one = placer.load(path, devices=["/CPU:0"])
    >>> x = np.ones((2, 4), "float32")
    >>> sorted(set(one.op_devices.values())), bool(np.array_equal(one(x).numpy(), placed(x).numpy()))
    (['/job:localhost/replica:0/task:0/device:CPU:0'], True)
    """
    export = read_export(os.fspath(path))
    if not export.manifest.get("remappable", False):
        raise ExportError(f"the export {os.fspath(path)!r} cannot be rebuilt: "
                          f"{export.manifest.get('not_remappable_because')}; load it with tf.saved_model.load on "
                          "the devices it was made for")
    available = [d.name for d in tf.config.list_logical_devices()]
    if devices is None:
        try:
            devset = resolve_devices(list(export.plan.devices), available=available)
        except DeviceError as e:
            raise DeviceError(f"{e}; this export was planned for {list(export.plan.devices)}: pass devices=[…] "
                              "to re-map it onto the devices this process has") from None
    else:
        devset = resolve_devices(devices, available=available)
    if devset.names == tuple(export.plan.devices):
        return LoadedModel(export, export.plan, devset, remapped=False)
    parts = _saved_parts(export) or 1  # an export loaded whole on one device and saved again: 1
    if export.whole is not None and parts != len(devset):
        view, plan = _resharded(export, devset, time_limit_s, seed)
        log.info("re-mapped %s from %d onto %d devices, its split ops %s", os.fspath(path), len(export.plan.devices),
                 len(devset), f"in {len(devset)} parts" if plan.splits else "whole")
        return LoadedModel(view, plan, devset, remapped=True)
    plan = _replan(export, devset, time_limit_s, seed)
    log.info("re-mapped %s from %d onto %d devices", os.fspath(path), len(export.plan.devices), len(devset))
    return LoadedModel(export, plan, devset, remapped=True)

