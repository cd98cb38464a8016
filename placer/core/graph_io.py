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
from .devices import DeviceSet, DeviceSpec, canonical_device_name, resolve_devices

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
        doc.update(devices_to_json(as_device_set(devices)))
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
