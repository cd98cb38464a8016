"""Simulator fidelity on two real TF gRPC workers: predicted vs measured step time.

Two worker processes on 127.0.0.1, each pinned to one core with one intra-
and one inter-op thread (genuine parallel execution with real transfers on
this 2-core machine). Links (transfers of 4 KiB .. 16 MiB, least-squares fit)
and the CPU cost of a transfer are calibrated once. Per model:

1. trace the forward pass; profile every op *on worker 0* through a TF1
   session targeting it (so op times reflect the worker's one thread) and
   plan the placements from that profile: single worker, round-robin,
   contiguous split, the solver's plan (``auto``, latency objective) and a
   deliberately bad plan (round-robin of individual ops);
2. run ``--repeats`` rounds, each of: one profiling round on each worker
   (traced step, untraced step, fixed cost), then every placement's emitted
   function once and its stand-in call ``--call-repeats`` times. The
   machine's speed drifts (per core, for seconds at a time), so the op times
   behind the predictions come from these interleaved rounds;
3. predict each placement: the simulated makespan (worker 0's calibrated op
   times, worker 1's scaled by the ratio of the two workers' untraced steps)
   plus the median stand-in call; compare with the median measured step.

Prints predicted vs measured per case, the median absolute error, the worst
case, each model's Spearman rank correlation and how many of the pairs of
placements that a sign test over the rounds tells apart the prediction
orders rightly; writes
``benchmarks/results/fidelity.md``. Runs itself inside a loopback-only
network namespace (``unshare -rn``) because TF's servers listen on all
interfaces; it exits with a message where that is not possible.

    python benchmarks/fidelity.py [--models resnet50 ...] [--repeats 25] [--sends executor prompt] [--dump raw.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from isolation import isolated  # noqa: E402
from markdown import MarkdownOut  # noqa: E402

MODELS = ["multi_tower_mlp", "transformer", "resnet50", "inception_v3"]
#: Planning batch and input size per model (small enough for one core).
SETTINGS = {"multi_tower_mlp": dict(batch=32), "transformer": dict(batch=4), "resnet50": dict(batch=2, size=160),
            "inception_v3": dict(batch=2, size=160)}
PLACEMENTS = [("single", "layer", "single"), ("round_robin", "layer", "round_robin"),
              ("contiguous", "layer", "contiguous"), ("solver", "layer", "auto"), ("bad", "op", "round_robin")]


def spearman(a, b) -> float:
    """Spearman's ρ: Pearson's correlation of the ranks (tied values share their average rank)."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    ranks = np.argsort(np.argsort(x)).astype(float)
    for v in np.unique(x):
        idx = np.flatnonzero(x == v)
        ranks[idx] = ranks[idx].mean()
    return ranks


def sign_test_p(diffs) -> float:
    """Two-sided sign test: how likely paired differences this lopsided are if neither side is faster."""
    pos, neg = int(np.sum(np.asarray(diffs) > 0)), int(np.sum(np.asarray(diffs) < 0))
    n, k = pos + neg, min(pos, neg)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def ordered_pairs(predicted, samples: list[list[float]], alpha: float = 0.05) -> tuple[int, int]:
    """Pairs of placements the measurement tells apart, and how many of them the prediction orders rightly.

    ``samples[i][r]`` is placement i's time in interleaved round r; two
    placements are told apart when a sign test over their paired
    differences (one per round) shows one faster at level ``alpha``.
    """
    right = total = 0
    for i in range(len(samples)):
        for j in range(i + 1, len(samples)):
            diffs = np.subtract(samples[i], samples[j])
            if sign_test_p(diffs) <= alpha:
                total += 1
                right += int((np.median(diffs) < 0) == (predicted[i] < predicted[j]))
    return right, total


