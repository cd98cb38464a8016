"""Stage 3a — the one problem builder: annotated graph + devices + grouping → problem (no TensorFlow).

Both paths build their problem here: :func:`placer.autoplace` from the
traced model's op graph, :func:`placer.solve` from a user's graph, in the
one attribute format of :mod:`placer.core.attrs` (``docs/graph-format.md``).

* The fine nodes are the graph's nodes in ``networkx.topological_sort``
  order; they form the problem's :class:`~placer.core.problem.Schedule`,
  so latency is always simulated node by node. Tensors are one per producer
  and key: each name of an op graph's ``tensors`` with its ``tensor_bytes``
  (each travels on its own, as in TensorFlow), else the edge's ``tensor``.
* The problem's nodes are *groups*: the connected components of "same
  group key" ∪ "same ``colocation`` key" (a networkx union-find). The group
  key comes from the registry :data:`GROUPINGS`, chosen by name: ``"op"``
  (no merging beyond colocation) or ``"layer"`` (the ``layer`` scope, so
  a Keras layer, its variables and their reads move together). Groups are
  numbered by their first node in the fine order.
* Costs become seconds per device (µs of the device's kind / its speed,
  ``inf`` where ``allowed_kinds`` excludes the kind); a group may run where
  all of its nodes may.
* Memory is checked before any search: more resident bytes than all
  devices hold, or a group larger than every device that may hold it, is
  an :class:`~placer.errors.InsufficientMemoryError` naming the largest
  holders.

Examples
--------
>>> import networkx as nx
>>> from placer.core.devices import resolve_devices
>>> g = nx.DiGraph()
>>> g.add_node("a", compute_us=10.0, layer="dense")
>>> g.add_node("b", compute_us={"CPU": 30.0, "GPU": 3.0}, memory_bytes=1024, layer="dense")
>>> g.add_node("c", compute_us=5.0, layer="head")
>>> g.add_edge("a", "b", bytes=4096)
>>> g.add_edge("b", "c", bytes=64)
>>> devs = resolve_devices(["/CPU:0", "/GPU:0"])
>>> built = build_problem(g, devs, group_by="op")
>>> built.nodes, (built.problem.compute_s * 1e6).round(3).tolist()
(('a', 'b', 'c'), [[10.0, 10.0], [30.0, 3.0], [5.0, 5.0]])
>>> by_layer = build_problem(g, devs, group_by="layer")
>>> by_layer.problem.names, by_layer.problem.schedule.group.tolist()
(('dense', 'c'), [0, 0, 1])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence

import networkx as nx
import numpy as np

from cost_models import MemoryTraits, SimOptions, SimResult, TensorEdge, simulate

from ..errors import CostError, DeviceError, GraphError, InsufficientMemoryError, PlanError
from .attrs import (
    ALIASING_OP_TYPES,
    ALLOWED_KINDS,
    BYTES,
    COLOCATION,
    COMPUTE_US,
    CONTROL,
    HELD_OP_TYPES,
    INPLACE_OP_TYPES,
    LAYER,
    MEMORY_BYTES,
    OP_TYPE,
    OUTPUT_BYTES,
    PHASE,
    PHASES,
    TENSOR,
    TENSOR_BYTES,
    TENSORS,
    VARIABLE,
)
from .devices import DeviceSet
from .order import check_order, order_edges
from .problem import PlacementProblem, Schedule, dependencies, group_tensors
from .validate import MAX_BYTES, real

#: Grouping registry: name → the group key of a node (``None``: no key; the node is its own group
#: unless colocation merges it).
GROUPINGS: dict[str, Callable[[Hashable, Mapping], Hashable | None]] = {
    "op": lambda node, attrs: None,
    "layer": lambda node, attrs: attrs.get(LAYER),
}
#: Grouping of :func:`placer.solve` (a user's graph: layers are only coarsening hints there).
DEFAULT_GROUP_BY = "op"
#: Grouping of :func:`placer.autoplace`: a Keras layer stays on one device, so TensorFlow fuses the
#: same patterns as in the original model and outputs stay bit-exact.
MODEL_GROUP_BY = "layer"


@dataclass(frozen=True)
class BuiltProblem:
    """A placement problem and what maps it back to the graph it came from.

    Attributes
    ----------
    problem : PlacementProblem
        Groups × devices; its ``schedule`` holds the fine nodes.
    nodes : tuple
        The graph's nodes in the schedule's order (fine node ``i`` is
        ``nodes[i]``, in group ``problem.schedule.group[i]``).
    devices : DeviceSet
        The devices, in the problem's column order.
    group_by : str
        The grouping used (a key of :data:`GROUPINGS`).
    layer_keys : tuple or None
        The ``layer`` of each group's first node (``None`` when the graph has
        no layers): the keys ``auto`` merges first when it coarsens.
    memory : MemoryTraits
        Per fine node: resident bytes and the op-type facts of the memory model.
    phases : tuple of str
        Per fine node, its part of a training step (the graph's ``phase``, one of
        :data:`placer.core.attrs.PHASES`; ``"forward"`` where not given): what a pipeline of
        micro-batches copies, orders and runs once (:mod:`placer.core.microbatch`).
    anchored : tuple of bool
        Per fine node: it must share a device with a node that holds resident bytes (the same ``colocation``
        key) without holding any itself: a variable's reads and updates, and a table's row gathers (the op
        graph colocates them with the table), which a data-parallel copy runs where the table lives, not on its
        own devices (:mod:`placer.core.replicas`). Empty: none.
    """

    problem: PlacementProblem
    nodes: tuple[Hashable, ...]
    devices: DeviceSet
    group_by: str
    layer_keys: tuple | None
    memory: MemoryTraits
    phases: tuple[str, ...] = ()
    anchored: tuple[bool, ...] = ()

    @property
    def schedule(self) -> Schedule:
        """The fine DAG."""
        return self.problem.schedule_view()

    def layer_positions(self) -> tuple[float, ...] | None:
        """Each group's position in the order of the layers (:func:`layer_positions`); ``None`` for a graph
        without layers."""
        if self.layer_keys is None:
            return None
        keys = self.layer_keys  # computed once per problem: the planner asks for options more than once
        return self.problem.memo("layer_positions", lambda: tuple(layer_positions(self.problem, keys).tolist()))

    def node_devices(self, group_assignment: np.ndarray) -> dict[Hashable, str]:
        """Graph node → device name, from one device index per group."""
        fine = np.asarray(group_assignment, dtype=int)[self.schedule.group]
        names = self.devices.names
        return {v: names[int(fine[i])] for i, v in enumerate(self.nodes)}

    def group_assignment(self, node_devices: Mapping[Any, str]) -> np.ndarray:
        """Device index per group from graph node → device name (the inverse of :meth:`node_devices`).

        Node keys are matched as given or by ``str`` (JSON turns keys into strings).

        Raises
        ------
        PlanError
            Nodes the mapping lacks or has in excess (named), devices that are
            not in :attr:`devices`, or a group whose nodes were given two devices.
        """
        given = {str(k): v for k, v in node_devices.items()}
        ours = {str(v) for v in self.nodes}
        missing, extra = sorted(ours - set(given)), sorted(set(given) - ours)
        if missing or extra:
            raise PlanError(
                f"the plan does not fit this graph: {len(missing)} of its {len(ours)} ops are not in the plan "
                f"(e.g. {missing[:5]}) and the plan names {len(extra)} ops the graph lacks (e.g. {extra[:5]}). "
                "A plan can only be re-applied to the model (and batch size) it was made for; solve again instead")
        index = {name: i for i, name in enumerate(self.devices.names)}
        unknown = sorted({d for d in given.values() if d not in index})
        if unknown:
            raise PlanError(f"the plan places ops on {unknown}, which are not among the devices "
                            f"{list(self.devices.names)}; pass the devices the plan was made for")
        out = np.full(self.problem.n, -1, dtype=int)
        for i, v in enumerate(self.nodes):
            g, d = int(self.schedule.group[i]), index[given[str(v)]]
            if out[g] not in (-1, d):
                raise PlanError(f"the plan splits group {self.problem.names[g]!r} (op {v!r} on "
                                f"{given[str(v)]}) although its ops must share a device")
            out[g] = d
        return out

    def activation_bytes(self) -> np.ndarray:
        """Per group: the bytes of the tensors its nodes produce (an upper bound on what they keep live)."""
        s = self.schedule
        out = np.zeros(self.problem.n)
        for t in s.tensors:
            out[s.group[t.src]] += t.nbytes
        return out

    def op_order(self, order: Sequence[Sequence[int]]) -> dict[str, tuple[str, ...]]:
        """Device name → its graph nodes (as ``str``, like a saved plan's keys) in the planned ``order`` (per
        device, fine node indices; :mod:`placer.core.order`); empty for the executor's order."""
        names = self.devices.names
        return {names[d]: tuple(str(self.nodes[v]) for v in ops) for d, ops in enumerate(order) if ops}

    def order_of(self, op_order: Mapping[str, Sequence[Any]], group_assignment: np.ndarray
                 ) -> tuple[tuple[int, ...], ...]:
        """The planned order as fine node indices per device (the inverse of :meth:`op_order`), checked
        against ``group_assignment``.

        Raises
        ------
        PlanError
            Devices or nodes the graph lacks (named), or an order that does not match the assignment
            (:func:`placer.core.order.check_order`).
        """
        if not op_order:
            return ()
        index = {str(v): i for i, v in enumerate(self.nodes)}
        devices = {name: d for d, name in enumerate(self.devices.names)}
        unknown = sorted(set(op_order) - set(devices))
        if unknown:
            raise PlanError(f"the plan's op order names devices {unknown}, not among {list(self.devices.names)}; "
                            "pass the devices the plan was made for")
        order: list[tuple[int, ...]] = [() for _ in self.devices.names]
        for name, ops in op_order.items():
            missing = [v for v in ops if str(v) not in index]
            if missing:
                raise PlanError(f"the plan's op order names {len(missing)} ops this graph lacks (e.g. {missing[:3]}); "
                                "a plan can only be re-applied to the model it was made for")
            order[devices[name]] = tuple(index[str(v)] for v in ops)
        check_order(order, np.asarray(group_assignment, dtype=int)[self.schedule.group])
        return tuple(order)

    def simulate(self, group_assignment: np.ndarray, options: SimOptions = SimOptions(),
                 order: Sequence[Sequence[int]] = ()) -> SimResult:
        """One simulated step of the fine graph under ``group_assignment`` (memory model included), each
        device running its ops in ``order`` where one is given (:mod:`placer.core.order`).

        Raises
        ------
        CostError
            Bad simulation options (e.g. time factors), or an assignment that puts a node on a
            device it may not use.
        """
        s = self.schedule
        fine = np.asarray(group_assignment, dtype=int)[s.group]
        try:
            options = self.problem.sim_options(options)
            return simulate(s.durations_s, s.tensors, fine, self.problem.occupancy_seconds,
                            control_edges=[*s.control, *order_edges(order)] if order else s.control,
                            link_latency_s=self.problem.latency, memory=self.memory, options=options)
        except ValueError as e:
            raise CostError(f"cannot simulate the plan: {e}") from e


