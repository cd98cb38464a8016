"""Graph files: a cost-annotated ``networkx.DiGraph`` and its devices as JSON (no TensorFlow).

The format (``docs/graph-format.md``) is networkx's node-link data with the
attributes of :mod:`placer.core.attrs`, plus an optional device list and
links. :func:`placer.solve` places such a graph; a placed model's op graph
is saved in it by ``PlacedModel.save_graph``.

Examples
--------
>>> import networkx as nx
>>> import tempfile, os
>>> g = nx.DiGraph()
>>> g.add_node("a", compute_us=10.0)
>>> g.add_node("b", compute_us={"CPU": 30.0, "GPU": 3.0}, memory_bytes=1024, allowed_kinds={"CPU", "GPU"})
>>> g.add_edge("a", "b", bytes=4096)
>>> path = os.path.join(tempfile.mkdtemp(), "g.json")
>>> save_graph(path, g, ["/CPU:0", "/GPU:0"])
>>> g2, devs = load_graph(path)
>>> g2.nodes["b"]["allowed_kinds"], devs.names[1]
(['CPU', 'GPU'], '/job:localhost/replica:0/task:0/device:GPU:0')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import networkx as nx

from cost_models.comm import Link

from ..errors import DeviceError, GraphError
from .attrs import ALLOWED_KINDS
from .devices import DeviceSet, DeviceSpec, SharedProcessor, canonical_device_name, resolve_devices
from .outputs import write_text
from .validate import real

#: Identifies the JSON file format written by :func:`save_graph`.
FORMAT = "autoplace-graph"
FORMAT_VERSION = 1


def as_device_set(devices: Sequence[Any] | DeviceSet) -> DeviceSet:
    """``devices`` if it is a :class:`DeviceSet` already, else :func:`resolve_devices` of it (not checked
    against this process: graphs are planned offline)."""
    return devices if isinstance(devices, DeviceSet) else resolve_devices(devices)


def devices_to_json(devset: DeviceSet) -> dict:
    """``{"devices": [...], "links": [...]}`` describing ``devset``."""
    devs = []
    for d in devset.devices:
        e: dict[str, Any] = {"name": d.name}
        if d.memory_bytes is not None:
            e["memory_bytes"] = int(d.memory_bytes)
        if d.speed != 1.0:
            e["speed"] = d.speed
        if d.memory_pool_bytes is not None:
            e["memory_pool_bytes"] = int(d.memory_pool_bytes)
        devs.append(e)
    links = [{"src": devset.names[i], "dst": devset.names[j], "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
              "latency_s": link.latency_s, **({"measured": [list(p) for p in link.points]} if link.points else {})}
             for (i, j), link in sorted(devset.links.items())]
    out: dict[str, Any] = {"devices": devs, "links": links}
    if devset.shared:
        out["shared"] = [{"devices": [devset.names[i] for i in sp.devices], "capacity": sp.capacity,
                          "source": sp.source, **({} if sp.pooled else {"pooled": False})} for sp in devset.shared]
    if devset.ready_order is not None:
        out["ready_order"] = devset.ready_order
    return out


def devices_from_json(data: Mapping) -> DeviceSet:
    """Inverse of :func:`devices_to_json`; links not listed get the defaults.

    Raises
    ------
    DeviceError
        A malformed entry or a link naming a device that is not listed.
    """
    entries, link_entries = data.get("devices"), data.get("links", [])
    if not isinstance(entries, list) or not isinstance(link_entries, list):
        raise DeviceError("'devices' and 'links' must be lists; see docs/graph-format.md")
    if not all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries):
        raise DeviceError("each device needs at least a string 'name'; see docs/graph-format.md")
    specs = [DeviceSpec(e["name"], memory_bytes=e.get("memory_bytes"), speed=e.get("speed", 1.0),
                        memory_pool_bytes=e.get("memory_pool_bytes")) for e in entries]
    devset = resolve_devices(specs)
    links = dict(devset.links)
    pos = {n: i for i, n in enumerate(devset.names)}
    for e in link_entries:
        if not isinstance(e, dict) or not isinstance(e.get("src"), str) or not isinstance(e.get("dst"), str):
            raise DeviceError(f"link {e!r} must be an object with string 'src' and 'dst'; see docs/graph-format.md")
        try:
            i, j = pos[canonical_device_name(e["src"])], pos[canonical_device_name(e["dst"])]
        except KeyError:
            raise DeviceError(f"link {e!r} names a device that is not in the device list {list(devset.names)}") from None
        bw = real(f"link {e['src']} -> {e['dst']} bandwidth_bytes_per_s", e.get("bandwidth_bytes_per_s"),
                  strict=True, error=DeviceError)
        lat = real(f"link {e['src']} -> {e['dst']} latency_s", e.get("latency_s", 0.0), error=DeviceError)
        links[(i, j)] = Link(float(bw), float(lat), points=_measured_points(e))
    shared = []
    share_entries = data.get("shared", [])
    if not isinstance(share_entries, list):
        raise DeviceError("'shared' must be a list; see docs/graph-format.md")
    for e in share_entries:
        if not isinstance(e, dict) or not isinstance(e.get("devices"), list) \
                or not all(isinstance(n, str) for n in e["devices"]):
            raise DeviceError(f"shared entry {e!r} must be an object with a list of device names 'devices'; "
                              "see docs/graph-format.md")
        try:
            idx = tuple(pos[canonical_device_name(n)] for n in e["devices"])
        except KeyError:
            raise DeviceError(f"shared entry {e!r} names a device that is not in the device list "
                              f"{list(devset.names)}") from None
        shared.append(SharedProcessor(idx, e.get("capacity"), e.get("source", "given"), e.get("pooled", True)))
    return DeviceSet(devset.devices, links, tuple(shared), ready_order=data.get("ready_order"))


def _measured_points(e: Mapping) -> tuple[tuple[float, float], ...]:
    """A link entry's ``measured`` ``[[bytes, seconds], ...]`` (sizes increasing, times non-decreasing)."""
    raw = e.get("measured", [])
    where = f"link {e['src']} -> {e['dst']} measured"
    if not isinstance(raw, list) or not all(isinstance(p, list) and len(p) == 2 for p in raw):
        raise DeviceError(f"{where} must be a list of [bytes, seconds] pairs; see docs/graph-format.md")
    points = tuple((real(f"{where} bytes", b, strict=True, error=DeviceError),
                    real(f"{where} seconds", t, error=DeviceError)) for b, t in raw)
    if any(b1 <= b0 or t1 < t0 for (b0, t0), (b1, t1) in zip(points, points[1:])):
        raise DeviceError(f"{where} must list increasing sizes with non-decreasing times; see docs/graph-format.md")
    return tuple((float(b), float(t)) for b, t in points)


