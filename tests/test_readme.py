"""The README's examples run as written, and the links in the README and docs point at files that exist."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown text, in order."""
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readme_python_examples_run_as_written(tmp_path):
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 4, "the README's API tour"
    script = tmp_path / "readme_examples.py"
    script.write_text("\n".join(blocks))
    env = dict(os.environ, PYTHONPATH=str(ROOT), AUTOPLACE_CACHE_DIR=str(tmp_path / "cache"),
               TF_CPP_MIN_LOG_LEVEL="2")
    # a fresh process: the examples configure logical devices before TensorFlow starts
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "measured speedup" in proc.stdout
    for written in ("report.html", "plan.json", "ops.json", "saved/saved_model.pb"):
        assert (tmp_path / written).exists(), written


def test_links_in_the_readme_and_docs_point_at_files_that_exist():
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
