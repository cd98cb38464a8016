"""Place and measure InceptionV3 on 4 logical CPU devices; write its HTML report and a screenshot for the docs.

    .venv/bin/python scripts/report_screenshot.py [OUT_DIR]   # default docs/

Writes OUT_DIR/report-inceptionv3.png (headless Chromium) and out/report-inceptionv3.{html,json,trace.json}.
"""

import os
import shutil
import subprocess
import sys

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

import keras  # noqa: E402

import placer  # noqa: E402


def main() -> int:
    docs = sys.argv[1] if len(sys.argv) > 1 else "docs"
    os.makedirs("out", exist_ok=True)
    model = keras.applications.InceptionV3(weights=None, input_shape=(299, 299, 3))
    placed = placer.autoplace(model, [f"/CPU:{i}" for i in range(4)], batch_size=8, time_limit_s=10)
    placed.measure(repeats=10)  # measured beside predicted: the 4 logical devices exist here
    print(placed.summary())
    for suffix in ("html", "json", "trace.json"):
        print(placed.report(f"out/report-inceptionv3.{suffix}"))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium: run scripts/browser.sh for the screenshot", file=sys.stderr)
        return 1
    shot = os.path.join(docs, "report-inceptionv3.png")
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1280,2300", "--virtual-time-budget=5000", f"--screenshot={os.path.abspath(shot)}",
                    "file://" + os.path.abspath("out/report-inceptionv3.html")], check=True, capture_output=True)
    print(shot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
