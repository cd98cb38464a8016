"""Run a benchmark that starts TensorFlow gRPC servers inside a loopback-only network namespace (no TensorFlow here).

Imported before TensorFlow, so that a benchmark can still pin its own cores before TF sizes its thread pools.
"""

from __future__ import annotations

import sys
from typing import Callable

from placer.errors import DeviceError
from placer.measure.cluster import rerun_in_loopback_namespace


def isolated(run: Callable[[], int]) -> int:
    """``run()`` when this process is in a loopback-only namespace, else this script re-run in one; a machine
    without ``unshare``/``ip`` skips with a message (exit status 0)."""
    try:
        code = rerun_in_loopback_namespace(sys.argv)
    except DeviceError as e:
        print(f"skipped: {e}")
        return 0
    return run() if code is None else code
