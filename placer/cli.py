"""Command line: offline planning.

* ``autoplace plan MODEL.keras --devices …``: trace, profile and place a saved
  Keras model; write a report (and optionally a SavedModel).
* ``autoplace plan-graph GRAPH.json [--devices …]``: place a cost-annotated
  graph file (``docs/graph-format.md``) without TensorFlow.

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
    plan.add_argument("--objective", default="latency", choices=["latency", "throughput", "memory"])
    plan.add_argument("--time-limit", type=float, default=10.0, help="solver budget in seconds")
    plan.add_argument("--compression", default="none", choices=["none", "bf16", "fp16"])
    plan.add_argument("--report", default="autoplace_report.json", help="report path (.json)")
    plan.add_argument("--export", default=None, help="also write a SavedModel of the placed model here")
    plan.add_argument("--plan-json", default=None, help="also write the plan (op → device) as JSON here")
    plan.add_argument("-q", "--quiet", action="store_true", help="no progress output")

    graph = sub.add_parser("plan-graph", help="place a graph JSON file (no TensorFlow needed)")
    graph.add_argument("graph", help="an autoplace graph file (docs/graph-format.md)")
    graph.add_argument("--devices", nargs="+", default=None,
                       help="device names; default: the devices in the file")
    graph.add_argument("--memory-bytes", type=float, default=None,
                       help="capacity of each device given with --devices (default: unlimited)")
    graph.add_argument("--objective", default="latency", choices=["latency", "throughput", "memory"])
    graph.add_argument("--algorithm", default="auto")
    graph.add_argument("--time-limit", type=float, default=None, help="search budget in seconds (default 5)")
    graph.add_argument("--seed", type=int, default=0)
    graph.add_argument("--out", default=None, help="write the placement (node → device, figures) as JSON here")
    graph.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``autoplace`` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="autoplace: %(message)s", stream=sys.stderr)
    return _plan_graph(args) if args.command == "plan-graph" else _plan_model(args)


def _plan_graph(args: argparse.Namespace) -> int:
    from .devices import DeviceSpec
    from .errors import AutoplaceError
    from .graphs import load_graph
    from .placement import solve

    try:
        graph, devices = load_graph(args.graph)
        if args.devices:
            mem = None if args.memory_bytes is None else int(args.memory_bytes)
            devices = [DeviceSpec(d, memory_bytes=mem) for d in args.devices]
        if devices is None:
            print(f"autoplace: error: {args.graph} lists no devices; pass --devices", file=sys.stderr)
            return 2
        placement = solve(graph, devices, objective=args.objective, algorithm=args.algorithm,
                          time_limit=args.time_limit, seed=args.seed)
    except AutoplaceError as e:
        print(f"autoplace: error: {e}", file=sys.stderr)
        return 2
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(placement.to_dict(), f, indent=1)
    unit = placement.unit
    print(f"{len(placement.assignment)} nodes on {len(placement.devices)} devices, objective {placement.objective}: "
          f"{placement.value:.6g} {unit} (lower bound {placement.lower_bound:.6g}, gap {100 * placement.gap:.1f}%), "
          f"solver {placement.solver}, {placement.wall_s:.2f} s")
    print(f"simulated step {placement.step_time_s * 1e3:.3f} ms, max load {placement.max_load_s * 1e3:.3f} ms, "
          f"traffic {placement.traffic_bytes / 1e6:.3f} MB")
    for name, load, mem in zip(placement.devices, placement.device_load_s, placement.device_memory_bytes):
        count = sum(1 for d in placement.assignment.values() if d == name)
        print(f"  {name}: {count} nodes, load {load * 1e3:.3f} ms, memory {mem / 1e6:.3f} MB")
    if args.out:
        print(f"placement: {args.out}")
    return 0


def _plan_model(args: argparse.Namespace) -> int:
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
                                  time_limit_s=args.time_limit, compression=args.compression,
                                  objective=args.objective)
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