def _fed(graph: nx.DiGraph, nodes: Sequence[Hashable]) -> tuple[int, ...]:
    """The nodes the step's caller feeds (``Schedule.fed``): placeholders that are not a variable's resource (the
    model's inputs, and tensors captured from the caller)."""
    return tuple(i for i, v in enumerate(nodes) if graph.nodes[v].get(OP_TYPE) == "Placeholder"
                 and graph.nodes[v].get(VARIABLE) is None and not graph.in_degree(v))


#: Largest per-node µs and per-edge/node bytes a graph may give (the solvers' integer models scale by them).
MAX_COMPUTE_US = 1e12
MAX_GRAPH_BYTES = float(MAX_BYTES)


def _number(value: Any, what: str, maximum: float = MAX_GRAPH_BYTES) -> float:
    return real(what, value, maximum=maximum, error=CostError)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _check_attributes(graph: nx.DiGraph) -> None:
    """The types of the attributes the builder reads (values are checked where they are read)."""
    for v, attrs in graph.nodes(data=True):
        for key in (COLOCATION, LAYER):
            if not _hashable(attrs.get(key)):
                raise GraphError(f"node {v!r}: {key} must be a string (or another hashable key), got {attrs[key]!r}")
        allowed = attrs.get(ALLOWED_KINDS)
        if allowed is not None and not isinstance(allowed, str) and not (
                isinstance(allowed, (list, tuple, set, frozenset)) and all(isinstance(a, str) for a in allowed)):
            raise GraphError(f"node {v!r}: {ALLOWED_KINDS} must be a device kind or a list of them "
                             f"(e.g. [\"CPU\", \"GPU\"]), got {allowed!r}")
        if attrs.get(OP_TYPE) is not None and not isinstance(attrs[OP_TYPE], str):
            raise GraphError(f"node {v!r}: {OP_TYPE} must be a string, got {attrs[OP_TYPE]!r}")
        if attrs.get(OUTPUT_BYTES) is not None:  # not planned with, but reported: a byte count all the same
            _number(attrs[OUTPUT_BYTES], f"node {v!r}: {OUTPUT_BYTES}")
        us = attrs.get(COMPUTE_US)
        if isinstance(us, Mapping) and not all(isinstance(kind, str) for kind in us):
            raise GraphError(f"node {v!r}: {COMPUTE_US} maps device kinds (strings) to µs, got {us!r}")
    for u, w, attrs in graph.edges(data=True):
        names, sizes, key = attrs.get(TENSORS), attrs.get(TENSOR_BYTES), attrs.get(TENSOR)
        if sizes is not None and not isinstance(sizes, (list, tuple)):
            raise CostError(f"edge {u!r} -> {w!r}: {TENSOR_BYTES} must be a list of byte counts, got {sizes!r}")
        if names is not None and not (isinstance(names, (list, tuple)) and all(map(_hashable, names))):
            raise GraphError(f"edge {u!r} -> {w!r}: {TENSORS} must be a list of tensor names, got {names!r}")
        if key is not None and not _hashable(tuple(key) if isinstance(key, list) else key):
            raise GraphError(f"edge {u!r} -> {w!r}: {TENSOR} must be a tensor name, got {key!r}")
        if not isinstance(attrs.get(CONTROL, False), bool):
            raise GraphError(f"edge {u!r} -> {w!r}: {CONTROL} must be true or false, got {attrs[CONTROL]!r}")


