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
    placed = placer.autoplace(branchy(width=16), devices, batch_size=4, time_limit_s=1)
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
