"""Run by tests/test_cluster.py inside a loopback-only network namespace (not collected by pytest).

Starts two pinned gRPC workers (from a directory holding planted ``tensorflow``
and ``placer`` packages, which they must not import), connects, calibrates the
link between them, places a small Keras model across them and compares
outputs with the original. Then the faults: worker 1 frozen (SIGSTOP) under a
direct call and under ``predict``, continued, then killed. Prints one JSON
line. The workers are stopped on every path. Progress goes to stderr; a
check that hangs dumps every thread's stack there and exits before the
test's deadline.
"""

import faulthandler
import gc
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
import weakref
from dataclasses import replace

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import placer  # noqa: E402
from cost_models.profile import GraphProfiler  # noqa: E402
from placer.core.plan import KEPT  # noqa: E402
from placer.measure.cluster import LocalCluster  # noqa: E402
from placer.measure.links import measure_link, on_caller  # noqa: E402
from placer.measure.steps import measure_steps  # noqa: E402
from placer.tf.measuring import one_device_original  # noqa: E402


def model() -> keras.Model:
    inp = keras.Input((32,))
    towers = [keras.layers.Dense(64, activation="relu", name=f"t{i}")(inp) for i in range(2)]
    out = keras.layers.Dense(4, name="head")(keras.layers.Concatenate()(towers))
    return keras.Model(inp, out, name="two_towers")


def chain() -> keras.Model:
    """Four dense layers: big enough that a stage boundary's tensors unblock more than a millisecond of work."""
    inp = keras.Input((512,))
    h = inp
    for i in range(4):
        h = keras.layers.Dense(512, activation="relu", name=f"c{i}")(h)
    return keras.Model(inp, keras.layers.Dense(8, name="out")(h), name="chain")


def stand_in_table(devices: list, specs: list) -> dict:
    """A recommender whose 1.25 MiB table exceeds each worker's 1 MiB: what the costs stage logged about where it
    profiled, the plan's splits, and ``fit``'s losses and weights against ``model.fit`` on a copy."""
    import logging

    rows, dim = 20_000, 16
    ids = keras.Input((4,), dtype="int32", name="ids")
    pooled = keras.ops.mean(keras.layers.Embedding(rows, dim, name="items")(ids), axis=1)
    rec = keras.Model(ids, keras.layers.Dense(1, name="score")(pooled), name="stand_in_rec")
    twin = keras.models.clone_model(rec)
    twin.set_weights(rec.get_weights())
    for k in (rec, twin):
        k.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    rng = np.random.default_rng(2)
    xs, ys = rng.integers(0, rows, (64, 4)).astype("int32"), rng.standard_normal((64, 1)).astype("float32")
    logged: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: logged.append(record.getMessage())
    runner_log = logging.getLogger("placer.tf")
    runner_log.addHandler(handler)
    level = runner_log.level
    runner_log.setLevel(logging.INFO)
    try:
        p = placer.autoplace(rec, [replace(s, memory_bytes=1 << 20) for s in specs], training=True, batch_size=32,
                             profile_cache=False, calibrate_links=False)
    finally:
        runner_log.removeHandler(handler)
        runner_log.setLevel(level)
    ref = twin.fit(xs, ys, batch_size=32, epochs=2, shuffle=False, verbose=0).history["loss"]
    got = p.fit(xs, ys, batch_size=32, epochs=2, shuffle=False, verbose=0).history["loss"]
    return {"log": [m for m in logged if "profiled" in m], "splits": dict(p.plan.splits),
            "rel": float(max(abs(a - b) / abs(b) for a, b in zip(got, ref))),
            "weights": float(max(np.abs(a - b).max() for a, b in zip(p.get_weights(), twin.get_weights())))}