#: The options a plan of the graph was made with (a graph file's ``plan_options``, ``graph.graph[...]``).
PLAN_OPTIONS_KEY = "plan_options"


def save_graph(path: str | Path, graph: nx.DiGraph, devices: Sequence[Any] | DeviceSet | None = None, *,
               plan_options: Mapping[str, Any] | None = None) -> None:
    """Write ``graph`` (and optionally its devices) as an autoplace graph JSON file.

    The graph part is networkx's node-link format (``nx.node_link_data``);
    ``allowed_kinds`` sets are written as sorted lists. ``plan_options``
    (the options a plan of this graph was made with: ``placed.save_graph``
    writes ``autoplace``'s) go to the file's ``plan_options``; :func:`load_graph`
    puts them in ``graph.graph["plan_options"]``, where :func:`placer.solve`
    takes the options it is not given.

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
    g.graph.pop(PLAN_OPTIONS_KEY, None)  # written once, at the top
    doc: dict[str, Any] = {"format": FORMAT, "version": FORMAT_VERSION, "graph": nx.node_link_data(g, edges="edges")}
    options = plan_options if plan_options is not None else graph.graph.get(PLAN_OPTIONS_KEY)
    if options is not None:
        doc[PLAN_OPTIONS_KEY] = {k: list(v) if isinstance(v, tuple) else v for k, v in dict(options).items()}
    if devices is not None:
        doc.update(devices_to_json(as_device_set(devices)))
    write_text(path, json.dumps(doc, indent=1))


def _is_id(x: Any) -> bool:
    return isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool))


def _check_node_link(path: Any, data: Any) -> None:
    """The shape networkx's ``node_link_graph`` needs, checked first so that a bad file is a GraphError."""
    where = f"{path}: the 'graph' entry"
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or not isinstance(
            data.get("edges", []), list):
        raise GraphError(f"{where} must be an object with a list of 'nodes' and a list of 'edges' "
                         "(networkx node-link data; docs/graph-format.md)")
    ids = set()
    for node in data["nodes"]:
        if not isinstance(node, dict) or not _is_id(node.get("id")):
            raise GraphError(f"{where}: node {node!r} must be an object with a string or integer 'id'")
        if node["id"] in ids:
            raise GraphError(f"{where}: node id {node['id']!r} appears twice")
        ids.add(node["id"])
    for edge in data.get("edges", []):
        if not isinstance(edge, dict) or not all(_is_id(edge.get(e)) and edge[e] in ids for e in ("source", "target")):
            raise GraphError(f"{where}: edge {edge!r} must be an object whose 'source' and 'target' are node ids")


def load_graph(path: str | Path) -> tuple[nx.DiGraph, DeviceSet | None]:
    """Read a file written by :func:`save_graph`: the graph and its devices (None if absent).

    Raises
    ------
    GraphError
        Not an autoplace graph file, or a newer format version.
    """
    try:
        doc = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else e
        raise GraphError(f"cannot read graph file {path}: {why}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise GraphError(f"{path} is not an autoplace graph file (expected a JSON object with "
                         f"\"format\": \"{FORMAT}\")")
    version = doc.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise GraphError(f"{path}: \"version\" must be a non-negative integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise GraphError(f"{path} has format version {version}; this autoplace reads up to {FORMAT_VERSION}")
    _check_node_link(path, doc.get("graph"))
    try:
        graph = nx.node_link_graph(doc["graph"], directed=True, multigraph=False, edges="edges")
    except (KeyError, TypeError, ValueError, nx.NetworkXError) as e:
        raise GraphError(f"{path}: the 'graph' entry is not networkx node-link data ({e!r})") from None
    devices = devices_from_json(doc) if "devices" in doc else None
    options = doc.get(PLAN_OPTIONS_KEY)
    if options is not None:
        if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
            raise GraphError(f"{path}: {PLAN_OPTIONS_KEY!r} must be an object of plan options (docs/graph-format.md)")
        graph.graph[PLAN_OPTIONS_KEY] = options
    return graph, devices
