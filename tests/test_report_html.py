"""The HTML report in a real browser: headless Chromium lays out every chart, and the console stays silent."""

import re
import shutil
import subprocess

import pytest

import placer
from placer.reporting import validate_report
from tests.models import branchy

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/browser.sh installs it as root)")


def open_in_chromium(path):
    """``(body attributes, console lines)`` of ``path`` after load, in headless Chromium."""
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--virtual-time-budget=5000", "--dump-dom", path.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", proc.stdout)
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1))) if body else {}
    console = [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln]
    return attrs, console


@pytest.fixture(scope="module")
def report_paths(tmp_path_factory, devices):
    d = tmp_path_factory.mktemp("html")
    # a contiguous split over independent processors: cut edges to draw, whatever the measured op times
    placed = placer.autoplace(branchy(width=16), devices, batch_size=4, time_limit_s=1, algorithm="contiguous",
                              shared_capacity=None)
    return placed.report(d / "report.html"), validate_report(placed.report_data), d


@needs_browser
def test_every_chart_renders_and_the_console_is_clean(report_paths):
    from pathlib import Path

    html, data, _ = report_paths
    attrs, console = open_in_chromium(Path(html))
    assert attrs.get("data-charts-expected") == "5", attrs
    assert attrs.get("data-charts-rendered") == "5", attrs
    assert console == [], console
    page = Path(html).read_text()
    # the page speaks of this placement: its solver, each device, and the largest cut tensor
    assert data["plan"]["solver"] in page
    assert all(d["name"].rsplit("device:", 1)[1] in page for d in data["devices"])
    biggest = max((e for e in data["edges"] if e["cut"]), key=lambda e: e["bytes"])
    assert biggest["src"] in page


@needs_browser
def test_the_browser_check_catches_a_broken_page(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><body><figure class="chart"><svg width="0" height="0"></svg></figure>'
                    "<script>document.body.setAttribute('data-charts-rendered', '0'); missing();</script>"
                    "</body></html>")
    attrs, console = open_in_chromium(page)
    assert attrs.get("data-charts-rendered") == "0"
    assert any("missing is not defined" in ln for ln in console)


def test_the_page_is_self_contained(report_paths):
    from pathlib import Path

    html, _, _ = report_paths
    page = Path(html).read_text()
    assert not re.search(r'(src|href)="(https?:)?//', page), "no network fetches: it must open offline"
    assert page.count("<svg") >= 5


def test_a_large_report_renders_with_its_limits_stated():
    """4,000 ops in 1,600 layers: the Gantt bars are rasterised and the layer graph gives way to a note."""
    from placer.reporting import REPORT_FORMAT, REPORT_VERSION
    from placer.reporting.html import MAX_GRAPH_LAYERS, RASTERISE_ABOVE, render_html

    n, devices = 4000, ["/CPU:0", "/CPU:1"]
    ops = [{"name": f"m/l{i // 2}/op{i}", "type": "MatMul", "layer": f"m/l{i // 2 if i < 3200 else i}",
            "device": devices[i % 2], "compute_us": {"CPU": 1.0}, "compute_source": "measured",
            "memory_bytes": 0, "output_bytes": 4} for i in range(n)]
    edges = [{"src": ops[i]["name"], "dst": ops[i + 1]["name"], "bytes": 4, "cut": True, "codec": None}
             for i in range(n - 1)]
    timeline = [{"op": o["name"], "device": o["device"], "start_s": i * 1e-6, "end_s": (i + 1) * 1e-6}
                for i, o in enumerate(ops)]
    data = {"format": REPORT_FORMAT, "report_version": REPORT_VERSION, "source": "placement",
            "model": {"name": "big", "step": "predict"},
            "plan": {"devices": devices, "objective": "latency", "unit": "s", "value": 4e-3, "lower_bound": 2e-3,
                     "gap": 0.5, "solver": "auto/heft", "status": "heuristic", "solve_time_s": 1.0,
                     "predicted_step_time_s": 4e-3, "traffic_bytes": 16e3, "predicted_device_load_s": [2e-3, 2e-3],
                     "device_memory_bytes": [0, 0], "baselines": {}, "log": ["heft: 0.004"]},
            "devices": [{"name": d, "ops": n // 2, "predicted_load_s": 2e-3, "resident_bytes": 0} for d in devices],
            "traffic_bytes": {"devices": devices, "matrix": [[0, 8e3], [8e3, 0]]},
            "simulation": {"predicted_step_time_s": 4e-3, "timeline": timeline},
            "measurements": [], "ops": ops, "edges": edges}
    validate_report(data)
    assert len(timeline) > RASTERISE_ABOVE and len({o["layer"] for o in ops}) > MAX_GRAPH_LAYERS
    page = render_html(data)
    assert "<image" in page.split('id="chart-timeline"')[1].split("</figure>")[0]  # bars as one raster
    assert f"more than this page draws ({MAX_GRAPH_LAYERS:,})" in page
    assert "and 3,959 smaller cut edges" in page


def test_calibrated_links_show_their_fit(report_paths):
    """A calibrated link's fit quality is stored per link and shown beside its speed; an assumed one shows none."""
    from placer.reporting.html import render_html

    _, data, _ = report_paths
    assert data["links"] and all(link["fit"] is None for link in data["links"])  # logical devices: assumed
    first = {**data["links"][0], "source": "calibrated", "bandwidth_bytes_per_s": 1.4e9, "latency_s": 2.1e-4,
             "fit": {"r2": 0.95, "max_rel_error": 0.18, "points": 6}}
    page = render_html(validate_report({**data, "links": [first, *data["links"][1:]]}))
    row = re.search(r"<tr><td>1\.40 GB/s</td>.*?</tr>", page)
    assert row and "R² 0.950, 6 sizes, worst point 18% off" in row.group(0), row
    with pytest.raises(placer.ReportError):
        validate_report({**data, "links": [{**first, "fit": "good"}]})
    with pytest.raises(placer.ReportError):  # a fit must say how many sizes it stands on
        validate_report({**data, "links": [{**first, "fit": {"r2": 0.95, "max_rel_error": 0.18}}]})


def test_the_predicted_speedup_compares_simulated_steps(report_paths):
    """The baselines' steps are simulated; the plan's adds its measured fixed cost per call, which the
    "vs. one device" card leaves out of the comparison (else one device would read slower than itself)."""
    from placer.reporting.html import render_html

    _, data, _ = report_paths
    single = data["plan"]["baselines"]["single"]
    plan = {**data["plan"], "predicted_step_time_s": 0.010, "call_overhead_s": 0.004,
            "baselines": {**data["plan"]["baselines"], "single": {**single, "predicted_step_time_s": 0.012}}}
    page = render_html(validate_report({**data, "plan": plan}))
    card = re.search(r"([\d.]+)×</[^>]+>\s*<[^>]+>vs\. one device", page)
    assert card and card.group(1) == "2.00", card
    # the table of baselines sets the plan's simulated step beside theirs, and says what the fixed cost is
    row = re.search(r"<tr><td>autoplace \(.*?</tr>", page)
    assert row and "6.000 ms" in row.group(0), row
    assert "4.000 ms of measured fixed cost per call" in page