def pooled_kernels(specs: list) -> dict:
    """Two 4.06 MiB kernels on workers whose plan has 12 MiB each from allocator pools capped at 64 MiB
    (``DeviceSpec.memory_pool_bytes``): each kernel takes a whole 8 MiB region of its pool, so one worker
    holds 16 MiB in use where the tensors are 8.1 MiB. What autoplace did on one worker and on two."""
    model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(1040, name="a"),
                              keras.layers.Dense(1024, name="b")], name="pooled_kernels")
    pooled = [replace(s, memory_bytes=12 << 20, memory_pool_bytes=64 << 20) for s in specs]
    try:
        placer.autoplace(model, pooled[:1], batch_size=1, profile_cache=False)
        refused = None
    except placer.InsufficientMemoryError as e:
        refused = str(e)
    out = {"one": refused, "plain": timed_error(lambda: placer.autoplace(
        model, [replace(pooled[0], memory_pool_bytes=None)], batch_size=1, profile_cache=False))}
    two = placer.autoplace(model, pooled, batch_size=1, profile_cache=False)
    out["peaks"] = list(two.plan.predicted_peak_memory_bytes)
    out["link_sources"] = sorted({link["source"] for link in two.report_data["links"]})
    out["pools"] = [d["memory_pool_bytes"] for d in two.report_data["devices"]]
    return out


def layer_splits(devices: list) -> dict:
    """A chain of three 2048-wide dense layers and two 256-wide ones at batch 4 with ``splits="auto"``: the splits
    stage's search (largest-first subsets, then layer by layer, :func:`placer.core.splits.descend_splits`) on
    real workers: its log line, the kept plan's predicted step beside every scored split plan's, and the
    outputs against the model's."""
    keras.utils.set_random_seed(3)
    inp = keras.Input((2048,))
    h = inp
    for i, width in enumerate((2048, 2048, 2048, 256, 256)):
        h = keras.layers.Dense(width, activation="relu", name=f"m{i}")(h)
    model = keras.Model(inp, h, name="mixed")
    p = placer.autoplace(model, devices, batch_size=4, profile_cache=False, split_toggles=6)
    x = np.random.default_rng(4).standard_normal((4, 2048)).astype("float32")
    ref = model(x).numpy()
    split = [c for c in p.plan.candidates if c.strategy == "split" and c.predicted_step_time_s is not None]
    return {"said": [line for line in p.plan.log if line.startswith("operator splits:")],
            "splits": dict(p.plan.splits), "solver": p.plan.solver,
            "scored": [c.predicted_step_time_s for c in split],
            "toggles_listed": sum(c.solver.endswith("layer by layer") for c in split),
            "kept": [c.predicted_step_time_s for c in p.plan.candidates if c.outcome == KEPT],
            "rel": float(np.abs(p(x).numpy() - ref).max() / np.abs(ref).max())}


def resharded(devices: list) -> dict:
    """A dense chain split over both workers (``splits="all"``), exported, loaded on worker 0 alone (its split
    ops whole again, the weights the shards put together) and, saved from there, on both again (split two ways
    anew): each load's outputs against the model's."""
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512, activation="relu", name="r0"),
                              keras.layers.Dense(128, name="r1")], name="reshard")
    p = placer.autoplace(model, devices, batch_size=4, splits="all", split_min_bytes=4096, time_limit_s=1,
                         profile_cache=False)
    x = np.random.default_rng(6).standard_normal((4, 256)).astype("float32")
    ref = model(x).numpy()
    folder = tempfile.mkdtemp()
    one = placer.load(p.export(os.path.join(folder, "split")), devices=devices[:1])
    two = placer.load(one.export(os.path.join(folder, "whole")), devices=devices)
    return {"splits": dict(p.plan.splits), "one_splits": dict(one.plan.splits), "two_splits": dict(two.plan.splits),
            "one_devices": sorted(set(one.op_devices.values())), "two_shards": len(two.shards),
            "rel": [float(np.abs(m(x).numpy() - ref).max() / np.abs(ref).max()) for m in (p, one, two)]}