def _allowed(node: Hashable, attrs: Mapping, kinds: set[str]) -> frozenset[str] | None:
    allowed = attrs.get(ALLOWED_KINDS)
    if allowed is None:
        return None
    if isinstance(allowed, str):
        allowed = [allowed]
    allowed = frozenset(str(a).upper() for a in allowed)
    if not allowed & kinds:
        raise GraphError(f"node {node!r} may only run on {sorted(allowed)}, but the devices are {sorted(kinds)}")
    return allowed


def _compute_row(node: Hashable, attrs: Mapping, devset: DeviceSet, allowed: frozenset[str] | None) -> np.ndarray:
    if COMPUTE_US not in attrs:
        raise CostError(f"node {node!r} has no {COMPUTE_US!r}; give its µs per run (a number or a dict kind -> µs)")
    us = attrs[COMPUTE_US]
    row = np.empty(len(devset))
    per_kind = isinstance(us, Mapping)
    scalar = None if per_kind else _number(us, f"node {node!r} {COMPUTE_US}", MAX_COMPUTE_US)
    for d, dev in enumerate(devset.devices):
        if allowed is not None and dev.kind not in allowed:
            row[d] = np.inf
            continue
        if per_kind:
            if dev.kind not in us:
                raise DeviceError(
                    f"node {node!r} has no {COMPUTE_US}[{dev.kind!r}] for device {dev.name}; known kinds "
                    f"{sorted(us)}. Give its time on {dev.kind} or exclude the kind with {ALLOWED_KINDS!r}"
                )
            t = _number(us[dev.kind], f"node {node!r} {COMPUTE_US}[{dev.kind!r}]", MAX_COMPUTE_US)
        else:
            t = scalar
        row[d] = t * 1e-6 / dev.speed
    return row


