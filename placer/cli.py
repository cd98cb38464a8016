"""Command line: offline planning.

* ``autoplace plan MODEL.keras --devices …``: trace, profile and place a saved
  Keras model; write a report (and optionally a SavedModel).
* ``autoplace plan-graph GRAPH.json [--devices …]``: place a cost-annotated
  graph file (``docs/graph-format.md``) without TensorFlow.

Output for people goes through this module (stdout); the library only logs.

Exit codes: 0 done; 2 a user error (bad arguments, input files, devices, an
impossible request: every :class:`~placer.errors.AutoplaceError`), one line
on stderr; 1 an internal error (a bug: please report it), one line, with the
traceback under ``--verbose``. Output paths are checked before any work, and
are never one of the command's inputs.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import traceback
from typing import Any, Callable, NoReturn, Sequence


class _UsageError(Exception):
    """A bad command line (argparse's complaint), reported in one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see {self.prog} --help)")


def _checked(convert: Callable[[str], Any], check: Callable[[str, Any], Any], what: str) -> Callable[[str], Any]:
    """An argparse ``type``: ``convert`` the text, then validate it with :mod:`placer.core.validate`."""
    def parse(text: str) -> Any:
        from .errors import AutoplaceError

        try:
            value = convert(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        try:
            return check(text, value)
        except AutoplaceError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _parser() -> argparse.ArgumentParser:
    # Choices and defaults come from the registries and option dataclasses (TensorFlow-free modules:
    # ``plan-graph`` never imports TensorFlow, and ``plan`` must not before --logical-cpus is applied).
    from .core.build import GROUPINGS, MODEL_GROUP_BY
    from .core.compression import COMPRESSION_CHOICES
    from .core.objectives import OBJECTIVES
    from .planner import MEMORY_MODELS, MODEL_MEMORY, PlanOptions
    from .core.validate import MAX_BATCH_SIZE, MAX_BYTES, MAX_SEED, MAX_TIME_LIMIT_S, integer, real
    from .solvers import available_solvers

    seconds = _checked(_float, lambda t, v: real(t, v, strict=True, maximum=MAX_TIME_LIMIT_S),
                       "a finite number of seconds")
    seed = _checked(int, lambda t, v: integer(t, v, maximum=MAX_SEED), "an integer")
    count = _checked(int, lambda t, v: integer(t, v, minimum=1, maximum=MAX_BATCH_SIZE), "a positive integer")
    cpus = _checked(int, lambda t, v: integer(t, v, minimum=0, maximum=1024), "a number of logical CPUs")
    nbytes = _checked(_float, lambda t, v: integer(t, v, minimum=1, maximum=MAX_BYTES), "a number of bytes")

    def planning(sub: argparse.ArgumentParser, group_by: str, memory: str) -> None:
        sub.add_argument("--objective", default=PlanOptions.objective, choices=sorted(OBJECTIVES))
        sub.add_argument("--algorithm", default=PlanOptions.algorithm, choices=available_solvers())
        sub.add_argument("--time-limit", type=seconds, default=PlanOptions.time_limit_s,
                         help=f"search budget in seconds (default {PlanOptions.time_limit_s:g})")
        sub.add_argument("--seed", type=seed, default=PlanOptions.seed)
        sub.add_argument("--group-by", default=group_by, choices=sorted(GROUPINGS),
                         help=f"which nodes move together (default {group_by})")
        sub.add_argument("--memory", default=memory, choices=list(MEMORY_MODELS),
                         help=f"what must fit each device's memory: resident bytes or the step's simulated peak "
                         f"(default {memory})")
        sub.add_argument("-q", "--quiet", action="store_true", help="no progress output")
        sub.add_argument("-v", "--verbose", action="store_true", help="a traceback with internal errors")

    p = _Parser(prog="autoplace", description="Automatic model-parallel placement for Keras 3.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan = sub.add_parser("plan", help="place a saved Keras model and write a report")
    plan.add_argument("model", help="a .keras file (keras.saving.load_model)")
    plan.add_argument("--devices", nargs="+", required=True, help="e.g. /CPU:0 /CPU:1 or /GPU:0 /GPU:1")
    plan.add_argument("--logical-cpus", type=cpus, default=0,
                      help="split the CPU into N logical devices first (to plan on one machine)")
    plan.add_argument("--batch-size", type=count, default=None)
    plan.add_argument("--compression", default="none", choices=list(COMPRESSION_CHOICES),
                      help="codec of cut float edges; auto: per edge, the fastest within the error budget")
    plan.add_argument("--training", action="store_true",
                      help="place the training step (the model file must be saved compiled)")
    plan.add_argument("--replicas", type=count, default=1, help="with --training: data-parallel groups of devices")
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
    graph.add_argument("--memory-bytes", type=nbytes, default=None,
                       help="capacity of each device given with --devices (default: unlimited)")
    graph.add_argument("--out", default=None, help="write the plan (node → device, figures) as JSON here")
    planning(graph, PlanOptions.group_by, PlanOptions.memory)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``autoplace`` console script; returns the exit code (see the module docstring)."""
    from .errors import AutoplaceError

    try:
        args = _parser().parse_args(argv)
    except _UsageError as e:
        return _fail(str(e), 2)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="autoplace: %(message)s", stream=sys.stderr)
    try:
        return _plan_graph(args) if args.command == "plan-graph" else _plan_model(args)
    except AutoplaceError as e:
        return _fail(str(e), 2)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as e:  # noqa: BLE001  (anything else is our bug: say so in one line)
        if args.verbose:
            traceback.print_exc()
        return _fail(f"internal error ({type(e).__name__}: {e}); please report it with the command line"
                     + ("" if args.verbose else " and the output of --verbose"), 1)


def _fail(message: str, code: int) -> int:
    """Print ``autoplace: error: …`` as one line on stderr and return ``code``."""
    print("autoplace: error: " + " ".join(message.split()), file=sys.stderr)
    return code


def _plan_graph(args: argparse.Namespace) -> int:
    from .core.devices import DeviceSpec
    from .core.graph_io import load_graph
    from .core.outputs import check_output
    from .errors import DeviceError
    from .planner import solve

    if args.out:
        check_output(args.out, inputs=[args.graph])
    graph, devices = load_graph(args.graph)
    if args.devices:
        devices = [DeviceSpec(d, memory_bytes=args.memory_bytes) for d in args.devices]
    elif args.memory_bytes is not None:
        raise DeviceError("--memory-bytes applies to the devices given with --devices; pass them too")
    if devices is None:
        raise DeviceError(f"{args.graph} lists no devices; pass --devices")
    plan = solve(graph, devices, objective=args.objective, algorithm=args.algorithm,
                 time_limit_s=args.time_limit, seed=args.seed, group_by=args.group_by, memory=args.memory)
    if args.out:
        plan.save(args.out)
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


_OUTPUT_NAMES = {"report": "report", "plan": "plan", "graph": "op graph", "export": "SavedModel"}


def _check_outputs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(kind, path)`` of every output of ``plan``, each validated, none an input or another output."""
    from .core.outputs import REPORT_SUFFIXES, check_output
    from .errors import OutputError

    outputs = [("report", args.report), ("plan", args.plan_json), ("graph", args.graph_json),
               ("export", args.export)]
    outputs = [(kind, path) for kind, path in outputs if path]
    seen: dict[str, str] = {}
    for kind, path in outputs:
        check_output(path, directory=kind == "export", suffixes=REPORT_SUFFIXES if kind == "report" else (),
                     inputs=[args.model])
        real = os.path.realpath(path)
        if real in seen:
            raise OutputError(f"the {seen[real]} and the {kind} would both be written to {path!r}; give each "
                              "output its own path")
        seen[real] = kind
    return outputs


def _plan_model(args: argparse.Namespace) -> int:
    from .errors import ModelError

    outputs = _check_outputs(args)  # before any work: a bad path fails now, not after the solve
    if not os.path.isfile(args.model) and not os.path.isdir(args.model):
        raise ModelError(f"model file {args.model!r} does not exist")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # after argument parsing: logical devices must precede TF initialisation

    if args.logical_cpus:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus)
    import keras

    import placer

    try:
        model = keras.saving.load_model(args.model, compile=args.training)
    except Exception as e:  # noqa: BLE001  (keras raises many types; safe mode's refusal is one of them)
        raise ModelError(f"cannot load {args.model!r} as a Keras model: {e}") from e
    placed = placer.autoplace(model, args.devices, batch_size=args.batch_size, algorithm=args.algorithm,
                              time_limit_s=args.time_limit, compression=args.compression,
                              objective=args.objective, seed=args.seed, group_by=args.group_by,
                              memory=args.memory, training=args.training, replicas=args.replicas)
    write = {"export": placed.export, "plan": placed.plan.save, "graph": placed.save_graph, "report": placed.report}
    # the SavedModel first (the likeliest to fail: the largest), the report last; on a failure, the outputs
    # this run created are removed again (an output that replaced an older file stays replaced)
    order = sorted(outputs, key=lambda o: ("export", "plan", "graph", "report").index(o[0]))
    created: list[str] = []
    try:
        for kind, path in order:
            existed = os.path.exists(path)
            write[kind](path)
            if not existed:
                created.append(path)
    except BaseException:
        import shutil

        for path in created:
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
        raise
    print(placed.summary())
    for kind, path in outputs:
        print(f"{_OUTPUT_NAMES[kind]}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