def by_layers(placed, late: tuple[str, ...]) -> placer.Plan:
    """``placed.plan`` with the ops of the ``late`` layers on its second device, the rest on its first (without
    the order the plan's own assignment ran in: ``Plan.op_order`` belongs to that assignment)."""
    graph = placed.placement.op_graph.graph
    first, second = placed.plan.devices
    def layer(op: str) -> str:  # "chain_1/c2_1" -> "c2"
        return re.sub(r"_\d+$", "", str(graph.nodes[op].get("layer", op)).split("/")[-1])

    return replace(placed.plan, assignment={op: second if layer(op) in late else first
                                            for op in placed.plan.assignment}, op_order={})


def ack_count(placed) -> int:
    """The acknowledgements (``placer.tf.rewrites.sends``) in the placed model's training step."""
    from placer.tf.graphdef import ACK_SCOPE

    functions = placed.placement.functions.emitted()
    return sum(n.name.startswith(ACK_SCOPE) for e in functions if e.step == "train" for n in e.graph_def.node)


def plant(directory: str) -> str:
    """Packages named like the real ones in ``directory``; importing either writes ``HIJACKED``."""
    marker = os.path.join(directory, "HIJACKED")
    for pkg in ("tensorflow", "placer"):
        os.makedirs(os.path.join(directory, pkg))
        with open(os.path.join(directory, pkg, "__init__.py"), "w") as f:
            f.write(f"open({marker!r}, 'w').write({pkg!r})\n")
    return marker


def two_stages(plan: placer.Plan) -> placer.Plan:
    """``plan`` with the towers on its first device and the head (concatenation, dense, output) on its second (one
    copy of the model: ``replicas=1``; without the order of the plan's own assignment)."""
    first, second = plan.devices
    return replace(plan, replicas=1, op_order={},
                   assignment={op: second if ("head" in op or "concatenate" in op or op.startswith("Identity"))
                               else first for op in plan.assignment})


def profile_with_variable(dtype: str, target: str, device: str) -> None:
    """Profile, on ``target``, a graph reading one variable (``autoplace_var_0``) of ``dtype``."""
    g = tf.Graph()
    with g.as_default():
        handle = tf.raw_ops.VarHandleOp(dtype=tf.as_dtype(dtype), shape=[2], name="v")
        tf.identity(tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.as_dtype(dtype)), name="out")
    GraphProfiler(g.as_graph_def(), {}, {"v:0": np.ones(2, dtype)}, ["out:0"], device=device, warmup=1,
                  target=target).close()


def profile_frozen(target: str, device: str) -> None:
    """One profiling round on ``target`` with a 2 s deadline per run (the worker is frozen: it must fail, typed)."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 8], name="x")
        tf.linalg.matmul(x, x, name="mm")
    with GraphProfiler(g.as_graph_def(), {"x:0": np.ones((8, 8), np.float32)}, {}, ["mm:0"], device=device,
                       warmup=1, target=target, timeout_s=2.0) as prof:
        prof.round()


START = time.monotonic()


def chatty_worker() -> dict:
    """A worker that logs every kernel it runs (verbose logging) runs 300 steps within 120 s: its stderr is
    drained (a 64 KB pipe left unread would block it), and its tail is kept."""
    import threading

    result = {}
    with LocalCluster(1, env={"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_MAX_VLOG_LEVEL": "1"}) as chatty:
        def steps():
            g = tf.Graph()
            with g.as_default(), tf.device(chatty.device(0)):
                y = tf.reduce_sum(tf.ones([4]) * 2.0)
            with tf.compat.v1.Session(f"grpc://{chatty.spec['worker'][0]}", graph=g) as sess:
                for _ in range(300):
                    sess.run(y)
            result["done"] = True

        t = time.monotonic()
        runner = threading.Thread(target=steps, daemon=True)
        runner.start()
        runner.join(120)
        result["s"] = time.monotonic() - t
        result["finished"] = bool(result.get("done"))
        result["tail_bytes"] = len(chatty.stderr_tail(0))
    progress(f"chatty worker: {result}")
    return result


def start_and_stop(port: int) -> None:
    with LocalCluster(1, ports=[port]):
        pass


def progress(what: str) -> None:
    print(f"[cluster_check {time.monotonic() - START:6.1f} s] {what}", file=sys.stderr, flush=True)


def timed_error(fn) -> dict:
    t = time.monotonic()
    try:
        fn()
        out = {"error": None, "s": time.monotonic() - t}
    except Exception as e:  # noqa: BLE001  (reported to the test, which checks the type)
        out = {"error": type(e).__name__, "message": str(e)[:300], "s": time.monotonic() - t}
    progress(f"{out['error']} after {out['s']:.1f} s")
    return out


def trace_sizes(cluster: LocalCluster, step) -> dict[int, int]:
    """Task → bytes of that worker's trace of 0.5 s of ``step()`` calls."""
    with tempfile.TemporaryDirectory() as logdir:
        return {task: path.stat().st_size for task, path in cluster.trace(step, logdir, 500).items()}


