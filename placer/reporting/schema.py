"""The report's JSON schema (``report.schema.json``, version :data:`REPORT_VERSION`) and readers.

Examples
--------
>>> from placer.core.plan import Plan
>>> p = Plan(devices=("/CPU:0", "/CPU:1"), assignment={"a": "/CPU:0", "b": "/CPU:1"}, objective="latency",
...          unit="s", value=0.003, lower_bound=0.002, gap=1 / 3, solver="auto/etf", status="heuristic",
...          predicted_device_load_s=(0.002, 0.001), device_memory_bytes=(10.0, 20.0))
>>> data = report_from_plan(p.to_dict())
>>> validate_report(data)["source"], [d["ops"] for d in data["devices"]]
('plan', [1, 1])
>>> validate_report({**data, "report_version": 99})
Traceback (most recent call last):
...
placer.errors.ReportError: report version 99: this autoplace reads version 4 (re-create the report with it)
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from ..core.outputs import json_ready
from ..core.plan import Plan
from ..errors import PlanError, ReportError

#: Identifies a report file, and the version of its layout this code writes and reads.
REPORT_FORMAT, REPORT_VERSION = "autoplace-report", 4
SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON schema of a report (draft 2020-12)."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def validate_report(data: Any) -> Any:
    """``data`` if it is a report of this version that matches the schema.

    Raises
    ------
    ReportError
        Not a report, another version, or the first schema violation (its path in the data).
    """
    import jsonschema

    if not isinstance(data, Mapping) or data.get("format") != REPORT_FORMAT:
        raise ReportError(f"not an autoplace report (expected \"format\": \"{REPORT_FORMAT}\"); give a report written "
                          "by placed.report(...) / autoplace plan --report, or a plan JSON")
    if data.get("report_version") != REPORT_VERSION:
        raise ReportError(f"report version {data.get('report_version')!r}: this autoplace reads version "
                          f"{REPORT_VERSION} (re-create the report with it)")
    try:
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema()).iter_errors(data))
    except RecursionError:
        raise ReportError("the report is nested too deeply to be a report; give a report written by "
                          "placed.report(...) / autoplace plan --report") from None
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ReportError(f"the report does not match its schema at {where}: {error.message[:300]}")
    return data


def report_from_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """A report of a plan JSON alone (``source: "plan"``): devices, loads, memory, baselines, log; no op graph.

    Raises
    ------
    PlanError
        ``plan`` is not a plan (:meth:`placer.core.plan.Plan.from_dict`).
    """
    p = Plan.from_dict(plan)
    counts = Counter(p.assignment.values())
    peaks = list(p.predicted_peak_memory_bytes) or [None] * len(p.devices)
    loads = list(p.predicted_device_load_s) or [None] * len(p.devices)
    memory = list(p.device_memory_bytes) or [None] * len(p.devices)
    summary = {k: v for k, v in p.to_dict().items() if k not in ("assignment", "op_order", "format", "version")}
    return json_ready({
        "format": REPORT_FORMAT, "report_version": REPORT_VERSION, "source": "plan",
        "plan": summary,
        "devices": [{"name": d, "ops": counts.get(d, 0), "predicted_load_s": loads[i], "resident_bytes": memory[i],
                     "predicted_peak_memory_bytes": peaks[i]} for i, d in enumerate(p.devices)],
        "measurements": [],
    })


def load_report(path: str | os.PathLike) -> dict[str, Any]:
    """The report in ``path``: a report JSON (validated), or a plan JSON turned into one (:func:`report_from_plan`).

    Raises
    ------
    ReportError
        The file cannot be read, is not JSON, or is neither a report nor a plan.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else e
        raise ReportError(f"cannot read report file {os.fspath(path)!r}: {why}") from None
    if isinstance(data, Mapping) and data.get("format") == "autoplace-plan":
        try:
            return report_from_plan(data)
        except PlanError as e:
            raise ReportError(f"{os.fspath(path)!r}: {e}") from None
    return validate_report(data)