def _edge_tensors(u: Hashable, w: Hashable, attrs: Mapping) -> list[tuple[Hashable, float]]:
    """``(key, bytes)`` of the tensors an edge carries: one per name with ``tensor_bytes`` (op graphs),
    else one keyed by ``tensor`` (or the edge's tensor names) of the edge's ``bytes``."""
    names, sizes = attrs.get(TENSORS), attrs.get(TENSOR_BYTES)
    if names is not None and sizes is not None:
        if len(names) != len(sizes):
            raise CostError(f"edge {u!r} -> {w!r} names {len(names)} tensors but gives {len(sizes)} "
                            f"{TENSOR_BYTES!r}; give one size per tensor")
        return [(name, _number(b, f"edge {u!r} -> {w!r} {TENSOR_BYTES}[{name!r}]")) for name, b in zip(names, sizes)]
    if BYTES not in attrs:
        raise CostError(f"edge {u!r} -> {w!r} has no {BYTES!r}; give the bytes it moves (or mark it {CONTROL}=True)")
    key = attrs.get(TENSOR, names)
    if isinstance(key, list):  # JSON turns tuples into lists
        key = tuple(key)
    if isinstance(key, tuple) and len(key) == 1:
        key = key[0]
    return [(key, _number(attrs[BYTES], f"edge {u!r} -> {w!r} {BYTES}"))]


