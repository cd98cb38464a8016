"""Command line: offline planning, profiling, export and reports.

* ``autoplace plan MODEL.keras --devices …``: trace, profile and place a saved
  Keras model; write a report (``.json``, ``.html`` or ``.trace.json``) and
  optionally the plan, the op graph and a placed SavedModel.
* ``autoplace profile MODEL.keras --devices …``: time the model's ops on
  each device kind (filling the cost cache) and print what was measured.
* ``autoplace export MODEL.keras OUT --devices … [--plan plan.json]``: a
  placed SavedModel; with a plan, no re-solve.
* ``autoplace report REPORT_OR_PLAN.json --out report.html``: re-render a
  report offline (no TensorFlow).
* ``autoplace plan-graph GRAPH.json [--devices …]``: place a cost-annotated
  graph file (``docs/graph-format.md``) without TensorFlow.

Output for people goes through this module (stdout); the library only logs.
Progress: a bar on a terminal, plain log lines otherwise, none with
``--quiet``. Models load in Keras' safe mode; ``--unsafe-deserialization``
opts out for files you trust (Lambda layers and other Python code).

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
from typing import Any, Callable, Mapping, NoReturn, Sequence

from cost_models.cache import default_cache_dir

from .core.build import GROUPINGS, MODEL_GROUP_BY
from .core.compression import COMPRESSION_CHOICES, GRADIENT_COMPRESSION_CHOICES
from .core.devices import DeviceSpec
from .core.graph_io import load_graph
from .core.objectives import OBJECTIVES
from .core.order import EXECUTION_ORDERS, MODEL_EXECUTION_ORDER
from .core.outputs import REPORT_SUFFIXES, check_output
from .core.plan import Plan
from .core.splits import SPLITS
from .core.validate import MAX_BATCH_SIZE, MAX_BYTES, MAX_SEED, MAX_TIME_LIMIT_S, integer, real
from .errors import AutoplaceError, DeviceError, ModelError, OutputError
from .planner import MEMORY_MODELS, MODEL_MEMORY, PlanOptions, solve
from .reporting import load_report, write_report
from .solvers import available_solvers

#: Why the model commands import the TensorFlow back end inside their functions.
_LAZY_TF = "TensorFlow must not start before --logical-cpus is applied, and plan-graph and report never need it"


class _UsageError(Exception):
    """A bad command line (argparse's complaint), reported in one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see {self.prog} --help)")


def _checked(convert: Callable[[str], Any], check: Callable[[str, Any], Any], what: str) -> Callable[[str], Any]:
    """An argparse ``type``: ``convert`` the text, then validate it with :mod:`placer.core.validate`."""
    def parse(text: str) -> Any:

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
    # Choices and defaults come from the registries and option dataclasses (TensorFlow-free modules).

    seconds = _checked(_float, lambda t, v: real(t, v, strict=True, maximum=MAX_TIME_LIMIT_S),
                       "a finite number of seconds")
    seed = _checked(int, lambda t, v: integer(t, v, maximum=MAX_SEED), "an integer")
    count = _checked(int, lambda t, v: integer(t, v, minimum=1, maximum=MAX_BATCH_SIZE), "a positive integer")
    cpus = _checked(int, lambda t, v: integer(t, v, minimum=0, maximum=1024), "a number of logical CPUs")
    nbytes = _checked(_float, lambda t, v: integer(t, v, minimum=1, maximum=MAX_BYTES), "a number of bytes")

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("-q", "--quiet", action="store_true", help="no progress output")
        sub.add_argument("-v", "--verbose", action="store_true", help="log every step; a traceback with internal errors")

    def planning(sub: argparse.ArgumentParser, group_by: str | None, memory: str | None,
                 execution_order: str | None, from_file: bool = False) -> None:
        # from_file (plan-graph): a flag not given takes the graph file's plan options, else the library's
        def default(value: Any) -> Any:
            return None if from_file else value

        also = "; default: the file's plan options, else " if from_file else "; default "
        sub.add_argument("--objective", default=default(PlanOptions.objective), choices=sorted(OBJECTIVES),
                         help=f"what to minimise{also}{PlanOptions.objective}")
        sub.add_argument("--algorithm", default=default(PlanOptions.algorithm), choices=available_solvers(),
                         help=f"the solver{also}{PlanOptions.algorithm}")
        sub.add_argument("--time-limit", type=seconds, default=default(PlanOptions.time_limit_s),
                         help=f"search budget in seconds{also}{PlanOptions.time_limit_s:g}")
        sub.add_argument("--seed", type=seed, default=default(PlanOptions.seed), help=f"the seed{also}{PlanOptions.seed}")
        sub.add_argument("--group-by", default=default(group_by), choices=sorted(GROUPINGS),
                         help=f"which nodes move together{also}{group_by}")
        sub.add_argument("--memory", default=default(memory), choices=list(MEMORY_MODELS),
                         help=f"what must fit each device's memory: resident bytes or the step's simulated peak"
                         f"{also}{memory}")
        sub.add_argument("--execution-order", default=default(execution_order), choices=list(EXECUTION_ORDERS),
                         help="auto: a plan may fix the order each device runs its ops in, where predicted "
                         "faster; executor: TensorFlow's executor orders them; simulated (placing a model): "
                         "searched as executor, then on one-thread workers a one-copy plan keeps the order its "
                         f"simulation ran its ops in{also}{execution_order}")
        common(sub)

    def model(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("model", help="a .keras (or .h5) file saved by model.save (keras.saving.load_model, safe mode)")
        sub.add_argument("--devices", nargs="+", required=True, help="e.g. /CPU:0 /CPU:1 or /GPU:0 /GPU:1")
        sub.add_argument("--logical-cpus", type=cpus, default=0,
                         help="split the CPU into N logical devices first (to plan on one machine)")
        sub.add_argument("--batch-size", type=count, default=None)
        sub.add_argument("--training", action="store_true",
                         help="the training step (the model file must be saved compiled)")
        sub.add_argument("--unsafe-deserialization", action="store_true",
                         help="load a model file that holds Python code (Lambda layers): only for files you trust")

    p = _Parser(prog="autoplace", description="Automatic model-parallel placement for Keras 3.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan = sub.add_parser("plan", help="place a saved Keras model and write a report",
                          description="Trace, profile and place a saved Keras model; write a report.")
    model(plan)
    plan.add_argument("--compression", default="none", choices=list(COMPRESSION_CHOICES),
                      help="codec of cut float edges; auto: per edge, the fastest within the error budget")
    plan.add_argument("--gradient-compression", default="none", choices=list(GRADIENT_COMPRESSION_CHOICES),
                      help="with --training: codec of the weights sent to copies and the gradients sent to their "
                      "sum or update (never touched by --compression); auto: bf16 where it sends faster")
    plan.add_argument("--replicas", type=lambda v: v if v == "auto" else count(v), default="auto",
                      help="data parallelism: 'auto' (default: for inference, a copy of the model per device where "
                      "predicted faster), or R copies (inference: one per device; --training: R groups of devices)")
    plan.add_argument("--split-batch-norm", action="store_true",
                      help="with --training: let batch normalization run per micro-batch or replica (GPipe's "
                      "semantics, a change of the math); default: such models train whole")
    plan.add_argument("--splits", default="auto", choices=list(SPLITS),
                      help="operator splitting: 'auto' (default: for inference, large dense products split by output "
                      "columns over the devices where predicted faster), 'none' or 'all'")
    plan.add_argument("--report", default="autoplace_report.json",
                      help="report path: .json (data), .html (a page to read) or .trace.json (Perfetto)")
    plan.add_argument("--export", default=None, help="also write a SavedModel of the placed model here")
    plan.add_argument("--measure", type=count, default=None, metavar="RUNS", nargs="?", const=20,
                      help="also time the placed model against the original on a random batch, interleaved "
                      "(RUNS each, default 20, more until --measure-seconds have passed): measured step times "
                      "and speedup go into the summary and report")
    plan.add_argument("--measure-seconds", type=float, default=None, metavar="S",
                      help="with --measure: keep timing past RUNS until the runs took S seconds (default: "
                      "placed.measure's, 1 s; 0: exactly RUNS)")
    plan.add_argument("--plan-json", default=None, help="also write the plan (op → device) as JSON here")
    plan.add_argument("--graph-json", default=None, help="also write the cost-annotated op graph here "
                      "(re-plan it offline with plan-graph)")
    planning(plan, MODEL_GROUP_BY, MODEL_MEMORY, MODEL_EXECUTION_ORDER)

    prof = sub.add_parser("profile", help="time a model's ops on each device kind (fills the cost cache)",
                          description="Trace a saved Keras model and time its ops on the devices' kinds; the "
                          "times go to the profile cache, where plan and export find them.")
    model(prof)
    prof.add_argument("--repeats", type=count, default=None, help="timed runs per op (default: the library's, 5)")
    prof.add_argument("--top", type=count, default=10, help="list this many of the slowest ops")
    common(prof)

    export = sub.add_parser("export", help="write a placed SavedModel of a saved Keras model",
                            description="Place a saved Keras model (or re-apply --plan, without solving) and write "
                            "a SavedModel that keeps every op's device; placer.load re-maps it onto other devices.")
    model(export)
    export.add_argument("out", nargs="?", default=None,
                        help="the SavedModel directory to create (must not exist or be empty); it may also come "
                        "last, after the devices")
    export.add_argument("--plan", default=None, help="a plan JSON of this model (plan --plan-json): no re-solve")
    export.add_argument("--compression", default="none", choices=list(COMPRESSION_CHOICES))
    planning(export, MODEL_GROUP_BY, MODEL_MEMORY, MODEL_EXECUTION_ORDER)

    report = sub.add_parser("report", help="re-render a report or plan JSON as HTML (no TensorFlow)",
                            description="Render a report JSON (or a plan JSON: devices and baselines only) as a "
                            "self-contained HTML page, or as Chrome trace events.")
    report.add_argument("input", help="a report JSON (placed.report / plan --report) or a plan JSON")
    report.add_argument("--out", required=True, help="output: .html, .trace.json or .json")
    common(report)

    graph = sub.add_parser("plan-graph", help="place a graph JSON file (no TensorFlow needed)",
                           description="Place a cost-annotated graph file (docs/graph-format.md).")
    graph.add_argument("graph", help="an autoplace graph file (docs/graph-format.md)")
    graph.add_argument("--devices", nargs="+", default=None,
                       help="device names; default: the devices in the file")
    graph.add_argument("--memory-bytes", type=nbytes, default=None,
                       help="capacity of each device given with --devices (default: unlimited)")
    graph.add_argument("--memory-pool-bytes", type=nbytes, default=None,
                       help="the cap of each device's allocator pool (TensorFlow's BFC allocator, replayed: "
                            "docs/costs.md#memory), for the devices given with --devices (default: not replayed)")
    graph.add_argument("--out", default=None, help="write the plan (node → device, figures) as JSON here")
    planning(graph, PlanOptions.group_by, PlanOptions.memory, PlanOptions.execution_order, from_file=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``autoplace`` console script; returns the exit code (see the module docstring)."""

    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and args.command == "export" and args.out is None and len(extra) == 1 and extra[0][:1] != "-":
            args.out, extra = extra[0], []  # OUT after the options: `export MODEL --devices … OUT`
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except _UsageError as e:
        return _fail(str(e), 2)
    bar = _Progress.for_terminal() if not args.quiet and not args.verbose else None
    logging.basicConfig(level=logging.WARNING if args.quiet or bar is not None else logging.INFO,
                        format="autoplace: %(message)s", stream=sys.stderr)
    commands = {"plan": _plan_model, "profile": _profile, "export": _export, "report": _report,
                "plan-graph": _plan_graph}
    try:
        return commands[args.command](args, bar)
    except AutoplaceError as e:
        return _fail(str(e), 2, bar)
    except KeyboardInterrupt:
        return _fail("interrupted", 130, bar)
    except Exception as e:  # noqa: BLE001  (anything else is our bug: say so in one line)
        if bar is not None:
            bar.close()
        if args.verbose:
            traceback.print_exc()
        return _fail(f"internal error ({type(e).__name__}: {e}); please report it with the command line"
                     + ("" if args.verbose else " and the output of --verbose"), 1)


def _fail(message: str, code: int, bar: "_Progress | None" = None) -> int:
    """Print ``autoplace: error: …`` as one line on stderr and return ``code``."""
    if bar is not None:
        bar.close()
    print("autoplace: error: " + " ".join(message.split()), file=sys.stderr)
    return code


class _Progress:
    """A progress bar (tqdm, on stderr) over the pipeline's stages: ``PlacementOptions.progress``."""

    def __init__(self) -> None:
        self._bar: Any = None

    @classmethod
    def for_terminal(cls) -> "_Progress | None":
        """A bar when stderr is a terminal; else ``None`` (log lines are the progress output)."""
        return cls() if sys.stderr.isatty() else None

    def start(self, stages: int) -> "_Progress":
        """Draw a bar of ``stages`` stages from now on."""
        import shutil

        from tqdm import tqdm

        self.close()
        size = shutil.get_terminal_size((100, 24))  # a terminal of unknown size (0 columns): 100 × 24
        self._bar = tqdm(total=stages, file=sys.stderr, unit="stage", leave=False, ncols=size.columns,
                         nrows=size.lines,
                         bar_format="autoplace: {desc} {bar} {n_fmt}/{total_fmt} stages [{elapsed}]")
        return self

    def __call__(self, stage: str, seconds: float | None) -> None:
        if seconds is None:
            self._bar.set_description_str(f"{stage}…")
        else:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _plan_graph(args: argparse.Namespace, bar: _Progress | None = None) -> int:

    if args.out:
        check_output(args.out, inputs=[args.graph])
    graph, devices = load_graph(args.graph)
    if args.devices:
        devices = [DeviceSpec(d, memory_bytes=args.memory_bytes, memory_pool_bytes=args.memory_pool_bytes)
                   for d in args.devices]
    elif args.memory_bytes is not None or args.memory_pool_bytes is not None:
        raise DeviceError("--memory-bytes and --memory-pool-bytes apply to the devices given with --devices; "
                          "pass them too")
    if devices is None:
        raise DeviceError(f"{args.graph} lists no devices; pass --devices")
    given = {"objective": args.objective, "algorithm": args.algorithm, "time_limit_s": args.time_limit,
             "seed": args.seed, "group_by": args.group_by, "memory": args.memory,
             "execution_order": args.execution_order}
    plan = solve(graph, devices, **{k: v for k, v in given.items() if v is not None})  # the rest: the file's
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


def _check_outputs(outputs: Sequence[tuple[str, str | None]], inputs: Sequence[str]) -> list[tuple[str, str]]:
    """``(kind, path)`` of every output given, each validated, none an input or another output."""

    given = [(kind, path) for kind, path in outputs if path]
    seen: dict[str, str] = {}
    for kind, path in given:
        check_output(path, directory=kind == "export", suffixes=REPORT_SUFFIXES if kind == "report" else (),
                     inputs=[i for i in inputs if i])
        real = os.path.realpath(path)
        if real in seen:
            raise OutputError(f"the {seen[real]} and the {kind} would both be written to {path!r}; give each "
                              "output its own path")
        seen[real] = kind
    return given


def _load_model(args: argparse.Namespace) -> Any:
    """Import TensorFlow (after ``--logical-cpus`` is applied) and load ``args.model`` in Keras' safe mode."""

    path = args.model
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "assets.extra", "autoplace", "manifest.json")):
            raise ModelError(f"{path!r} is a placed SavedModel written by autoplace; serve it with "
                             "tf.saved_model.load, or re-map it onto other devices with placer.load(path, devices=…)")
        raise ModelError(f"{path!r} is a directory; autoplace reads Keras model files: save the model with "
                         "model.save('model.keras') and pass that file (SavedModel directories are not supported "
                         "as input yet)")
    if not os.path.isfile(path):
        raise ModelError(f"model file {path!r} does not exist")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if args.logical_cpus:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus)
    import keras

    try:
        return keras.saving.load_model(path, compile=args.training, safe_mode=not args.unsafe_deserialization)
    except Exception as e:  # noqa: BLE001  (keras raises many types; safe mode's refusal is one of them)
        text = " ".join(str(e).split())
        if "safe_mode" in text or "unsafe" in text.lower():
            raise ModelError(f"{path!r} holds Python code (e.g. a Lambda layer), which Keras' safe mode refuses "
                             "to load; if you trust the file, pass --unsafe-deserialization") from e
        raise ModelError(f"cannot load {path!r} as a Keras model (a .keras or .h5 file saved by model.save): "
                         f"{text[:300]}") from e