def main() -> None:
    out = {}
    here = os.getcwd()
    planted = tempfile.mkdtemp()
    marker = plant(planted)
    os.chdir(planted)  # the workers start here
    with LocalCluster(2, profiler=True) as cluster:
        os.chdir(here)
        out["hijacked"] = os.path.exists(marker)
        out["worker_pids"] = [p.pid for p in cluster.procs]
        out["unreachable"] = timed_error(lambda: placer.connect({"worker": ["127.0.0.1:1"]}, timeout_s=2))
        out["bad_spec"] = timed_error(lambda: placer.connect({"worker": ["no-port"]}))
        with socket.socket() as busy:  # a port another process listens on
            busy.bind(("", 0))
            busy.listen()
            out["port_in_use"] = timed_error(lambda: start_and_stop(busy.getsockname()[1]))
        out["chatty"] = chatty_worker()
        out["double_start"] = timed_error(cluster.start)  # running already: refused, the workers untouched
        out["alive_after_double_start"] = all(proc.poll() is None for proc in cluster.procs)
        connected = placer.connect(tf.train.ClusterSpec(cluster.spec))  # a ClusterSpec, as for other hosts
        devices = [cluster.device(0), cluster.device(1)]
        out["connected"] = sorted(connected)
        names = {d.name for d in tf.config.list_logical_devices()}
        out["devices_visible"] = all(d in names for d in devices)
        progress("calibrating the link")
        fit = measure_link(devices[0], devices[1], repeats=5)
        out["link"] = {"latency_s": fit.link.latency_s, "bandwidth_bytes_per_s": fit.link.bandwidth_bytes_per_s,
                       "r2": fit.r2}
        m = model()
        x = np.random.default_rng(0).standard_normal((8, 32)).astype("float32")
        ref = m.predict(x, verbose=0)
        progress("placing on two workers")
        placed = placer.autoplace(m, devices, batch_size=8, time_limit_s=1, algorithm="round_robin",
                                  profile_cache=False)
        got = placed(x).numpy()
        out["max_abs_diff"] = float(np.abs(got - ref).max())
        out["output_device"] = placed(x).device  # received on the caller inside the call (links.on_caller)
        out["link_sources"] = sorted({link["source"] for link in placed.report_data["links"]})
        out["ready_order"] = placed.report_data["simulation"]["ready_order"]  # detected: one-thread workers
        # profiles of a worker are cached for that worker process: the second placement reads them
        from placer.tf.costs import worker_identity
        cache_dir = tempfile.mkdtemp()
        sources = []
        for _ in range(2):
            again = placer.autoplace(m, devices, batch_size=8, time_limit_s=1, algorithm="round_robin",
                                     profile_cache=cache_dir)
            sources.append(again.report_data["cost_model"]["compute"]["CPU"])
            again(x)  # a watched call: its helper thread stays idle afterwards
        # a dropped placed model leaves nothing on the workers: no variable of it is alive here (an idle call
        # thread held the last call's placed function, and with it the weights on the workers, for a minute)
        held = [weakref.ref(v) for v in again._placed.variables.values()]
        del again
        gc.collect()
        out["dropped_variables_alive"] = sum(ref() is not None for ref in held)
        out["dropped_variables"] = len(held)
        out["cache_sources"] = sources
        out["cache_entries"] = sum(name.startswith("profile-") for name in os.listdir(cache_dir))
        out["cache_figures"] = sum(name.startswith("figures-") for name in os.listdir(cache_dir))
        out["identities"] = [[worker_identity(a) for a in cluster.spec["worker"]] for _ in range(2)]
        out["link_fits"] = [link["fit"] for link in placed.report_data["links"]]
        html_path = os.path.join(planted, "report.html")
        placed.report(html_path)
        with open(html_path, encoding="utf-8") as f:
            out["report_shows_fit"] = "fit of the calibration" in f.read()
        out["shared"] = placed.report_data.get("shared_processors", [])
        out["used_devices"] = sorted(set(placed.plan.assignment.values()))
        out["variable_devices"] = sorted({v.value.device for v in placed.variables})
        # placed.measure's baseline: the original with every op and a copy of every weight on worker 0, timed
        # against a hand-built one-worker copy (the model cloned there, its weights copied), interleaved
        progress("the measured baseline against a hand-built one-worker copy")
        traced = placed.placement.functions.forward_trace(False)
        original, copies = one_device_original(traced, devices[0])
        out["original_variable_devices"] = sorted({v.device for v in copies})
        with tf.device(devices[0]):
            hand = keras.models.clone_model(m)
            hand.set_weights(m.get_weights())

        @tf.function(autograph=False)
        def hand_step(xs):
            with tf.device(devices[0]):
                y = hand(xs, training=False)
            return on_caller(y)  # received inside the call, as placed functions return their outputs

        xs = tf.constant(x)
        ours, theirs = measure_steps(original, hand_step, [xs], repeats=30, warmup=5, min_time_s=1.5)
        out["original_vs_hand"] = float(np.median(ours) / np.median(theirs))
        out["measure_setup"] = placed.measure(x, repeats=5, min_time_s=0).report_entries()[1]["setup"]
        out["missing_device"] = timed_error(lambda: placer.autoplace(
            m, ["/job:worker/replica:0/task:7/device:CPU:0"], batch_size=8, time_limit_s=1))
        # a two-stage pipeline of 4 micro-batches: bit-exact against the original on the same micro-batches
        progress("pipelined inference")
        # (the split is given: on real workers the measured link makes one device the better plan for a
        # model this small, and this check is about running a pipeline across workers)
        piped = placer.autoplace(m, devices, batch_size=8, microbatches=4, profile_cache=False,
                                 plan=two_stages(placed.plan))
        ref_mb = np.concatenate([m(part, training=False).numpy() for part in np.split(x, 4)])
        out["pipelined_bit_exact"] = bool(np.array_equal(piped(x).numpy(), ref_mb))
        out["pipelined_devices"] = sorted(set(piped.plan.assignment.values()))
        # pipelined training in 2 micro-batches against model.fit on an identical copy
        rng = np.random.default_rng(1)
        xs, ys = rng.standard_normal((16, 32)).astype("float32"), rng.standard_normal((16, 4)).astype("float32")
        mt = model()
        twin = keras.models.clone_model(mt)
        twin.set_weights(mt.get_weights())
        for k in (mt, twin):
            k.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        progress("pipelined training")
        trained = placer.autoplace(mt, devices, training=True, batch_size=8, microbatches=2, time_limit_s=1,
                                   algorithm="round_robin", profile_cache=False)
        ref_hist = twin.fit(xs, ys, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
        got_hist = trained.fit(xs, ys, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
        out["pipelined_training_rel"] = float(max(abs(a - b) / abs(b) for a, b in zip(got_hist, ref_hist)))
        out["pipelined_training_devices"] = sorted(set(trained.plan.assignment.values()))
        out["pipelined_training_weights"] = float(max(np.abs(a - b).max() for a, b in
                                                      zip(trained.get_weights(), twin.get_weights())))
        # prompt sends (acknowledged transfers) against TensorFlow's order, a two-stage split by layers, and
        # model.fit on an identical copy: the same losses and weights; only the prompt placement has acks
        progress("prompt sends")
        xs, ys = rng.standard_normal((128, 512)).astype("float32"), rng.standard_normal((128, 8)).astype("float32")
        mc = chain()
        mc.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        split = by_layers(placer.autoplace(mc, devices, training=True, batch_size=64, algorithm="contiguous",
                                           profile_cache=False, calibrate_links=False), ("c2", "c3", "out"))
        for sends in ("prompt", "executor"):
            twin = keras.models.clone_model(mc)
            twin.set_weights(mc.get_weights())
            twin.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
            ref_hist = twin.fit(xs, ys, batch_size=64, epochs=2, shuffle=False, verbose=0).history["loss"]
            p = placer.autoplace(mc, devices, training=True, batch_size=64, plan=split, sends=sends,
                                 profile_cache=False, calibrate_links=False)  # mc's own weights stay as they are
            got_hist = p.fit(xs, ys, batch_size=64, epochs=2, shuffle=False, verbose=0).history["loss"]
            out[f"{sends}_sends"] = {
                "acks": ack_count(p), "devices": sorted(set(p.plan.assignment.values())),
                "report": p.report_data["sends"],
                "rel": float(max(abs(a - b) / abs(b) for a, b in zip(got_hist, ref_hist))),
                "weights": float(max(np.abs(a - b).max() for a, b in zip(p.get_weights(), twin.get_weights())))}
        # an embedding table that no worker holds whole (the plan's 1 MiB each): split by rows, and profiled on
        # worker 0 by its first rows (not in this process, whose CPU is not a worker's), trains as model.fit does
        progress("a table no worker holds whole, profiled by a stand-in")
        out["stand_in"] = stand_in_table(devices, cluster.device_specs(devices))
        progress("weights whose allocator pools hold more than their bytes")
        out["pooled"] = pooled_kernels(cluster.device_specs(devices))
        # two profiles on one worker whose variables share a name but not a dtype (a second model placed in
        # the same process): each profile's variables live in a container of its own on the worker
        progress("splits chosen layer by layer")
        out["layer_splits"] = layer_splits(devices)
        progress("a split export loaded on one worker, then on two")
        out["resharded"] = resharded(devices)
        progress("two profiles with clashing variable names")
        out["second_profile"] = timed_error(lambda: [profile_with_variable(dtype, f"grpc://{cluster.spec['worker'][0]}",
                                                                           devices[0]) for dtype in ("int64", "float32")])
        progress("tracing both workers' ops with their profiler servers")
        out["traces"] = trace_sizes(cluster, lambda: placed(x).numpy())
        out["healthy"] = timed_error(lambda: (placed.check_workers(), cluster.check()))
        pid = cluster.procs[1].pid
        progress("freezing worker 1")
        os.kill(pid, signal.SIGSTOP)
        out["frozen_call"] = timed_error(lambda: placed(x))
        out["frozen_predict"] = timed_error(lambda: placed.predict(x, verbose=0))
        out["frozen_check"] = timed_error(lambda: cluster.check(timeout_s=2))
        out["frozen_profile"] = timed_error(lambda: profile_frozen(f"grpc://{cluster.spec['worker'][1]}", devices[1]))
        progress("continuing worker 1")
        os.kill(pid, signal.SIGCONT)
        time.sleep(1)
        out["resumed_max_abs_diff"] = float(np.abs(placed(x).numpy() - ref).max())
        progress("killing worker 1")
        os.kill(pid, signal.SIGKILL)
        cluster.procs[1].wait()
        out["killed_call"] = timed_error(lambda: placed(x))
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    faulthandler.dump_traceback_later(480, exit=True)  # before the test's 600 s: show where it hangs
    main()
    # the workers are stopped; skip TensorFlow's teardown, which tries to remove every function registered on
    # them (one is dead by now) and can wait on gRPC for a long time
    sys.stdout.flush()
    os._exit(0)