def _tensors(graph: nx.DiGraph, nodes: Sequence, index: Mapping) -> tuple[list[TensorEdge], list[tuple[int, int]]]:
    """Tensors (one per producer and tensor key) and control edges, as fine node indices."""
    tensors: list[TensorEdge] = []
    control: list[tuple[int, int]] = []
    for u in nodes:
        by_key: dict[Hashable, list] = {}
        for _, w, attrs in graph.out_edges(u, data=True):
            if attrs.get(CONTROL, False):
                control.append((index[u], index[w]))
                continue
            for key, b in _edge_tensors(u, w, attrs):
                acc = by_key.setdefault(key, [0.0, []])
                acc[0] = max(acc[0], b)
                acc[1].append(index[w])
        for key in sorted(by_key, key=repr):
            b, dsts = by_key[key]
            tensors.append(TensorEdge(index[u], tuple(sorted(dsts)), b))
    return tensors, control


def _groups(graph: nx.DiGraph, nodes: Sequence, group_by: str) -> np.ndarray:
    """Group index of each fine node: components of group key ∪ colocation, numbered by first node."""
    key_of = GROUPINGS[group_by]
    uf = nx.utils.UnionFind()
    first: dict[tuple[str, Hashable], Hashable] = {}
    for v in nodes:
        attrs = graph.nodes[v]
        uf[v]
        for kind, key in (("group", key_of(v, attrs)), ("colocation", attrs.get(COLOCATION))):
            if key is not None:
                uf.union(first.setdefault((kind, key), v), v)
    number: dict[Hashable, int] = {}
    return np.array([number.setdefault(uf[v], len(number)) for v in nodes], dtype=int)


def _group_name(graph: nx.DiGraph, members: Sequence) -> str:
    if len(members) == 1:
        return str(members[0])
    layers = list(dict.fromkeys(graph.nodes[v].get(LAYER) for v in members))
    if layers != [None]:
        named = [x for x in layers if x is not None]
        return str(named[0]) if len(layers) == 1 else f"{named[0]}+{len(layers) - 1}"
    return str(graph.nodes[members[0]].get(COLOCATION, members[0]))


