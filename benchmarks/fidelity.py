"""Simulator fidelity on two real TF gRPC workers: predicted vs measured step time.

Two worker processes on 127.0.0.1, each pinned to one core with one intra-
and one inter-op thread (genuine parallel execution with real transfers on
this 2-core machine). Per model:

1. trace the forward pass; profile every op *on worker 0* through a TF1
   session targeting it (so op times reflect the worker's one thread);
2. calibrate the links between the workers (transfers of 4 KiB .. 16 MiB,
   least-squares fit);
3. for each placement — single worker, round-robin, contiguous split, the
   solver's plan (``auto``, latency objective) and a deliberately bad plan
   (round-robin of individual ops) — simulate one step and measure it
   (median of ``--repeats`` runs of the emitted function after warm-up,
   placements interleaved run by run so that drift hits all alike).

Prints predicted vs measured per case, the median absolute error, the worst
case and each model's Spearman rank correlation; writes
``benchmarks/results/fidelity.md``. Runs itself inside a loopback-only
network namespace (``unshare -rn``) because TF's servers listen on all
interfaces; it exits with a message where that is not possible.

    python benchmarks/fidelity.py [--models resnet50 ...] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from placer.cluster import network_isolated  # noqa: E402

MODELS = ["multi_tower_mlp", "transformer", "resnet50", "inception_v3"]
#: Planning batch and input size per model (small enough for one core).
SETTINGS = {"multi_tower_mlp": dict(batch=32), "transformer": dict(batch=4), "resnet50": dict(batch=2, size=160),
            "inception_v3": dict(batch=2, size=160)}
PLACEMENTS = [("single", "layer", "single"), ("round_robin", "layer", "round_robin"),
              ("contiguous", "layer", "contiguous"), ("solver", "layer", "auto"), ("bad", "op", "round_robin")]


def spearman(a, b) -> float:
    import numpy as np

    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    import workloads

    from cost_models.profile import profile_graph
    from placer.cluster import LocalCluster
    from placer.coarsen import coarsen
    from placer.costs import sample_inputs
    from placer.devices import resolve_devices
    from placer.emit import emit
    from placer.links import (
        calibrate_links,
        call_interface,
        call_seconds,
        measure_transfer_cpu,
        stand_in,
    )
    from placer.opgraph import build_op_graph
    from placer.planning import build_problem, project, simulate_ops
    from placer.solvers import SolveOptions, solve_problem
    from placer.trace import trace_model

    lines: list[str] = []

    def out(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    rows = []
    mem_rows = []
    compute_notes: list[str] = []
    without_errs: list[float] = []
    # The BFC CPU allocator counts every allocation in its statistics; the default (oneDNN) CPU
    # allocator showed no growth for 128 KB tensors, which made its "peak" meaningless for small models.
    with LocalCluster(2, pin_cores=True, threads=1, env={"TF_CPU_ALLOCATOR_USE_BFC": "true"}) as cluster:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster.spec))
        names = [cluster.device(0), cluster.device(1)]
        devset, fits = calibrate_links(resolve_devices(names), repeats=5)
        cpu_s = np.mean([measure_transfer_cpu(a, b) for a, b in ((names[0], names[1]), (names[1], names[0]))])
        transfer_cpu = np.array([[0.0, cpu_s], [cpu_s, 0.0]])
        out("## Simulator fidelity: 2 TF gRPC workers, one pinned core and one thread each")
        out()
        for (i, j), f in sorted(fits.items()):
            out(f"- link worker {i} -> {j}: latency {f.link.latency_s * 1e3:.3f} ms, "
                f"bandwidth {f.link.bandwidth_bytes_per_s / 1e9:.3g} GB/s, R² {f.r2:.4f}, "
                f"max rel. error {100 * f.max_rel_error:.0f}% ({f.points} sizes)")
        out(f"- transfer CPU cost (fan-out of tiny tensors, mean of both directions): {cpu_s * 1e6:.1f} µs per "
            "tensor, charged on both workers")
        out(f"- ops profiled on worker 0 with Grappler {'on' if args.grappler else 'off'}")
        out("- predicted = simulated makespan (calibrated worker links and transfer CPU cost) + call: the measured "
            "time of a stand-in function with the placement's interface (same inputs fed from the client, outputs "
            "fetched, variables captured per worker, an op on every worker used; no compute), timed interleaved "
            "with the placements; 'without transfer CPU' is the same simulation without that cost")
        out()
        out("| model | placement | call ms | predicted ms | measured ms | error | without transfer CPU ms | error |")
        out("|---|---|---|---|---|---|---|---|")
        for name in args.models:
            cfg = SETTINGS[name]
            builder, _ = workloads.WORKLOADS[name]
            model = builder(cfg["size"]) if "size" in cfg else builder()
            traced = trace_model(model, batch_size=cfg["batch"])
            feeds = sample_inputs(traced, 0)
            gd = traced.fixed.graph.as_graph_def()
            prof = profile_graph(gd, feeds, {f"{ph}:0": v.value.numpy() for ph, v in traced.variables.items()},
                                 traced.output_names,
                                 constants={f"{ph}:0": t.numpy() for ph, t in traced.constants.items()},
                                 device=names[0], repeats=args.profile_repeats,
                                 target=f"grpc://{cluster.spec['worker'][0]}", grappler=args.grappler,
                                 measure_step=True)
            og = build_op_graph(traced, {"CPU": prof.median_us})
            ran = sum(1 for v in prof.median_us.values() if v > 0)
            compute_notes.append(
                f"- {name}: {ran} ops ran; sum of op medians {prof.op_sum_s * 1e3:.2f} ms; untraced step of the "
                f"profiled graph (Grappler {'on' if args.grappler else 'off'}) on worker 0 {prof.step_s * 1e3:.2f} ms; "
                f"difference {(prof.step_s - prof.op_sum_s) / max(ran, 1) * 1e6:.1f} µs per op")
            inputs = [tf.constant(v) for v in feeds.values()]
            model_rows = []
            single = {op: names[0] for op in og.graph}
            resident = sum(og.graph.nodes[op]["memory_bytes"] for op in og.graph)
            mem_pred = float(simulate_ops(og, devset, single).peak_memory_bytes[0]) - resident
            if prof.activation_peak_bytes:
                mem_err = (mem_pred - prof.activation_peak_bytes) / prof.activation_peak_bytes
                mem_rows.append((name, mem_pred, prof.activation_peak_bytes, mem_err))
            plans = []
            for label, group_by, algorithm in PLACEMENTS:
                coarse = coarsen(og, group_by)
                problem = build_problem(coarse, devset, og)
                sol = solve_problem(problem, algorithm, SolveOptions(time_limit_s=5, objective="latency"))
                op_devices = project(coarse, sol.assignment, devset)
                sim = simulate_ops(og, devset, op_devices, transfer_cpu).step_time_s
                without = simulate_ops(og, devset, op_devices).step_time_s
                fn = emit(traced, op_devices).function
                call = stand_in(call_interface(traced, op_devices))
                step = lambda fn=fn: fn(*inputs)  # noqa: E731
                for _ in range(2):  # warm-up
                    call_seconds(step), call_seconds(call)
                plans.append((label, sim, without, step, call, [], []))
            for _ in range(args.repeats):  # interleaved, so that drift hits every placement alike
                for _, _, _, step, call, times, call_times in plans:
                    times.append(call_seconds(step))
                    call_times.append(call_seconds(call))
            for label, sim, without, _, _, times, call_times in plans:
                measured = float(np.median(times))
                call_s = float(np.median(call_times))
                predicted, without = sim + call_s, without + call_s
                err = (predicted - measured) / measured
                model_rows.append((label, predicted, measured, err, without))
                without_errs.append((without - measured) / measured)
                out(f"| {name} | {label} | {call_s * 1e3:.2f} | {predicted * 1e3:.2f} | {measured * 1e3:.2f} | "
                    f"{100 * err:+.1f}% | {without * 1e3:.2f} | {100 * (without - measured) / measured:+.1f}% |")
            rho = spearman([r[1] for r in model_rows], [r[2] for r in model_rows])
            rho_without = spearman([r[4] for r in model_rows], [r[2] for r in model_rows])
            rows.extend((name, *r[:4], rho) for r in model_rows)
            out(f"| {name} | Spearman ρ (predicted vs measured order) | | | | {rho:.2f} | | {rho_without:.2f} |")
    errs = np.abs([r[4] for r in rows])
    worst = max(rows, key=lambda r: abs(r[4]))
    out()
    out(f"Median absolute error {100 * np.median(errs):.1f}% over {len(rows)} cases; worst {100 * worst[4]:+.1f}% "
        f"({worst[0]}, {worst[1]}). Spearman per model: "
        + ", ".join(f"{m} {r[5]:.2f}" for m in args.models for r in rows if r[0] == m and r[1] == "single")
        + f". Without the transfer CPU cost: median absolute error {100 * np.median(np.abs(without_errs)):.1f}%.")
    out()
    out("Compute check (not used in the predictions):")
    out()
    for line in compute_notes:
        out(line)
    out()
    out("Memory: activation peak of one step on worker 0 (simulated live tensors vs TF allocator: "
        "highest minus lowest bytes in use during the profiled step)")
    out()
    out("| model | predicted MB | allocator MB | error |")
    out("|---|---|---|---|")
    for name, pred, meas, err in mem_rows:
        out(f"| {name} | {pred / 1e6:.2f} | {meas / 1e6:.2f} | {100 * err:+.1f}% |")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"written: {path}", file=sys.stderr)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--repeats", type=int, default=9, help="measured runs per placement")
    ap.add_argument("--profile-repeats", type=int, default=7, help="profiled runs per op")
    ap.add_argument("--no-grappler", dest="grappler", action="store_false", help="profile ops with Grappler off "
                    "(every traced op timed on its own) instead of on, as the placed function runs")
    ap.add_argument("--out", default=str(HERE / "results" / "fidelity.md"))
    args = ap.parse_args()
    if not network_isolated():
        if not (shutil.which("unshare") and shutil.which("ip")):
            print("skipped: needs `unshare -rn` and `ip` to keep the gRPC workers on loopback")
            return 0
        cmd = ["unshare", "-rn", "sh", "-c",
               "ip link set lo up && exec \"$0\" \"$@\"", sys.executable, *sys.argv]
        return subprocess.call(cmd)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
