"""The simulated step as Chrome trace events (opens in Perfetto, ``chrome://tracing`` or TensorBoard's viewer).

One process ("autoplace: predicted step"), one thread per device, one
complete event (``"ph": "X"``) per op, times in microseconds. Format:
the Trace Event Format's JSON object form (``{"traceEvents": [...]}``).

Examples
--------
>>> data = {"plan": {"devices": ["/CPU:0", "/CPU:1"]}, "simulation": {"timeline": [
...     {"op": "a", "device": "/CPU:0", "start_s": 0.0, "end_s": 0.001},
...     {"op": "b", "device": "/CPU:1", "start_s": 0.001, "end_s": 0.003}]}}
>>> events = chrome_trace(data)["traceEvents"]
>>> [(e["name"], e["tid"], e["ts"], e["dur"]) for e in events if e["ph"] == "X"]
[('a', 0, 0.0, 1000.0), ('b', 1, 1000.0, 2000.0)]
"""

from __future__ import annotations

from typing import Any, Mapping

#: The trace's process id (one process: the predicted step).
PID = 1


def chrome_trace(data: Mapping[str, Any]) -> dict[str, Any]:
    """Trace events of the report's simulated timeline (empty when the report has none)."""
    devices = list(data["plan"]["devices"])
    tid = {d: i for i, d in enumerate(devices)}
    events: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0,
                                     "args": {"name": "autoplace: predicted step"}}]
    events += [{"name": "thread_name", "ph": "M", "pid": PID, "tid": i, "args": {"name": d}}
               for d, i in tid.items()]
    events += [{"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": i, "args": {"sort_index": i}}
               for i in tid.values()]
    for item in (data.get("simulation") or {}).get("timeline", []):
        start, end = item["start_s"] or 0.0, item["end_s"] or 0.0
        events.append({"name": item["op"], "cat": "op", "ph": "X", "pid": PID, "tid": tid[item["device"]],
                       "ts": start * 1e6, "dur": max(end - start, 0.0) * 1e6})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"what": "simulated (predicted) step of an autoplace plan", "objective":
                          data["plan"].get("objective")}}