def check_total_memory(resident: Sequence[tuple[str, int]], capacities: Sequence[float], what: str = "the graph"
                       ) -> None:
    """Raise :class:`InsufficientMemoryError` where the ``resident`` bytes (``(name, bytes)`` of each variable or
    slot) exceed the devices' ``capacities`` (bytes, ``inf`` for unlimited) together, naming the largest and
    the shortfall.

    Examples
    --------
    >>> try:
    ...     check_total_memory([("dense/kernel", 300), ("dense/bias", 10)], [100.0, 100.0], "the model")
    ... except InsufficientMemoryError as e:
    ...     print(str(e).split(". ")[0])
    ...     print(str(e).split(". ")[1])
    the model's resident state needs 310 bytes but the 2 devices hold 200 bytes in all: 110 bytes short
    Largest: dense/kernel (300 B), dense/bias (10 B)
    """
    total, cap = float(sum(b for _, b in resident)), float(np.sum(capacities))
    if total > cap:
        largest = sorted(resident, key=lambda kv: -kv[1])[:5]
        listing = ", ".join(f"{name} ({int(b):,} B)" for name, b in largest if b > 0)
        raise InsufficientMemoryError(
            f"{what}'s resident state needs {int(total):,} bytes but the {len(capacities)} devices hold "
            f"{int(cap):,} bytes in all: {int(total - cap):,} bytes short. Largest: {listing}. "
            "Add devices or declare larger memory_bytes.")


def _check_memory(graph: nx.DiGraph, nodes: Sequence, members: list[list[int]], compute: np.ndarray,
                  memory: np.ndarray, gmem: np.ndarray, cap: np.ndarray) -> None:
    check_total_memory([(str(graph.nodes[nodes[i]].get(VARIABLE, nodes[i])), int(memory[i]))
                        for i in np.argsort(-memory, kind="stable") if memory[i] > 0], list(cap))
    for g, mm in enumerate(members):
        ok = np.isfinite(compute[g])
        if gmem[g] > cap[ok].max():
            coloc = graph.nodes[nodes[mm[0]]].get(COLOCATION)
            what = (f"node {nodes[mm[0]]!r}" if len(mm) == 1 else f"colocation group {coloc!r}" if coloc is not None
                    else f"group {_group_name(graph, [nodes[i] for i in mm])!r}")
            raise InsufficientMemoryError(
                f"{what} needs {int(gmem[g]):,} bytes, more than any device that may hold it "
                f"(largest: {int(cap[ok].max()):,}); give that device more memory, or split the group (autoplace's "
                f"splits='auto' splits a lookup's table or a dense product's weight that exceeds every device, with "
                f"its optimizer slots; in a training step only where the optimizer updates it element by element: a "
                f"table or a product by SGD, momentum or Adam, never under a global-norm clip)")


def canonical_order(graph: nx.DiGraph) -> list[Hashable]:
    """A topological order that depends only on the nodes and edges, not on the order they were added.

    By depth (longest path from a source), then by name. TensorFlow creates a
    training step's gradient ops in an order that varies from run to run (the
    tape walks identity-keyed structures), so the op graph's insertion order
    does too; planning on it gave the same model different plans (and peak
    memory predictions) in fresh processes with the same seed.

    Raises
    ------
    networkx.NetworkXUnfeasible
        If the graph has a cycle.

    Examples
    --------
    >>> g = nx.DiGraph([("b", "c"), ("a", "c"), ("c", "d")])
    >>> canonical_order(g) == canonical_order(nx.DiGraph([("c", "d"), ("a", "c"), ("b", "c")]))
    True
    >>> canonical_order(g)
    ['a', 'b', 'c', 'd']
    """
    depth: dict[Hashable, int] = {}
    for v in nx.topological_sort(graph):
        depth[v] = 1 + max((depth[u] for u in graph.predecessors(v)), default=-1)
    return list(nx.lexicographical_topological_sort(graph, key=lambda v: (depth[v], type(v).__name__, str(v))))


