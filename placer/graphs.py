"""A user's ``networkx.DiGraph`` as a placement problem, and its JSON file (no TensorFlow).

Graph format (also in ``docs/graph-format.md``):

Nodes
    ``compute_us`` (required): µs per run, a number (for every device kind;
    divided by a device's ``speed``) or a dict device kind → µs.
    ``memory_bytes`` (default 0): resident bytes.
    ``colocation`` (optional): hashable key; nodes sharing it share a device.
    ``allowed_kinds`` (optional): device kinds the node may run on.
    ``layer`` (optional): a scope name, merged first when coarsening.
Edges
    ``bytes`` (required unless ``control`` is true): bytes moved when the
    edge crosses devices. ``tensor`` (optional): out-edges of one node with
    the same ``tensor`` key carry one tensor, sent once per receiving
    device; by default all out-edges of a node carry its one output (so a
    node's size is the largest of its out-edges' ``bytes``).
    ``control`` (optional, default false): an ordering-only dependency.
    ``tensors`` (op graphs): a tuple of tensor names; an edge naming one
    tensor is keyed by it, as if it had ``tensor`` set.

Examples
--------
>>> import networkx as nx
>>> g = nx.DiGraph()
>>> g.add_node("a", compute_us=10.0)
>>> g.add_node("b", compute_us={"CPU": 30.0, "GPU": 3.0}, memory_bytes=1024)
>>> g.add_edge("a", "b", bytes=4096)
>>> problem, nodes = problem_from_graph(g, resolve_devices(["/CPU:0", "/GPU:0"]))
>>> nodes, (problem.compute_s * 1e6).round(3).tolist()
(['a', 'b'], [[10.0, 10.0], [30.0, 3.0]])
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Any, Hashable, Mapping, Sequence

import networkx as nx
import numpy as np

from cost_models import TensorEdge
from cost_models.comm import Link

from .attrs import (
    ALLOWED_KINDS,
    BYTES,
    COLOCATION,
    COMPUTE_US,
    CONTROL,
    LAYER,
    MEMORY_BYTES,
    TENSOR,
    TENSORS,
)
from .devices import DeviceSet, DeviceSpec, canonical_device_name, resolve_devices
from .errors import CostError, DeviceError, GraphError, InsufficientMemoryError
from .problem import PlacementProblem, Schedule, group_tensors

#: Identifies the JSON file format written by :func:`save_graph`.
FORMAT = "autoplace-graph"
FORMAT_VERSION = 1


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise CostError(f"{what} must be a finite non-negative number, got {value!r}")
    return float(value)


def _devset(devices: Any) -> DeviceSet:
    return devices if isinstance(devices, DeviceSet) else resolve_devices(devices)


def _compute_row(node: Hashable, attrs: Mapping, devset: DeviceSet, allowed: frozenset[str] | None) -> np.ndarray:
    if COMPUTE_US not in attrs:
        raise CostError(f"node {node!r} has no {COMPUTE_US!r}; give its µs per run (a number or a dict kind -> µs)")
    us = attrs[COMPUTE_US]
    row = np.empty(len(devset))
    for d, dev in enumerate(devset.devices):
        if allowed is not None and dev.kind not in allowed:
            row[d] = np.inf
            continue
        if isinstance(us, Mapping):
            if dev.kind not in us:
                raise DeviceError(
                    f"node {node!r} has no {COMPUTE_US}[{dev.kind!r}] for device {dev.name}; known kinds "
                    f"{sorted(us)}. Give its time on {dev.kind} or exclude the kind with {ALLOWED_KINDS!r}"
                )
            t = _number(us[dev.kind], f"node {node!r} {COMPUTE_US}[{dev.kind!r}]")
        else:
            t = _number(us, f"node {node!r} {COMPUTE_US}")
        row[d] = t * 1e-6 / dev.speed
    return row


def problem_from_graph(graph: nx.DiGraph, devices: Sequence[Any] | DeviceSet) -> tuple[PlacementProblem, list]:
    """Validate ``graph`` and build the placement problem of its colocation groups.

    The problem's nodes are colocation groups (a node without ``colocation``
    is its own group); its :class:`~placer.problem.Schedule` is the graph
    itself, so latency is simulated op by op.

    Returns
    -------
    (PlacementProblem, list)
        The problem and the graph's nodes in the order of the schedule.

    Raises
    ------
    GraphError
        Not a DiGraph, a cycle, a node allowed on no device, a colocation
        group whose ``allowed_kinds`` share no kind.
    CostError
        Missing, negative or non-finite ``compute_us``/``memory_bytes``/``bytes``.
    DeviceError
        A device kind the node's ``compute_us`` dict does not know.
    InsufficientMemoryError
        A colocation group larger than any device that may hold it, or more
        memory in all than all devices hold.
    """
    if not isinstance(graph, nx.DiGraph) or graph.is_multigraph():
        raise GraphError(f"graph must be a networkx.DiGraph, got {type(graph).__name__}")
    devset = _devset(devices)
    try:
        nodes = list(nx.topological_sort(graph))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(graph)  # slow on big graphs: only on the error path
        raise GraphError(f"the graph has a cycle: {' -> '.join(repr(u) for u, _ in cycle)} -> {cycle[0][0]!r}; "
                         "placement needs a DAG") from None
    index = {v: i for i, v in enumerate(nodes)}
    kinds = {d.kind for d in devset.devices}
    m, k = len(nodes), len(devset)

    durations = np.empty((m, k))
    memory = np.zeros(m)
    for i, v in enumerate(nodes):
        attrs = graph.nodes[v]
        allowed = attrs.get(ALLOWED_KINDS)
        if allowed is not None:
            if isinstance(allowed, str):
                allowed = [allowed]
            allowed = frozenset(str(a).upper() for a in allowed)
            if not allowed & kinds:
                raise GraphError(f"node {v!r} may only run on {sorted(allowed)}, but the devices are {sorted(kinds)}")
        durations[i] = _compute_row(v, attrs, devset, allowed)
        memory[i] = _number(attrs.get(MEMORY_BYTES, 0), f"node {v!r} {MEMORY_BYTES}")

    # Colocation groups are the problem's nodes.
    group = np.empty(m, dtype=int)
    first: dict[Hashable, int] = {}
    for i, v in enumerate(nodes):
        key = graph.nodes[v].get(COLOCATION)
        group[i] = len(first) if key is None else first.setdefault(("coloc", key), len(first))
        if key is None:
            first[("node", i)] = group[i]
    n = len(first)
    compute = np.zeros((n, k))
    np.add.at(compute, group, durations)
    gmem = np.bincount(group, weights=memory, minlength=n)
    members: list[list[int]] = [[] for _ in range(n)]
    for i in range(m):
        members[group[i]].append(i)
    bw, lat, cap = devset.arrays()
    for g in range(n):
        if not np.isfinite(compute[g]).any():
            raise GraphError(f"colocation group {graph.nodes[nodes[members[g][0]]].get(COLOCATION)!r} "
                             f"(nodes {[nodes[i] for i in members[g][:5]]}) has no device kind allowed for all its nodes")
        ok = np.isfinite(compute[g])
        if gmem[g] > cap[ok].max():
            what = (f"colocation group {graph.nodes[nodes[members[g][0]]].get(COLOCATION)!r}" if len(members[g]) > 1
                    else f"node {nodes[members[g][0]]!r}")
            raise InsufficientMemoryError(
                f"{what} needs {gmem[g]:.0f} bytes, more than any device that may hold it "
                f"(largest: {cap[ok].max():.0f}); give that device more memory or split the group")
    if gmem.sum() > cap.sum():
        raise InsufficientMemoryError(f"the graph needs {gmem.sum():.0f} bytes in all but the devices hold "
                                      f"{cap.sum():.0f}; add devices or memory")

    tensors, control = _tensors(graph, nodes, index)
    names = [str(nodes[mm[0]]) if len(mm) == 1 else f"{graph.nodes[nodes[mm[0]]].get(COLOCATION)}" for mm in members]
    problem = PlacementProblem.build(
        names, compute, gmem, cap, group_tensors(tensors, group), bw, lat,
        order=sorted(range(n), key=lambda g: members[g][0]),
        schedule=Schedule(durations, tuple(tensors), tuple(control), group))
    return problem, nodes


def layer_keys(graph: nx.DiGraph, nodes: Sequence[Hashable], problem: PlacementProblem) -> list | None:
    """The ``layer`` of each problem node (of its first graph node), or None when the graph has none."""
    if not any(LAYER in graph.nodes[v] for v in nodes):
        return None
    keys: list = [None] * problem.n
    for i in reversed(range(len(nodes))):
        keys[problem.schedule_view().group[i]] = graph.nodes[nodes[i]].get(LAYER)
    return keys


def _tensors(graph: nx.DiGraph, nodes: list, index: Mapping) -> tuple[list[TensorEdge], list[tuple[int, int]]]:
    tensors: list[TensorEdge] = []
    control: list[tuple[int, int]] = []
    for u in nodes:
        by_key: dict[Hashable, list] = {}
        for _, w, attrs in graph.out_edges(u, data=True):
            if attrs.get(CONTROL, False):
                control.append((index[u], index[w]))
                continue
            if BYTES not in attrs:
                raise CostError(f"edge {u!r} -> {w!r} has no {BYTES!r}; give the bytes it moves "
                                f"(or mark it {CONTROL}=True)")
            b = _number(attrs[BYTES], f"edge {u!r} -> {w!r} {BYTES}")
            key = attrs.get(TENSOR, attrs.get(TENSORS))  # op graphs name their tensors
            if isinstance(key, list):  # JSON turns tuples into lists
                key = tuple(key)
            if isinstance(key, tuple) and len(key) == 1:
                key = key[0]
            acc = by_key.setdefault(key, [0.0, []])
            acc[0] = max(acc[0], b)
            acc[1].append(index[w])
        for key in sorted(by_key, key=repr):
            b, dsts = by_key[key]
            tensors.append(TensorEdge(index[u], tuple(sorted(dsts)), b))
    return tensors, control


def devices_to_json(devset: DeviceSet) -> dict:
    """``{"devices": [...], "links": [...]}`` describing ``devset``."""
    devs = []
    for d in devset.devices:
        e: dict[str, Any] = {"name": d.name}
        if d.memory_bytes is not None:
            e["memory_bytes"] = int(d.memory_bytes)
        if d.speed != 1.0:
            e["speed"] = d.speed
        devs.append(e)
    links = [{"src": devset.names[i], "dst": devset.names[j], "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
              "latency_s": link.latency_s} for (i, j), link in sorted(devset.links.items())]
    return {"devices": devs, "links": links}


def devices_from_json(data: Mapping) -> DeviceSet:
    """Inverse of :func:`devices_to_json`; links not listed get the defaults.

    Raises
    ------
    DeviceError
        A malformed entry or a link naming a device that is not listed.
    """
    try:
        specs = [DeviceSpec(e["name"], memory_bytes=e.get("memory_bytes"), speed=e.get("speed", 1.0))
                 for e in data["devices"]]
    except (KeyError, TypeError) as e:
        raise DeviceError(f"each device needs at least a 'name' ({e!r}); see docs/graph-format.md") from None
    devset = resolve_devices(specs)
    links = dict(devset.links)
    pos = {n: i for i, n in enumerate(devset.names)}
    for e in data.get("links", []):
        try:
            i, j = pos[canonical_device_name(e["src"])], pos[canonical_device_name(e["dst"])]
        except KeyError:
            raise DeviceError(f"link {e!r} names a device that is not in the device list {list(devset.names)}") from None
        bw, lat = e.get("bandwidth_bytes_per_s"), e.get("latency_s", 0.0)
        if not isinstance(bw, (int, float)) or bw <= 0 or not isinstance(lat, (int, float)) or lat < 0:
            raise DeviceError(f"link {e!r} needs a positive bandwidth_bytes_per_s and a non-negative latency_s")
        links[(i, j)] = Link(float(bw), float(lat))
    return DeviceSet(devset.devices, links)


def save_graph(path: str | Path, graph: nx.DiGraph, devices: Sequence[Any] | DeviceSet | None = None) -> None:
    """Write ``graph`` (and optionally its devices) as an autoplace graph JSON file.

    The graph part is networkx's node-link format (``nx.node_link_data``);
    ``allowed_kinds`` sets are written as sorted lists.

    Examples
    --------
    >>> import tempfile, os
    >>> g = nx.DiGraph()
    >>> g.add_edge("a", "b", bytes=8)
    >>> nx.set_node_attributes(g, 1.0, "compute_us")
    >>> path = os.path.join(tempfile.mkdtemp(), "g.json")
    >>> save_graph(path, g, ["/CPU:0", "/CPU:1"])
    >>> g2, devs = load_graph(path)
    >>> sorted(g2.edges(data=True)), devs.names[1]
    ([('a', 'b', {'bytes': 8})], '/job:localhost/replica:0/task:0/device:CPU:1')
    """
    g = graph.copy()
    for _, attrs in g.nodes(data=True):
        if isinstance(attrs.get(ALLOWED_KINDS), (set, frozenset)):
            attrs[ALLOWED_KINDS] = sorted(attrs[ALLOWED_KINDS])
    doc: dict[str, Any] = {"format": FORMAT, "version": FORMAT_VERSION, "graph": nx.node_link_data(g, edges="edges")}
    if devices is not None:
        doc.update(devices_to_json(_devset(devices)))
    Path(path).write_text(json.dumps(doc, indent=1))


def load_graph(path: str | Path) -> tuple[nx.DiGraph, DeviceSet | None]:
    """Read a file written by :func:`save_graph`: the graph and its devices (None if absent).

    Raises
    ------
    GraphError
        Not an autoplace graph file, or a newer format version.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GraphError(f"cannot read graph file {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise GraphError(f"{path} is not an autoplace graph file (expected \"format\": \"{FORMAT}\")")
    if doc.get("version", 0) > FORMAT_VERSION:
        raise GraphError(f"{path} has format version {doc['version']}; this autoplace reads up to {FORMAT_VERSION}")
    try:
        graph = nx.node_link_graph(doc["graph"], directed=True, multigraph=False, edges="edges")
    except (KeyError, TypeError, nx.NetworkXError) as e:
        raise GraphError(f"{path}: the 'graph' entry is not networkx node-link data ({e!r})") from None
    devices = devices_from_json(doc) if "devices" in doc else None
    return graph, devices