def _placement_options(args: argparse.Namespace, bar: _Progress | None, stages: int) -> dict[str, Any]:
    """The ``autoplace`` keyword arguments of a model command."""
    kw = {"batch_size": args.batch_size, "training": args.training,
          "progress": bar.start(stages) if bar is not None else None}
    for name in ("algorithm", "objective", "seed", "group_by", "memory", "execution_order", "compression", "replicas",
                 "splits", "split_batch_norm", "gradient_compression"):
        if hasattr(args, name):
            kw[name] = getattr(args, name)
    if hasattr(args, "time_limit"):
        kw["time_limit_s"] = args.time_limit
    return kw


def _write_all(outputs: Sequence[tuple[str, str]], write: Mapping[str, Callable[[str], Any]]) -> None:
    """Write each output: the SavedModel first (the largest, likeliest to fail), the report last. On a failure,
    the outputs this run created are removed again (an output that replaced an older file stays replaced)."""
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


def _plan_model(args: argparse.Namespace, bar: _Progress | None = None) -> int:
    outputs = _check_outputs([("report", args.report), ("plan", args.plan_json), ("graph", args.graph_json),
                              ("export", args.export)], [args.model])  # before any work: fail now, not after
    model = _load_model(args)
    from .tf.runner import STAGES, autoplace  # lazy: see _LAZY_TF

    placed = autoplace(model, args.devices, **_placement_options(args, bar, len(STAGES)))
    if bar is not None:
        bar.close()
    if args.measure:
        placed.measure(repeats=args.measure,
                       **({} if args.measure_seconds is None else {"min_time_s": args.measure_seconds}))
    _write_all(outputs, {"export": placed.export, "plan": placed.plan.save, "graph": placed.save_graph,
                         "report": placed.report})
    print(placed.summary())
    for kind, path in outputs:
        print(f"{_OUTPUT_NAMES[kind]}: {path}")
    return 0


