"""The report as one self-contained HTML page (charts: matplotlib, inline SVG; opens offline).

:func:`render_html` takes report data (:mod:`placer.reporting.schema`) and
returns the page. Sections: what was placed where and why (objective,
bound, gap, baselines), what it costs in transfers, and the charts:

* per-device predicted compute load, and memory against capacity;
* device-to-device traffic heatmap;
* Gantt timeline of the simulated step;
* the op graph coarsened to layers, coloured by device (cut edges in red);
* the baselines side by side;

then tables of cut edges (with their codecs), devices and links, the cost
sources and the solver log. A report made from a plan JSON alone has no op
graph or timeline; those sections say so. Every figure is labelled
*predicted* (cost model) or *measured*.

The page has one small inline script: once laid out, it counts the charts
whose SVG has a non-empty box and writes ``data-charts-rendered`` /
``data-charts-expected`` on ``<body>`` (what the headless-browser test reads).

Examples
--------
>>> from placer.reporting.schema import report_from_plan
>>> from placer.core.plan import Plan
>>> p = Plan(devices=("/CPU:0", "/CPU:1"), assignment={"a": "/CPU:0", "b": "/CPU:1"}, objective="latency",
...          unit="s", value=0.003, lower_bound=0.002, gap=1 / 3, solver="auto/etf", status="heuristic",
...          predicted_device_load_s=(0.002, 0.001), device_memory_bytes=(10.0, 20.0))
>>> page = render_html(report_from_plan(p.to_dict()))
>>> page.startswith("<!DOCTYPE html>"), "<svg" in page, "http://" in page.split("<svg")[0]
(True, True, False)
"""

from __future__ import annotations

import html
import io
import math
from collections import Counter, defaultdict
from typing import Any, Mapping, Sequence

