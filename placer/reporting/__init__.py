"""Stage 5 without TensorFlow: the report's JSON schema, its HTML page and its trace-event timeline.

A placement report is JSON data (:mod:`placer.reporting.schema`, documented
in ``docs/report-format.md``); everything here works from that data alone,
so ``autoplace report x.json --out x.html`` re-renders a report offline, on
a machine without TensorFlow. :func:`write_report` picks the format by the
path's suffix:

==============  ================================================================
suffix          what is written
==============  ================================================================
``.json``       the report data (validated against the schema first)
``.html``       one self-contained page: charts as inline SVG, no network needed
``.trace.json`` the simulated step as Chrome trace events (Perfetto, TensorBoard)
==============  ================================================================
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from ..core.outputs import REPORT_SUFFIXES, check_output, write_text
from .schema import REPORT_FORMAT, REPORT_VERSION, load_report, report_from_plan, validate_report

__all__ = ["REPORT_FORMAT", "REPORT_VERSION", "load_report", "report_from_plan", "validate_report", "write_report"]


def write_report(data: Mapping[str, Any], path: str | os.PathLike) -> str:
    """Write report ``data`` to ``path`` in the format its suffix names (see the module's table); returns the path.

    Raises
    ------
    OutputError
        An unknown suffix, or a path that cannot be written (an existing file there is left as it was).
    ReportError
        ``data`` does not match the report schema.
    """
    check_output(path, suffixes=REPORT_SUFFIXES)
    validate_report(data)
    name = os.fspath(path)
    if name.endswith(".trace.json"):
        from .trace import chrome_trace  # lazy: the trace format is read only for .trace.json

        text = json.dumps(chrome_trace(data))
    elif name.endswith(".html"):
        from .html import render_html  # lazy: matplotlib (the page's charts) loads only for .html

        text = render_html(data)
    else:
        text = json.dumps(data, indent=1)
    write_text(path, text)
    return name