def split_half(samples: list[list[float]], splits: int = 1000, seed: int = 0) -> tuple[float, float]:
    """How well the measurement reproduces its own order: the ceiling for any prediction's Spearman.

    ``samples[i][r]`` is placement i's time in round r. The rounds are split
    at random into two halves ``splits`` times; returns the median Spearman
    ρ between the two halves' per-placement medians and the fraction of
    splits in which it is at least 0.9.
    """
    t = np.asarray(samples, float)
    n = t.shape[1]
    rng = np.random.default_rng(seed)
    rhos = []
    for _ in range(splits):
        perm = rng.permutation(n)
        a, b = perm[: n // 2], perm[n // 2: 2 * (n // 2)]
        rhos.append(spearman(np.median(t[:, a], axis=1), np.median(t[:, b], axis=1)))
    rhos = np.asarray(rhos)
    return float(np.nanmedian(rhos)), float(np.mean(rhos >= 0.9 - 1e-9))  # ρ = 0.9 exactly counts


def placed_variables(traced, op_devices, default: str) -> dict:
    """A copy of each captured variable, created on the device its placeholder is planned on."""
    import tensorflow as tf

    out = {}
    for ph, var in traced.variables.items():
        with tf.device(op_devices.get(ph, default)):
            out[ph] = tf.Variable(var.value.read_value(), trainable=var.trainable)
    return out


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # LocalCluster pins worker i to core i; on a machine with more cores the client (this process)
    # keeps off them, so that only the workers' own threads run there (before TF sizes its thread pools)
    client_cores = sorted(os.sched_getaffinity(0) - {0, 1})
    if client_cores:
        os.sched_setaffinity(0, client_cores)
    import tensorflow as tf
    import workloads

    from cost_models.profile import GraphProfiler
    from cost_models import SimOptions
    from placer.core.build import build_problem
    from placer.core.devices import resolve_devices
    from placer.measure.cluster import LocalCluster
    from placer.tf.costs import sample_inputs
    from placer.core.attrs import COMPUTE_US
    from placer.tf.emit import emit, rewrite_context
    from placer.tf.rewrites import SendRule
    from placer.tf.rewrites.sends import acknowledged_nodes
    from placer.tf.timing import call_interface
    from placer.measure.links import (
        calibrate_links,
        call_seconds,
        stand_in,
    )
    from placer.tf.opgraph import build_op_graph
    from placer.solvers import SolveOptions, solve_problem
    from placer.tf.trace import trace_model

    out = MarkdownOut()

    rows = []
    mem_rows = []
    half_rows: list[tuple[str, float, float]] = []
    dump: dict = {}
    compute_notes: list[str] = []
    same_speed_errs: list[float] = []
    # The BFC CPU allocator counts every allocation in its statistics; the default (oneDNN) CPU
    # allocator showed no growth for 128 KB tensors, which made its "peak" meaningless for small models.
    with LocalCluster(2, pin_cores=True, threads=1, env={"TF_CPU_ALLOCATOR_USE_BFC": "true"}) as cluster:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster.spec))
        names = [cluster.device(0), cluster.device(1)]
        # the transfer CPU cost goes into the links, as autoplace measures them, so that the solver plans
        # with it too (before 2026-12-03 only the predictions had it: the solver's plans of ResNet50 and
        # InceptionV3 were then predicted and measured slower than one worker)
        devset, fits = calibrate_links(resolve_devices(names), repeats=5, transfer_cpu=True)
        # ... and so does the ready order of these one-thread workers (a plan of InceptionV3 made under
        # "fifo" simulated 69.0 ms there and 90.6 ms under "lifo", measured 118 ms against one worker's 107)
        devset = replace(devset, ready_order=args.ready_order)
        transfer_cpu = devset.transfer_cpu()
        cpu_s = float(transfer_cpu[0, 1]) if transfer_cpu is not None else 0.0
        out("## Simulator fidelity: 2 TF gRPC workers, one pinned core and one thread each")
        out()
        for (i, j), f in sorted(fits.items()):
            out(f"- link worker {i} -> {j}: latency {f.link.latency_s * 1e3:.3f} ms, "
                f"bandwidth {f.link.bandwidth_bytes_per_s / 1e9:.3g} GB/s, R² {f.r2:.4f}, "
                f"max rel. error {100 * f.max_rel_error:.0f}% ({f.points} sizes)")
        out(f"- transfer CPU cost (fan-out of tiny tensors, mean of both directions): {cpu_s * 1e6:.1f} µs per "
            "tensor, charged on both workers")
        out(f"- the client (this process) runs on cores {client_cores}, off the workers' cores 0 and 1" if client_cores
            else "- the client (this process) shares cores 0 and 1 with the workers (a 2-core machine)")
        out(f"- ops profiled on worker 0 with Grappler {'on' if args.grappler else 'off'}; the whole graph also on "
            "worker 1, whose ops are simulated at worker 0's times × the ratio of the two workers' steps")
        out("- predicted = simulated makespan (calibrated worker links and transfer CPU cost) + call: the measured "
            "time of a stand-in function with the placement's interface (same inputs fed from the client, outputs "
            "fetched, variables captured per worker, an op on every worker used; no compute), timed interleaved "
            "with the placements")
        out("- op times: median kernel times from the step stats of traced runs plus the executor's per-op overhead "
            "(untraced step − its fixed cost − Σ kernel times, spread over the ops that ran; "
            "`OpProfile.calibrated_us`), profiled in rounds interleaved with the measurements; "
            "'same speed' is the same simulation with worker 1 taken to be as fast as worker 0")
        out()
        out("| model | placement | call ms | predicted ms | measured ms | error | same speed ms | error |")
        out("|---|---|---|---|---|---|---|---|")
        for name in args.models:
            cfg = SETTINGS[name]
            builder, _ = workloads.WORKLOADS[name]
            model = builder(cfg["size"]) if "size" in cfg else builder()
            traced = trace_model(model, batch_size=cfg["batch"])
            feeds = sample_inputs(traced, 0)
            inputs = [tf.constant(v) for v in feeds.values()]
            profilers = [GraphProfiler(
                traced.fixed.graph.as_graph_def(), feeds,
                {f"{ph}:0": v.value.numpy() for ph, v in traced.variables.items()}, traced.output_names,
                constants={f"{ph}:0": t.numpy() for ph, t in traced.constants.items()}, device=names[w],
                target=f"grpc://{cluster.spec['worker'][w]}", grappler=args.grappler, measure_step=True)
                for w in range(2)]
            with profilers[0] as profiler, profilers[1] as other:
                for _ in range(args.profile_repeats):
                    profiler.round()
                first = profiler.result()  # what the plans are made from; also the memory check
                og = build_op_graph(traced, {"CPU": first.calibrated_us()})
                plans = []
                seconds = {v: og.graph.nodes[v][COMPUTE_US]["CPU"] * 1e-6 for v in og.graph}
                sends_of = {}  # placement label -> what its emitted step acknowledges
                for label, group_by, algorithm in PLACEMENTS:
                    built = build_problem(og.graph, devset, group_by=group_by)
                    sol = solve_problem(built.problem, algorithm, SolveOptions(time_limit_s=5, objective="latency"))
                    op_devices = built.node_devices(sol.assignment)
                    for sends in args.sends:
                        rule = SendRule(seconds=lambda v: seconds.get(v, 0.0)) if sends == "prompt" else None
                        emitted = emit(traced, placed_variables(traced, op_devices, names[0]),
                                       rewrite_context(traced, op_devices, sends=rule))
                        fn = emitted.function
                        call = stand_in(call_interface(traced, op_devices))
                        step = lambda fn=fn: fn(*inputs)  # noqa: E731
                        for _ in range(2):  # warm-up
                            call_seconds(step), call_seconds(call)
                        shown = label if len(args.sends) == 1 else f"{label} ({sends} sends)"
                        sends_of[shown] = emitted.sends
                        plans.append((shown, op_devices, step, call, [], []))
                # the predictions use op times profiled in rounds interleaved with the measurements, so
                # that the machine's drift (large on a shared VM) hits profile and measurement alike
                profiler.clear()
                for _ in range(args.repeats):
                    profiler.round()
                    other.round()
                    for _, _, step, call, times, call_times in plans:
                        times.append(call_seconds(step))
                        call_times.extend(call_seconds(call) for _ in range(args.call_repeats))
                prof, prof1 = profiler.result(), other.result()
            # worker 1's ops at worker 0's profile times the ratio of the two workers' whole steps (the
            # cores of a shared VM drift apart: one ran the same kernels 40% slower than the other for seconds)
            speed = [1.0, (prof1.step_s - prof1.call_s) / (prof.step_s - prof.call_s)]
            calibrated = prof.calibrated_us()
            og = build_op_graph(traced, {"CPU": calibrated})
            fine = build_problem(og.graph, devset, group_by="op")  # one group per colocation group

            def simulate(op_devices, sends=None, **options):  # with the step's acknowledged transfers, if any
                a = fine.group_assignment(op_devices)
                return fine.simulate(a, SimOptions(ready_order=args.ready_order,
                                                   acknowledged=acknowledged_nodes(fine, sends), **options))

            ran = prof.ops_run
            compute_notes.append(
                f"- {name}: {ran} ops ran; sum of op medians {prof.op_sum_s * 1e3:.2f} ms; untraced step of the "
                f"profiled graph (Grappler {'on' if args.grappler else 'off'}) on worker 0 {prof.step_s * 1e3:.2f} ms, "
                f"of which fixed cost {prof.call_s * 1e3:.2f} ms; executor overhead {prof.overhead_us:.1f} µs per op; "
                f"worker 1's step {prof1.step_s * 1e3:.2f} ms (speed factor {speed[1]:.3f})")
            single = {op: names[0] for op in og.graph}
            resident = sum(og.graph.nodes[op]["memory_bytes"] for op in og.graph)
            sim_single = simulate(single)
            # the allocation records count what the ops allocate: not the variables, nor the fed inputs
            # (the simulator holds them for the whole step, so they are a constant part of its peak)
            fed = sum(v.nbytes for v in feeds.values())
            mem_pred = float(sim_single.peak_memory_bytes[0]) - resident - fed
            if first.activation_peak_bytes:  # profiled before any placement ran on the worker
                mem_err = (mem_pred - first.activation_peak_bytes) / first.activation_peak_bytes
                mem_rows.append((name, mem_pred, first.activation_peak_bytes, mem_err))
            model_rows = []
            for label, op_devices, _, _, times, call_times in plans:
                measured = float(np.median(times))
                call_s = float(np.median(call_times))
                acked = sends_of.get(label)
                predicted = simulate(op_devices, acked, transfer_cpu_s=transfer_cpu, time_factor=speed).step_time_s \
                    + call_s
                same_speed = simulate(op_devices, acked, transfer_cpu_s=transfer_cpu).step_time_s + call_s
                err = (predicted - measured) / measured
                model_rows.append((label, predicted, measured, err, same_speed, times))
                same_speed_errs.append((same_speed - measured) / measured)
                out(f"| {name} | {label} | {call_s * 1e3:.2f} | {predicted * 1e3:.2f} | {measured * 1e3:.2f} | "
                    f"{100 * err:+.1f}% | {same_speed * 1e3:.2f} | {100 * (same_speed - measured) / measured:+.1f}% |")
            dump[name] = dict(median_us=prof.median_us, calibrated_us=calibrated, speed=speed,
                              plans={label: dict(op_devices=op_devices, times=times, call_times=call_times)
                                     for label, op_devices, _, _, times, call_times in plans})
            rho = spearman([r[1] for r in model_rows], [r[2] for r in model_rows])
            rho_same_speed = spearman([r[4] for r in model_rows], [r[2] for r in model_rows])
            right, told = ordered_pairs([r[1] for r in model_rows], [r[5] for r in model_rows])
            right_same_speed, _ = ordered_pairs([r[4] for r in model_rows], [r[5] for r in model_rows])
            half_rho, half_ok = split_half([r[5] for r in model_rows])
            rows.extend((name, *r[:4], rho, f"{right}/{told}") for r in model_rows)
            out(f"| {name} | Spearman ρ (predicted vs measured order) | | | | {rho:.2f} | | {rho_same_speed:.2f} |")
            out(f"| {name} | pairs the measurement tells apart (sign test, p ≤ 0.05) that the prediction orders "
                f"rightly | | | | {right}/{told} | | {right_same_speed}/{told} |")
            out(f"| {name} | the measurement against itself: Spearman ρ between two random halves of the rounds "
                f"(median of 1000 splits; share of splits ≥ 0.9) | | | | {half_rho:.2f} ({100 * half_ok:.0f}%) | | |")
            half_rows.append((name, half_rho, half_ok))
    errs = np.abs([r[4] for r in rows])
    worst = max(rows, key=lambda r: abs(r[4]))
    out()
    out(f"Median absolute error {100 * np.median(errs):.1f}% over {len(rows)} cases; worst {100 * worst[4]:+.1f}% "
        f"({worst[0]}, {worst[1]}). Spearman per model: "
        + ", ".join(f"{m} {r[5]:.2f}" for m in args.models for r in rows if r[0] == m and r[1] == "single")
        + ". Pairs of placements the measurement tells apart, ordered rightly: "
        + ", ".join(f"{m} {r[6]}" for m in args.models for r in rows if r[0] == m and r[1] == "single")
        + f". Both workers at worker 0's speed: median absolute error {100 * np.median(np.abs(same_speed_errs)):.1f}%. "
        + "The measurement's own split-half Spearman (share of splits ≥ 0.9): "
        + ", ".join(f"{m} {rho:.2f} ({100 * ok:.0f}%)" for m, rho, ok in half_rows) + ".")
    out()
    out("Compute: the profile behind the predictions (interleaved rounds on worker 0)")
    out()
    for line in compute_notes:
        out(line)
    out()
    out("Memory: activation peak of one step on worker 0 (simulated peak of live tensors less the resident "
        "variables and fed inputs, vs TF's allocation records of a traced step replayed in time order at the "
        "bytes each op requested: `cost_models.profile.requested_peak_bytes`)")
    out()
    out("| model | predicted MB | allocator MB | error |")
    out("|---|---|---|---|")
    for name, pred, meas, err in mem_rows:
        out(f"| {name} | {pred / 1e6:.2f} | {meas / 1e6:.2f} | {100 * err:+.1f}% |")
    if args.dump:
        dump["links"] = {f"{i}-{j}": (f.link.latency_s, f.link.bandwidth_bytes_per_s) for (i, j), f in fits.items()}
        dump["transfer_cpu_s"] = float(cpu_s)
        Path(args.dump).write_text(json.dumps(dump))
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--repeats", type=int, default=9, help="measured runs per placement")
    ap.add_argument("--call-repeats", type=int, default=3, help="stand-in calls per placement and round")
    ap.add_argument("--profile-repeats", type=int, default=7, help="profiled runs per op")
    ap.add_argument("--no-grappler", dest="grappler", action="store_false", help="profile ops with Grappler off "
                    "(every traced op timed on its own) instead of on, as the placed function runs")
    ap.add_argument("--ready-order", default="lifo", choices=["fifo", "lifo"],
                    help="which ready op a simulated device runs next (cost_models.simulate); the workers "
                    "have one inter-op thread, which runs depth first (lifo)")
    ap.add_argument("--sends", nargs="+", default=["executor"], choices=["executor", "prompt"],
                    help="each placement with TensorFlow's send order and/or prompt sends (placer.tf.rewrites.sends)")
    ap.add_argument("--dump", help="also write the profiles, placements and raw timings to this JSON file")
    ap.add_argument("--out", default=str(HERE / "results" / "fidelity.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