def build_problem(graph: nx.DiGraph, devices: DeviceSet, *, group_by: str = DEFAULT_GROUP_BY) -> BuiltProblem:
    """Validate ``graph`` and build the placement problem of its groups on ``devices``.

    Parameters
    ----------
    graph : networkx.DiGraph
        A DAG in the format of ``docs/graph-format.md``.
    devices : DeviceSet
        Target devices (see :func:`placer.core.devices.resolve_devices`).
    group_by : str
        A key of :data:`GROUPINGS`.

    Returns
    -------
    BuiltProblem

    Raises
    ------
    GraphError
        Not a DiGraph, a cycle, an unknown grouping, a node allowed on no
        device, a group whose ``allowed_kinds`` share no kind.
    CostError
        Missing, negative or non-finite ``compute_us``/``memory_bytes``/``bytes``.
    DeviceError
        A device kind a node's ``compute_us`` dict does not know.
    InsufficientMemoryError
        More memory in all than the devices hold, or a group larger than any
        device that may hold it.
    """
    if not isinstance(graph, nx.DiGraph) or graph.is_multigraph():
        raise GraphError(f"graph must be a networkx.DiGraph, got {type(graph).__name__}")
    if group_by not in GROUPINGS:
        raise GraphError(f"unknown group_by {group_by!r}; choose one of {sorted(GROUPINGS)}")
    _check_attributes(graph)
    try:
        nodes = canonical_order(graph)
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(graph)  # slow on big graphs: only on the error path
        raise GraphError(f"the graph has a cycle: {' -> '.join(repr(u) for u, _ in cycle)} -> {cycle[0][0]!r}; "
                         "placement needs a DAG") from None
    index = {v: i for i, v in enumerate(nodes)}
    kinds = {d.kind for d in devices.devices}
    m, k = len(nodes), len(devices)
    durations = np.empty((m, k))
    memory = np.zeros(m)
    for i, v in enumerate(nodes):
        attrs = graph.nodes[v]
        durations[i] = _compute_row(v, attrs, devices, _allowed(v, attrs, kinds))
        memory[i] = _number(attrs.get(MEMORY_BYTES, 0), f"node {v!r} {MEMORY_BYTES}")

    group = _groups(graph, nodes, group_by)
    n = int(group.max()) + 1 if m else 0
    members: list[list[int]] = [[] for _ in range(n)]
    for i in range(m):
        members[group[i]].append(i)
    compute = np.zeros((n, k))
    np.add.at(compute, group, durations)
    gmem = np.bincount(group, weights=memory, minlength=n)
    for g, mm in enumerate(members):
        if not np.isfinite(compute[g]).any():
            raise GraphError(f"colocation group {graph.nodes[nodes[mm[0]]].get(COLOCATION)!r} "
                             f"(nodes {[nodes[i] for i in mm[:5]]}) has no device kind allowed for all its nodes")
    bw, lat, cap = devices.arrays()
    _check_memory(graph, nodes, members, compute, memory, gmem, cap)

    tensors, control = _tensors(graph, nodes, index)
    names = [_group_name(graph, [nodes[i] for i in mm]) for mm in members]
    problem = PlacementProblem.build(
        names=names, compute_s=compute, memory_bytes=gmem, capacity_bytes=cap,
        tensors=group_tensors(tensors, group), bandwidth=bw, latency=lat, order=range(n),
        schedule=Schedule(durations, tuple(tensors), tuple(control), group, _fed(graph, nodes)),
        shared=[(h.devices, h.capacity, h.per_device) for h in devices.shared], transfer_cpu=devices.transfer_cpu(),
        ready_order=devices.ready_order, measured_links=devices.measured_links(), memory_pools=devices.memory_pools(),
        memory_pool_history=devices.memory_pool_history())
    layer_keys = None
    if any(LAYER in graph.nodes[v] for v in nodes):
        layer_keys = tuple(graph.nodes[nodes[mm[0]]].get(LAYER) for mm in members)
    op_types = [graph.nodes[v].get(OP_TYPE) for v in nodes]
    traits = MemoryTraits(resident_bytes=tuple(memory.tolist()),
                          aliasing=tuple(t in ALIASING_OP_TYPES for t in op_types),
                          inplace=tuple(t in INPLACE_OP_TYPES for t in op_types),
                          held=tuple(t in HELD_OP_TYPES for t in op_types))
    phases = tuple(graph.nodes[v].get(PHASE, PHASES[0]) for v in nodes)
    bad = next((v for v, ph in zip(nodes, phases) if ph not in PHASES), None)
    if bad is not None:
        raise GraphError(f"node {bad!r} has {PHASE}={graph.nodes[bad][PHASE]!r}; use one of {list(PHASES)} or leave "
                         "it out (forward)")
    colocation = [graph.nodes[v].get(COLOCATION) for v in nodes]
    holding = {c for c, b in zip(colocation, traits.resident_bytes) if c is not None and b > 0}
    anchored = tuple(c is not None and c in holding and b <= 0 for c, b in zip(colocation, traits.resident_bytes))
    return BuiltProblem(problem, tuple(nodes), devices, group_by, layer_keys, traits, phases,
                        anchored if any(anchored) else ())