def _export(args: argparse.Namespace, bar: _Progress | None = None) -> int:

    if args.out is None and len(args.devices) > 1 and ":" not in args.devices[-1]:  # `--devices A B OUT`
        args.out = args.devices.pop()
    if args.out is None:
        raise AutoplaceError("give the SavedModel directory to write: autoplace export MODEL OUT --devices …")
    _check_outputs([("export", args.out)], [args.model, args.plan])

    given = Plan.load(args.plan) if args.plan else None  # a bad plan file fails before the model loads
    model = _load_model(args)
    from .tf.runner import STAGES, autoplace  # lazy: see _LAZY_TF

    kw = _placement_options(args, bar, len(STAGES))
    if given is not None:
        kw = {k: v for k, v in kw.items() if k not in ("objective", "group_by")}  # the plan's own
    placed = autoplace(model, args.devices, plan=given, **kw)
    if bar is not None:
        bar.close()
    placed.export(args.out)
    print(placed.summary())
    print(f"SavedModel: {args.out}" + (f" (plan re-applied from {args.plan}, not re-solved)" if given else ""))
    return 0


def _profile(args: argparse.Namespace, bar: _Progress | None = None) -> int:
    model = _load_model(args)
    from .tf.runner import PROFILE_STAGES, profile  # lazy: see _LAZY_TF

    kw = _placement_options(args, bar, len(PROFILE_STAGES))
    if args.repeats is not None:
        kw["profile_repeats"] = args.repeats
    prof = profile(model, args.devices, **kw)
    if bar is not None:
        bar.close()
    print(f"profiled the {prof.step} step of {model.name} at batch {prof.batch_size}: "
          f"{len(prof.op_types)} ops")
    for kind, times in prof.costs.us.items():
        total = sum(times.values())
        print(f"{kind}: {prof.costs.source[kind]}, {len(times)} ops, {total / 1e3:.3f} ms of op time per step")
        slowest = sorted(times.items(), key=lambda kv: -kv[1])[:args.top]
        for op, us in slowest:
            print(f"  {us:10.1f} µs  {prof.op_types.get(op, '?'):<22} {op}")
    print(f"cache: {default_cache_dir()} (plan and export with the same model, batch and devices read it)")
    return 0


def _report(args: argparse.Namespace, bar: _Progress | None = None) -> int:

    _check_outputs([("report", args.out)], [args.input])
    data = load_report(args.input)
    write_report(data, args.out)
    print(f"report ({data.get('source', 'placement')}): {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
