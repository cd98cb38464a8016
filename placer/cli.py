"""Command line: offline planning.

* ``autoplace plan MODEL.keras --devices …``: trace, profile and place a saved
  Keras model; write a report (and optionally a SavedModel).
* ``autoplace plan-graph GRAPH.json [--devices …]``: place a cost-annotated
  graph file (``docs/graph-format.md``) without TensorFlow.

Output for people goes through this module (stdout); the library only logs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence


def _parser() -> argparse.ArgumentParser:
    # Choices and defaults come from the registries and option dataclasses (TensorFlow-free modules:
    # ``plan-graph`` never imports TensorFlow, and ``plan`` must not before --logical-cpus is applied).
    from .core.build import GROUPINGS, MODEL_GROUP_BY
    from .core.compression import COMPRESSION_CHOICES
    from .core.objectives import OBJECTIVES
    from .planner import MEMORY_MODELS, MODEL_MEMORY, PlanOptions
    from .solvers import available_solvers

    def planning(sub: argparse.ArgumentParser, group_by: str, memory: str) -> None:
        sub.add_argument("--objective", default=PlanOptions.objective, choices=sorted(OBJECTIVES))
        sub.add_argument("--algorithm", default=PlanOptions.algorithm, choices=available_solvers())
        sub.add_argument("--time-limit", type=float, default=PlanOptions.time_limit_s,
                         help=f"search budget in seconds (default {PlanOptions.time_limit_s:g})")
        sub.add_argument("--seed", type=int, default=PlanOptions.seed)
        sub.add_argument("--group-by", default=group_by, choices=sorted(GROUPINGS),
                         help=f"which nodes move together (default {group_by})")
        sub.add_argument("--memory", default=memory, choices=list(MEMORY_MODELS),
                         help=f"what must fit each device's memory: resident bytes or the step's simulated peak "
                         f"(default {memory})")
        sub.add_argument("-q", "--quiet", action="store_true", help="no progress output")

    p = argparse.ArgumentParser(prog="autoplace", description="Automatic model-parallel placement for Keras 3.")
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="place a saved Keras model and write a report")
    plan.add_argument("model", help="a .keras file (keras.saving.load_model)")
    plan.add_argument("--devices", nargs="+", required=True, help="e.g. /CPU:0 /CPU:1 or /GPU:0 /GPU:1")
    plan.add_argument("--logical-cpus", type=int, default=0,
                      help="split the CPU into N logical devices first (to plan on one machine)")
    plan.add_argument("--batch-size", type=int, default=None)
    plan.add_argument("--compression", default="none", choices=list(COMPRESSION_CHOICES),
                      help="codec of cut float edges; auto: per edge, the fastest within the error budget")
    plan.add_argument("--training", action="store_true",
                      help="place the training step (the model file must be saved compiled)")
    plan.add_argument("--replicas", type=int, default=1, help="with --training: data-parallel groups of devices")
    plan.add_argument("--report", default="autoplace_report.json", help="report path (.json)")
    plan.add_argument("--export", default=None, help="also write a SavedModel of the placed model here")
    plan.add_argument("--plan-json", default=None, help="also write the plan (op → device) as JSON here")
    plan.add_argument("--graph-json", default=None, help="also write the cost-annotated op graph here "
                      "(re-plan it offline with plan-graph)")
    planning(plan, MODEL_GROUP_BY, MODEL_MEMORY)

    graph = sub.add_parser("plan-graph", help="place a graph JSON file (no TensorFlow needed)")
    graph.add_argument("graph", help="an autoplace graph file (docs/graph-format.md)")
    graph.add_argument("--devices", nargs="+", default=None,
                       help="device names; default: the devices in the file")
    graph.add_argument("--memory-bytes", type=float, default=None,
                       help="capacity of each device given with --devices (default: unlimited)")
    graph.add_argument("--out", default=None, help="write the plan (node → device, figures) as JSON here")
    planning(graph, PlanOptions.group_by, PlanOptions.memory)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``autoplace`` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="autoplace: %(message)s", stream=sys.stderr)
    return _plan_graph(args) if args.command == "plan-graph" else _plan_model(args)


def _plan_graph(args: argparse.Namespace) -> int:
    from .core.devices import DeviceSpec
    from .core.graph_io import load_graph
    from .errors import AutoplaceError
    from .planner import solve

    try:
        graph, devices = load_graph(args.graph)
        if args.devices:
            mem = None if args.memory_bytes is None else int(args.memory_bytes)
            devices = [DeviceSpec(d, memory_bytes=mem) for d in args.devices]
        if devices is None:
            print(f"autoplace: error: {args.graph} lists no devices; pass --devices", file=sys.stderr)
            return 2
        plan = solve(graph, devices, objective=args.objective, algorithm=args.algorithm,
                     time_limit_s=args.time_limit, seed=args.seed, group_by=args.group_by, memory=args.memory)
        if args.out:
            plan.save(args.out)
    except (AutoplaceError, OSError) as e:
        print(f"autoplace: error: {e}", file=sys.stderr)
        return 2
    print(f"{len(plan.assignment)} nodes on {len(plan.devices)} devices, objective {plan.objective}: "
          f"{plan.value:.6g} {plan.unit} predicted (lower bound {plan.lower_bound:.6g}, gap {100 * plan.gap:.1f}%), "
          f"solver {plan.solver}, {plan.solve_time_s:.2f} s")
    print(f"predicted step {plan.predicted_step_time_s * 1e3:.3f} ms, predicted max load "
          f"{plan.predicted_max_load_s * 1e3:.3f} ms, traffic {plan.traffic_bytes / 1e6:.3f} MB")
    counts = plan.ops_per_device()
    for name, load, mem in zip(plan.devices, plan.predicted_device_load_s, plan.device_memory_bytes):
        print(f"  {name}: {counts[name]} nodes, predicted load {load * 1e3:.3f} ms, memory {mem / 1e6:.3f} MB")
    if args.out:
        print(f"plan: {args.out}")
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
        model = keras.saving.load_model(args.model, compile=args.training)
    except Exception as e:  # noqa: BLE001  (keras raises many types)
        print(f"autoplace: error: cannot load {args.model!r} as a Keras model: {e}", file=sys.stderr)
        return 2
    try:
        placed = placer.autoplace(model, args.devices, batch_size=args.batch_size, algorithm=args.algorithm,
                                  time_limit_s=args.time_limit, compression=args.compression,
                                  objective=args.objective, seed=args.seed, group_by=args.group_by,
                                  memory=args.memory, training=args.training, replicas=args.replicas)
        placed.report(args.report)
        if args.export:
            placed.export(args.export)
        if args.plan_json:
            placed.plan.save(args.plan_json)
        if args.graph_json:
            placed.save_graph(args.graph_json)
    except (placer.AutoplaceError, OSError) as e:
        print(f"autoplace: error: {e}", file=sys.stderr)
        return 2
    print(placed.summary())
    print(f"report: {args.report}")
    if args.export:
        print(f"SavedModel: {args.export}")
    if args.graph_json:
        print(f"op graph: {args.graph_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