#: Above this many timeline bars, the Gantt chart's bars are rasterised inside the SVG (a smaller page).
RASTERISE_ABOVE = 3000
#: The layer graph is drawn when it has at most this many layers (else a note says it was too large).
MAX_GRAPH_LAYERS = 1500
#: Rows of the cut-edge table (the largest edges; the rest are counted).
CUT_EDGE_ROWS = 40

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1180px;padding:1em 2em;
color:#1d2330;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #d5d9e0;padding-bottom:.2em;margin-top:1.6em}
.cards{display:flex;flex-wrap:wrap;gap:.8em}.card{background:#f4f6f9;border-radius:8px;padding:.6em 1em;min-width:10em}
.card b{display:block;font-size:1.35em}.card span{color:#5a6272;font-size:.85em}
.tag{font-size:.72em;padding:.05em .45em;border-radius:4px;background:#e6e9ef;color:#394050;vertical-align:middle}
.tag.measured{background:#d8f0dc;color:#175e26}
table{border-collapse:collapse;font-size:.86em;margin:.6em 0}td,th{border-bottom:1px solid #e3e6ea;padding:.25em .6em;
text-align:left}th{background:#f4f6f9}td.num{text-align:right;font-variant-numeric:tabular-nums}
figure.chart{margin:1em 0}figure.chart svg{max-width:100%;height:auto}figcaption{color:#5a6272;font-size:.88em}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5em .9em}pre{background:#f4f6f9;padding:.6em;
overflow-x:auto;font-size:.8em}
"""

_SCRIPT = """
window.addEventListener("load", function () {
  var charts = document.querySelectorAll("figure.chart"), ok = 0;
  charts.forEach(function (f) {
    var svg = f.querySelector("svg");
    if (svg) { var r = svg.getBoundingClientRect(); if (r.width > 0 && r.height > 0) ok += 1; }
  });
  document.body.setAttribute("data-charts-expected", String(charts.length));
  document.body.setAttribute("data-charts-rendered", String(ok));
});
"""


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _ms(s: float | None) -> str:
    return "n/a" if s is None else f"{s * 1e3:.3f} ms"


def _mb(b: float | None) -> str:
    if b is None:
        return "n/a"
    return f"{b / 2**20:.2f} MiB" if b >= 2**20 else f"{b / 1024:.1f} KiB" if b >= 1024 else f"{b:.0f} B"


def _value(x: float | None, unit: str) -> str:
    return _ms(x) if unit == "s" else _mb(x)


def _fit_text(fit: dict | None) -> str:
    """A calibrated link's fit quality in words ("—" for an assumed link)."""
    if not fit:
        return "—"
    return f"R² {fit['r2']:.3f}, {fit['points']} sizes, worst point {100 * fit['max_rel_error']:.0f}% off"


def _short(device: str) -> str:
    """``/job:localhost/replica:0/task:0/device:CPU:1`` → ``CPU:1``; remote devices keep their task."""
    if device.startswith("/job:localhost/replica:0/task:0/device:"):
        return device.rsplit("device:", 1)[1]
    parts = dict(p.split(":", 1) for p in device.strip("/").split("/") if ":" in p)
    return f"{parts.get('job', '?')}:{parts.get('task', '?')}/{parts.get('device', device)}"


def _palette(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _svg(fig: Any) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "autoplace"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _chart(name: str, fig: Any, caption: str) -> str:
    return f'<figure class="chart" id="chart-{name}">{_svg(fig)}<figcaption>{caption}</figcaption></figure>'


def _load_memory_chart(data: Mapping[str, Any]) -> str:
    devs = data["devices"]
    labels = [_short(d["name"]) for d in devs]
    colors = _palette(len(devs))
    fig = _figure(10, 3.2)
    ax1, ax2 = fig.subplots(1, 2)
    loads = [(d.get("predicted_load_s") or 0) * 1e3 for d in devs]
    ax1.bar(labels, loads, color=colors)
    ax1.set_ylabel("ms (predicted)")
    ax1.set_title("compute load per device")
    resident = [(d.get("resident_bytes") or 0) / 2**20 for d in devs]
    peak = [(d.get("predicted_peak_memory_bytes") or 0) / 2**20 for d in devs]
    x = range(len(devs))
    ax2.bar([i - 0.2 for i in x], resident, width=0.4, color=colors, label="resident (weights, state)")
    ax2.bar([i + 0.2 for i in x], peak, width=0.4, color=colors, alpha=0.45, hatch="//",
            label="predicted peak (+ live tensors)")
    caps = [d.get("memory_capacity_bytes") for d in devs]
    for i, c in enumerate(caps):
        if c:
            ax2.hlines(c / 2**20, i - 0.45, i + 0.45, colors="#c0392b", linewidth=2,
                       label="capacity" if i == next(j for j, v in enumerate(caps) if v) else None)
    ax2.set_xticks(list(x), labels)
    ax2.set_ylabel("MiB")
    ax2.set_title("memory per device" + ("" if any(caps) else " (capacity: unlimited)"))
    ax2.legend(fontsize=7, loc="upper right")
    return _chart("load-memory", fig, "Predicted compute load (sum of op times) and memory per device. A balanced "
                  "plan has bars of similar height; memory must stay under each device's capacity line.")


def _traffic_chart(data: Mapping[str, Any]) -> str:
    import numpy as np

    t = data["traffic_bytes"]
    m = np.array([[v or 0 for v in row] for row in t["matrix"]], dtype=float)
    scale, unit = (2**20, "MiB") if m.max() >= 2**20 else (1024, "KiB") if m.max() >= 1024 else (1, "bytes")
    m /= scale
    labels = [_short(d) for d in t["devices"]]
    fig = _figure(4.6 + 0.25 * len(labels), 3.6 + 0.2 * len(labels))
    ax = fig.subplots()
    im = ax.imshow(m, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("to")
    ax.set_ylabel("from")
    if len(labels) <= 12:
        top = m.max() or 1
        for i in range(len(labels)):
            for j in range(len(labels)):
                ax.text(j, i, f"{m[i, j]:.3g}", ha="center", va="center", fontsize=7,
                        color="white" if m[i, j] > top / 2 else "#1d2330")
    fig.colorbar(im, ax=ax, label=f"{unit} per step")
    return _chart("traffic", fig, f"Bytes sent between devices per step ({unit}; from row to column). Every byte "
                  "here is a transfer the plan pays for.")


def _timeline_chart(data: Mapping[str, Any]) -> str:
    timeline = data["simulation"]["timeline"]
    devices = list(data["plan"]["devices"])
    row = {d: i for i, d in enumerate(devices)}
    colors = _palette(len(devices))
    layer_of = {op["name"]: op.get("layer", op["name"]) for op in data.get("ops", [])}
    m = int(data["simulation"].get("microbatches", 1))

    def layer(op: str) -> str:  # a pipelined step's ops are "mb{i}/<op>": shade micro-batches by layer too
        base = op.split("/", 1)[1] if m > 1 and op.startswith("mb") and "/" in op else op
        return layer_of.get(base, base)

    layers = sorted({layer(t["op"]) for t in timeline})
    shade = {name: 0.55 + 0.45 * ((i * 0.618) % 1.0) for i, name in enumerate(layers)}
    fig = _figure(11, 0.6 + 0.45 * len(devices))
    ax = fig.subplots()
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    alphas: dict[str, list[float]] = defaultdict(list)
    for t in timeline:
        start, end = (t["start_s"] or 0) * 1e3, (t["end_s"] or 0) * 1e3
        spans[t["device"]].append((start, max(end - start, 1e-6)))
        alphas[t["device"]].append(shade[layer(t["op"])])
    raster = len(timeline) > RASTERISE_ABOVE
    for d, bars in spans.items():
        base = colors[row[d]]
        faces = [(base[0] * a, base[1] * a, base[2] * a, 1.0) for a in alphas[d]]
        coll = ax.broken_barh(bars, (row[d] - 0.4, 0.8), facecolors=faces, edgecolor="none")
        coll.set_rasterized(raster)
    ax.set_yticks(range(len(devices)), [_short(d) for d in devices])
    ax.invert_yaxis()
    ax.set_xlabel("ms (predicted)")
    step = data["simulation"].get("predicted_step_time_s")
    if step:
        ax.axvline(step * 1e3, color="#c0392b", linewidth=1)
    ax.set_title("simulated step" + (f" as a pipeline of {m} micro-batches" if m > 1 else ""))
    piped = f", {m} micro-batches" if m > 1 else ""
    order = data["simulation"].get("ready_order")
    piped += {"lifo": ", each device running its ready ops depth first",
              "fifo": ", each device running its earliest ready op first"}.get(order, "")
    return _chart("timeline", fig, f"Gantt chart of one simulated step ({len(timeline)} ops{piped}; shades tell layers "
                  "apart; the red line is the predicted step time). Gaps on a device are waits for inputs from "
                  "other devices. The same timeline is in the .trace.json file for Perfetto.")


def _layer_graph(data: Mapping[str, Any]) -> tuple[Any, dict[str, str], dict[tuple[str, str], float]]:
    import networkx as nx

    layer = {op["name"]: op.get("layer", op["name"]) for op in data["ops"]}
    votes: dict[str, Counter] = defaultdict(Counter)
    for op in data["ops"]:
        votes[layer[op["name"]]][op["device"]] += 1
    device = {lay: c.most_common(1)[0][0] for lay, c in votes.items()}
    g = nx.DiGraph()
    g.add_nodes_from(device)
    flow: dict[tuple[str, str], float] = defaultdict(float)
    for e in data.get("edges", []):
        a, b = layer.get(e["src"]), layer.get(e["dst"])
        if a is not None and b is not None and a != b and e["bytes"]:  # data edges only, not control
            g.add_edge(a, b)
            flow[a, b] += e["bytes"] or 0
    return g, device, flow


def _graph_chart(data: Mapping[str, Any]) -> str:
    import networkx as nx

    g, device, flow = _layer_graph(data)
    if g.number_of_nodes() > MAX_GRAPH_LAYERS:
        return (f'<p class="note">The op graph has {g.number_of_nodes():,} layers, more than this page draws '
                f"({MAX_GRAPH_LAYERS:,}); the tables below list its cut edges.</p>")
    if not nx.is_directed_acyclic_graph(g):  # layers can form cycles (ops of one layer on both sides of another)
        order = {v: i for i, v in enumerate(device)}
        g.remove_edges_from([(a, b) for a, b in list(g.edges) if order[a] >= order[b]])
    depth: dict[str, int] = {}
    for v in nx.topological_sort(g):
        depth[v] = max((depth[u] + 1 for u in g.predecessors(v)), default=0)
    columns: dict[int, list[str]] = defaultdict(list)
    for v in g:
        columns[depth[v]].append(v)
    pos = {v: (x, i - (len(vs) - 1) / 2) for x, vs in columns.items() for i, v in enumerate(vs)}
    devices = list(data["plan"]["devices"])
    colors = _palette(len(devices))
    width = min(14, 4 + 0.06 * (max(depth.values(), default=0) + 1))
    fig = _figure(width, 4.2)
    ax = fig.subplots()
    cut = [(a, b) for a, b in g.edges if device[a] != device[b]]
    kept = [(a, b) for a, b in g.edges if device[a] == device[b]]
    nx.draw_networkx_edges(g, pos, edgelist=kept, ax=ax, width=0.5, edge_color="#9aa3b2", arrows=False)
    nx.draw_networkx_edges(g, pos, edgelist=cut, ax=ax, width=1.4, edge_color="#c0392b", arrows=False)
    size = 60 if g.number_of_nodes() < 200 else 18
    for i, d in enumerate(devices):
        nodes = [v for v in g if device[v] == d]
        if nodes:
            nx.draw_networkx_nodes(g, pos, nodelist=nodes, ax=ax, node_size=size, node_color=[colors[i]],
                                   label=_short(d))
    if g.number_of_nodes() <= 40:
        nx.draw_networkx_labels(g, pos, {v: v.rsplit("/", 1)[-1][:18] for v in g}, ax=ax, font_size=6)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_axis_off()
    ax.set_title("layers, coloured by device")
    return _chart("graph", fig, f"The op graph coarsened to its {g.number_of_nodes()} layers (left to right in "
                  f"dependency order), each coloured by the device most of its ops run on; {len(cut)} red edges "
                  "cross devices (data edges; control dependencies are left out).")


def _simulated_step(plan: Mapping[str, Any]) -> float:
    """The plan's simulated step: its predicted step less the measured fixed cost per call, which the
    baselines' steps (simulated) do not have; what to set beside them."""
    return plan["predicted_step_time_s"] - plan.get("call_overhead_s", 0.0)


def _baseline_chart(data: Mapping[str, Any]) -> str:
    plan = data["plan"]
    names = ["autoplace"] + list(plan["baselines"])
    steps = [_simulated_step(plan)] + [b["predicted_step_time_s"] for b in plan["baselines"].values()]
    values = [plan["value"]] + [b["value"] for b in plan["baselines"].values()]
    fig = _figure(10, 0.9 + 0.35 * len(names))
    ax1, ax2 = fig.subplots(1, 2)
    colors = ["#2e86de"] + ["#a4adbb"] * (len(names) - 1)
    ax1.barh(names, [(s or 0) * 1e3 for s in steps], color=colors)
    ax1.invert_yaxis()
    ax1.set_xlabel("ms (simulated step)")
    scale, unit = (1e3, "ms") if plan["unit"] == "s" else (1 / 2**20, "MiB")
    ax2.barh(names, [(v or 0) * scale for v in values], color=colors)
    ax2.invert_yaxis()
    ax2.set_xlabel(f"{plan['objective']} objective, {unit} (predicted)")
    return _chart("baselines", fig, "The plan next to simple placements scored by the same cost model: one device "
                  "(single), ops dealt out in turn (round_robin), and equal contiguous slices of the op order "
                  "(contiguous).")


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    h = "".join(f"<th>{_esc(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f'<td class="num">{_esc(c)}</td>' if i in numeric else f"<td>{_esc(c)}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _overview(data: Mapping[str, Any]) -> str:
    plan = data["plan"]
    single = plan["baselines"].get("single")
    step = plan["predicted_step_time_s"]
    simulated = _simulated_step(plan)
    speedup = (single["predicted_step_time_s"] / simulated) if single and simulated > 0 and \
        single["predicted_step_time_s"] else None
    gap = plan.get("gap")
    cut = [e for e in data.get("edges", []) if e["cut"]]
    cards = [
        (_ms(step), "predicted step time", "predicted"),
        (f"{speedup:.2f}×" if speedup else "n/a", "vs. one device", "predicted"),
        (f"{100 * gap:.1f}%" if gap is not None else "n/a", f"gap to the lower bound ({_value(plan.get('lower_bound'), plan['unit'])})", ""),
        (_mb(plan["traffic_bytes"]), f"sent between devices per step{f' ({len(cut)} cut edges)' if data.get('edges') else ''}", "predicted"),
        (str(len(plan["devices"])), "devices", ""),
    ]
    for m in data.get("measurements") or []:
        if "prediction_error" in m:  # the placed model's entry (StepMeasurement.report_entries)
            cards.insert(1, (_ms(m["step_time_s"]), f"measured step time (batch {m.get('batch_size', '?')})",
                             "measured"))
        if m.get("speedup_of_placed") is not None:
            cards.insert(2, (f"{m['speedup_of_placed']:.2f}×", "vs. the original, on these devices", "measured"))
    html_cards = "".join(f'<div class="card"><b>{_esc(v)}</b><span>{_esc(t)}'
                         + (f' <span class="tag {k}">{k}</span>' if k else "") + "</span></div>" for v, t, k in cards)
    objective = {"latency": "the time of one step (a simulated schedule of every op and transfer)",
                 "throughput": "the busiest device's load, i.e. the step time when micro-batches keep every "
                               "device busy (a pipeline)",
                 "memory": "the bytes sent between devices, with every device under its memory capacity"}
    model = data.get("model", {})
    what = (f"{_esc(model.get('name', 'The model'))}'s {_esc(model.get('step', 'predict'))} step"
            if model else "The graph")
    ops = data.get("graph", {}).get("ops")
    best = min(plan["baselines"].items(), key=lambda kv: kv[1]["value"] if kv[1]["value"] is not None else math.inf,
               default=None)
    vs = (f" The best simple placement ({_esc(best[0])}) scores {_value(best[1]['value'], plan['unit'])}."
          if best else "")
    return (f'<div class="cards">{html_cards}</div>'
            f"<p>{what}{f' ({ops:,} ops)' if ops else ''} was placed on {len(plan['devices'])} devices by "
            f"<b>{_esc(plan['solver'])}</b> [{_esc(plan['status'])}], minimising <b>{_esc(plan['objective'])}</b>: "
            f"{objective.get(plan['objective'], '')}. Its value is {_value(plan['value'], plan['unit'])} against a "
            f"proven lower bound of {_value(plan.get('lower_bound'), plan['unit'])}: no plan can do better than the "
            f"bound, so the gap says how much room is left at most.{vs}</p>")


def _measurements(data: Mapping[str, Any]) -> str:
    rows = data.get("measurements") or []
    if not rows:
        return ('<p class="note">Nothing was measured for this report: every time on this page is <b>predicted</b> '
                "by autoplace's cost model (measured op times, assumed link speeds) and has not been checked "
                "against a run on these devices. <code>placed.measure(x)</code> (or <code>autoplace plan "
                "--measure</code>) times the placed model against the original.</p>")
    table = _table(["what", "step time (measured)", "spread (½ IQR)", "runs", "batch"],
                   [(m["what"], _ms(m["step_time_s"]), _ms(m.get("spread_s")), m.get("repeats", ""),
                     m.get("batch_size", "")) for m in rows], numeric=(1, 2, 3, 4))
    notes = []
    for m in rows:
        if m.get("speedup_of_placed") is not None:
            notes.append(f"Measured speedup of the placed model over the {_esc(m['what'])}: "
                         f"<b>{m['speedup_of_placed']:.2f}×</b>.")
        if m.get("prediction_error") is not None:
            err = m["prediction_error"]
            notes.append(f"The cost model predicted {_ms(m.get('predicted_step_time_s'))} for the placed step: "
                         f"<b>{100 * err:+.1f}%</b> off the measurement"
                         + (" — a disagreement this large is a cost-model bug to report." if abs(err) > 0.15 else "."))
    return table + "".join(f"<p>{n}</p>" for n in notes)


def _cut_edges(data: Mapping[str, Any]) -> str:
    every = [e for e in data.get("edges", []) if e["cut"]]
    cut = sorted((e for e in every if e["bytes"]), key=lambda e: -e["bytes"])
    control = len(every) - len(cut)
    ordering = (f"<p>{control:,} more cut edges carry no data (control dependencies or shape-only inputs); "
                "each costs one link latency.</p>" if control else "")
    if not cut:
        return "<p>No tensor crosses devices.</p>" + ordering
    device = {op["name"]: op["device"] for op in data["ops"]}
    rows = [(e["src"], e["dst"], f"{_short(device[e['src']])} → {_short(device[e['dst']])}", _mb(e["bytes"]),
             e["codec"] or "none") for e in cut[:CUT_EDGE_ROWS]]
    more = (f"<p>…and {len(cut) - CUT_EDGE_ROWS:,} smaller cut edges (the JSON report lists every edge).</p>"
            if len(cut) > CUT_EDGE_ROWS else "")
    return _table(["from op", "to op", "devices", "bytes per step", "codec"], rows, numeric=(3,)) + more + ordering \
        + _sends(data)


def _sends(data: Mapping[str, Any]) -> str:
    """What the placed step does to make sends prompt (``sends`` of a model's report; nothing for a graph's)."""
    sends = data.get("sends")
    if not sends:
        return ""
    if not sends["prompt"]:
        return ("<p>Sends between processes run when TensorFlow's executor gets to them "
                "(<code>sends=\"executor\"</code>).</p>")
    acked = sends["acknowledged"]
    shown = ", ".join(f"<code>{_esc(a['tensor'])}</code> → {_esc(_short(a['to']))}" for a in acked[:CUT_EDGE_ROWS])
    more = f", …and {len(acked) - CUT_EDGE_ROWS:,} more" if len(acked) > CUT_EDGE_ROWS else ""
    count = "1 cross-process transfer is" if len(acked) == 1 else f"{len(acked):,} cross-process transfers are"
    return (f"<p>Prompt sends: {count} acknowledged by the receiving process, and the sender's competing ops "
            "wait for the acknowledgement, so each leaves as soon as it is computed"
            + (f" ({shown}{more})." if acked else " (none qualified: no transfer lets enough work start).")
            + " The simulated step includes their round trips unless it is pipelined or replicated.</p>")


def _splits(data: Mapping[str, Any]) -> str:
    """Which ops are split, how, where their shards live, and the log's reason (a report with ``splits``)."""
    splits = data.get("splits") or ()
    if not splits:
        return ""
    rows = []
    for s in splits:
        how = ("by table rows (each part gathers its rows, the parts summed)" if s["kind"] == "rows" else
               "by output columns" + (f", its parts taken as the input rows of {s['paired_with']} (a pair: its "
                                      "parts' products summed, no join between the two)" if s["paired_with"]
                                      else ", the parts concatenated"))
        rows.append((s["op"], s["parts"], how))
    shard_rows = [(s["variable"], f"[{s['start']}:{s['stop']}] on axis {s['axis']}", _short(s["device"]))
                  for s in (data.get("shards") or ())]
    why = [line for line in data["plan"].get("log", []) if line.startswith("operator splits:")]
    return ("<h2>Split operators</h2>" + _table(["op", "parts", "split"], rows, numeric=(1,))
            + ("<h3>Weight shards</h3>" + _table(["weight", "slice", "device"], shard_rows[:CUT_EDGE_ROWS])
               if shard_rows else "")
            + "".join(f'<p class="note">{_esc(line)}</p>' for line in why))


def render_html(data: Mapping[str, Any]) -> str:
    """The report as a self-contained HTML page (see the module docstring)."""
    plan = data["plan"]
    full = data.get("source", "placement") == "placement"
    title = f"autoplace report: {data.get('model', {}).get('name', 'placement')}"
    parts = [f"<h1>{_esc(title)}</h1>", _overview(data), "<h2>Measured</h2>", _measurements(data),
             "<h2>Where the work runs</h2>", _load_memory_chart(data)]
    if full and data.get("simulation"):
        parts += [_timeline_chart(data)]
    if full and data.get("traffic_bytes"):
        parts += ["<h2>What it costs in transfers</h2>", _traffic_chart(data)]
    if full and data.get("ops"):
        parts += [_graph_chart(data), "<h3>Cut edges</h3>", _cut_edges(data)]
    if not full:
        parts.append('<p class="note">This report was made from a plan JSON alone: it has no op graph, links or '
                     "timeline. Write the full report with <code>placed.report(\"x.json\")</code> or "
                     "<code>autoplace plan --report x.json</code>.</p>")
    parts.append(_splits(data))
    parts += ["<h2>Why this plan</h2>", _baseline_chart(data)]
    base_rows = [("autoplace (" + plan["solver"] + ")", _value(plan["value"], plan["unit"]),
                  _ms(_simulated_step(plan)))]
    base_rows += [(k, _value(b["value"], plan["unit"]), _ms(b["predicted_step_time_s"]))
                  for k, b in plan["baselines"].items()]
    parts.append(_table(["placement", f"{plan['objective']} (predicted)", "step (simulated)"], base_rows,
                        numeric=(1, 2)))
    if plan.get("candidates"):
        parts += ["<h3>Strategies scored</h3>", _table(
            ["strategy", "solver", "devices", "copies", "micro-batches", "ops split", "step (predicted)",
             "peak memory (predicted)", "outcome"],
            [(c["strategy"], c["solver"], c["devices_used"], c["replicas"], c["microbatches"], c["splits"],
              _ms(c["predicted_step_time_s"]) if c["predicted_step_time_s"] is not None else "not scored",
              _mb(c["predicted_peak_memory_bytes"]) if c["predicted_peak_memory_bytes"] is not None else "",
              c["outcome"]) for c in plan["candidates"]], numeric=(2, 3, 4, 5, 6, 7))]
    if plan.get("call_overhead_s"):
        parts.append(f'<p class="note">The plan\'s predicted step, {_esc(_ms(plan["predicted_step_time_s"]))}, is '
                     f'its simulated step plus {_esc(_ms(plan["call_overhead_s"]))} of measured fixed cost per '
                     "call (dispatch, inputs, outputs, captured variables); the baselines' calls were not "
                     "measured, so the steps above are compared without it.</p>")
    dev_rows = [(_short(d["name"]), d.get("kind", ""), d["ops"], _ms(d.get("predicted_load_s")),
                 _mb(d.get("resident_bytes")), _mb(d.get("predicted_peak_memory_bytes")),
                 _mb(d.get("memory_capacity_bytes")) if d.get("memory_capacity_bytes") else "unlimited")
                for d in data["devices"]]
    parts += ["<h2>Devices and links</h2>",
              _table(["device", "kind", "ops", "load (predicted)", "resident", "peak (predicted)", "capacity"],
                     dev_rows, numeric=(2, 3, 4, 5, 6))]
    for sp in data.get("shared_processors", []):
        what = "processor" if sp.get("pooled", True) else "machine (one process each)"
        parts.append(f"<p>{len(sp['devices'])} devices ({', '.join(_short(d) for d in sp['devices'])}) share one "
                     f"{what}: together they do {sp['capacity']:.2f} ops' worth of work at once "
                     f"({html.escape(sp['source'])}); the predictions charge it.</p>")
    if data.get("links"):
        kinds = Counter(link["source"] for link in data["links"])
        def key(link: dict) -> tuple:
            return link["bandwidth_bytes_per_s"], link["latency_s"], link["source"], _fit_text(link.get("fit"))

        counts = Counter(key(link) for link in data["links"])
        link_rows = [(f"{bw / 1e9:.2f} GB/s", f"{lat * 1e6:.1f} µs", src, fit, n)
                     for (bw, lat, src, fit), n in sorted(counts.items())]
        parts.append(_table(["bandwidth", "latency", "source", "fit of the calibration", "links"], link_rows,
                            numeric=(4,)))
        if "calibrated" not in kinds:
            parts.append("<p>Link speeds are <b>assumed</b> (defaults or the DeviceSpec's values), not measured.</p>")
    cm = data.get("cost_model")
    if cm:
        factors = cm.get("runtime_factor") or {}
        parts += ["<h2>Where the costs come from</h2>",
                  _table(["device kind", "op times", "scaled to the runtime's measured step"],
                         [(kind, src, f"×{factors[kind]:.3f}" if kind in factors else "not measured")
                          for kind, src in sorted(cm.get("compute", {}).items())])]
        unknown = cm.get("analytic_unknown_op_types") or {}
        if unknown:
            parts.append("<p>Op types without an analytic formula (estimated from bytes): "
                         + _esc(", ".join(sorted({t for v in unknown.values() for t in v}))) + "</p>")
    parts += ["<h2>Solver log</h2>", "<pre>" + _esc("\n".join(plan.get("log", []))) + "</pre>"]
    if data.get("stage_seconds"):
        parts.append(_table(["stage", "seconds (measured wall time of autoplace itself)"],
                            [(k, f"{v:.2f}") for k, v in data["stage_seconds"].items()], numeric=(1,)))
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>'
            f"<body>\n{body}\n<script>{_SCRIPT}</script></body></html>\n")