def layer_positions(problem: PlacementProblem, keys: Sequence[Hashable]) -> np.ndarray:
    """Per group of ``problem``: a position that a layer's forward, gradient and update groups share, in the
    order of the layers, so that cutting an order sorted by it between positions splits the model between
    layers (the order Tarnawski et al.'s DP splits training graphs in).

    A layer's position (``keys``: each group's layer; a layer of two or more fine ops) is the depth of its
    deepest fine op (depth = the longest chain of ops before it): in a forward pass its last op, in a
    training step its last gradient or update op, so the layers come in forward order, or in a training
    step in the order of the backward pass (the reverse), and a layer's shallow ops (variable reads,
    reshapes of weights) do not move it. A group whose layer is one op (an optimizer's op, which has its
    own name as layer) takes the position of the neighbour it exchanges the most bytes with, heaviest
    tensors first (Prim's order); what no tensor reaches keeps its own shallowest depth.

    Examples
    --------
    A two-layer training step: forward ``f0 -> f1``, gradients ``g1 -> g0`` (layers ``a``, ``b``), and an
    update ``u0`` of layer ``a``'s weights that is a layer of its own: ``b`` comes first (the backward
    pass reaches it first), ``u0`` sits with ``a``.

    >>> from cost_models import TensorEdge
    >>> fine = [TensorEdge(0, (1,), 8.0), TensorEdge(1, (2,), 8.0), TensorEdge(2, (3,), 8.0),
    ...         TensorEdge(0, (3,), 8.0), TensorEdge(3, (4,), 4.0)]
    >>> p = PlacementProblem.build(names=["f0", "f1", "g1", "g0", "u0"], compute_s=np.ones((5, 1)),
    ...     memory_bytes=np.zeros(5), capacity_bytes=np.full(1, np.inf), tensors=fine, bandwidth=np.ones((1, 1)),
    ...     latency=np.zeros((1, 1)))
    >>> layer_positions(p, ["a", "b", "b", "a", "u0"]).tolist()
    [3.0, 2.0, 2.0, 3.0, 3.0]
    """
    import heapq

    sched = problem.schedule_view()
    preds, _ = dependencies(sched.m, sched.tensors, sched.control)
    depth = np.zeros(sched.m)
    for v in problem.schedule_order():
        if preds[v]:
            depth[v] = 1.0 + max(depth[u] for _, u in preds[v])
    group = np.asarray(sched.group, dtype=int)
    ops: dict[Hashable, int] = {}
    deepest: dict[Hashable, float] = {}
    for i in range(sched.m):
        key = keys[group[i]]
        ops[key] = ops.get(key, 0) + 1
        deepest[key] = max(deepest.get(key, -1.0), float(depth[i]))
    pos = np.array([deepest[key] if ops[key] > 1 else -1.0 for key in keys])
    into, out = dependencies(problem.n, problem.tensors)
    neighbours = [[(problem.tensors[t].nbytes, u) for t, u in into[v] + out[v]] for v in range(problem.n)]
    heap = [(-b, u, v) for v in np.flatnonzero(pos >= 0) for b, u in neighbours[v] if pos[u] < 0]
    heapq.heapify(heap)
    while heap:
        _, u, v = heapq.heappop(heap)
        if pos[u] >= 0:
            continue
        pos[u] = pos[v]
        for b, w in neighbours[u]:
            if pos[w] < 0:
                heapq.heappush(heap, (-b, w, u))
    shallowest = np.full(problem.n, np.inf)
    np.minimum.at(shallowest, group, depth)
    rest = pos < 0
    pos[rest] = np.where(np.isfinite(shallowest[rest]), shallowest[rest], 0.0)
    return pos
