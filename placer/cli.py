"""Command line: ``autoplace plan MODEL.keras --devices …`` (offline planning).

Output for people goes through this module (stdout); the library only logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoplace", description="Automatic model-parallel placement for Keras 3.")
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="place a saved Keras model and write a report")
    plan.add_argument("model", help="a .keras file (keras.saving.load_model)")
    plan.add_argument("--devices", nargs="+", required=True, help="e.g. /CPU:0 /CPU:1 or /GPU:0 /GPU:1")
    plan.add_argument("--logical-cpus", type=int, default=0,
                      help="split the CPU into N logical devices first (to plan on one machine)")
    plan.add_argument("--batch-size", type=int, default=None)
    plan.add_argument("--algorithm", default="auto")
    plan.add_argument("--time-limit", type=float, default=10.0, help="solver budget in seconds")
    plan.add_argument("--compression", default="none", choices=["none", "bf16", "fp16"])
    plan.add_argument("--report", default="autoplace_report.json", help="report path (.json)")
    plan.add_argument("--export", default=None, help="also write a SavedModel of the placed model here")
    plan.add_argument("--plan-json", default=None, help="also write the plan (op → device) as JSON here")
    plan.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``autoplace`` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="autoplace: %(message)s", stream=sys.stderr)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # after argument parsing: logical devices must precede TF initialisation

    if args.logical_cpus:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus)
    import keras

    import placer

    if not os.path.exists(args.model):
        print(f"autoplace: error: model file {args.model!r} does not exist", file=sys.stderr)
        return 2
    try:
        model = keras.saving.load_model(args.model, compile=False)
    except Exception as e:  # noqa: BLE001  (keras raises many types)
        print(f"autoplace: error: cannot load {args.model!r} as a Keras model: {e}", file=sys.stderr)
        return 2
    try:
        placed = placer.autoplace(model, args.devices, batch_size=args.batch_size, algorithm=args.algorithm,
                                  time_limit_s=args.time_limit, compression=args.compression)
        placed.report(args.report)
        if args.export:
            placed.export(args.export)
    except placer.AutoplaceError as e:
        print(f"autoplace: error: {e}", file=sys.stderr)
        return 2
    if args.plan_json:
        with open(args.plan_json, "w", encoding="utf-8") as f:
            json.dump(placed.plan.to_dict(), f, indent=1)
    print(placed.summary())
    print(f"report: {args.report}")
    if args.export:
        print(f"SavedModel: {args.export}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
