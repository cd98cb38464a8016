"""Two real TF gRPC worker processes on loopback: devices, link calibration, placement, shutdown.

The check runs in a child process inside a loopback-only network namespace
(``unshare -rn``), because TensorFlow's servers listen on all interfaces.
"""

import re
import json
import os
import shutil
import subprocess
import sys

import pytest

from placer.measure.cluster import LocalCluster, network_isolated
from placer.errors import DeviceError

HERE = os.path.dirname(os.path.abspath(__file__))


def _namespace_works() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    r = subprocess.run(["unshare", "-rn", "sh", "-c", "ip link set lo up"], capture_output=True)
    return r.returncode == 0


def _in_namespace(script: str) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh Python inside a loopback-only network namespace (the project root as cwd)."""
    return subprocess.run(["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', sys.executable, "-c",
                           script], capture_output=True, text=True, timeout=300, cwd=os.path.dirname(HERE))


def test_a_workers_threads_are_read_from_its_command_line():
    from placer.core.processes import python_module_command
    from placer.measure.worker import MODULE, threads_from_command_line

    spec = '{"worker": ["127.0.0.1:1"]}'
    assert threads_from_command_line(python_module_command(MODULE, spec, "0", "1")) == 1  # LocalCluster's form
    assert threads_from_command_line(["python", "-m", MODULE, spec, "3", "4", "--no-heap-trim"]) == 4
    for foreign in (["python", "server.py", spec, "0", "1"], ["python", "-m", MODULE, spec, "0"],
                    ["python", "-m", MODULE, spec, "0", "0"], ["python", "-m", MODULE, spec, "0", "-1"]):
        assert threads_from_command_line(foreign) is None, foreign


@pytest.mark.parametrize("threads,order", [((1, 1), "lifo"), ((1, 4), "fifo"), ((1, None), "fifo")])
def test_the_ready_order_follows_the_processes_inter_op_threads(monkeypatch, threads, order):
    from placer.core.devices import resolve_devices
    from placer.measure import hosts

    devset = resolve_devices([f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(2)])
    monkeypatch.setattr(hosts, "inter_op_threads", lambda host: threads[int(host[-1])])
    got, why = hosts.executor_ready_order(devset)
    assert got == order
    if None in threads:  # a worker not started by placer.measure.worker: said so, with what to pass
        assert "task:1" in why and "cannot be told" in why and "ready_order='lifo'" in why


def test_tracing_a_cluster_without_profiler_servers_is_refused():
    with pytest.raises(DeviceError, match="profiler=True"):
        LocalCluster(2).trace(lambda: None, "unused", 100)


@pytest.mark.parametrize("ports", [[1], [5000, 5000], [0, 5001], ["x", 5002]])
def test_bad_worker_ports_are_refused(ports):
    with pytest.raises(DeviceError, match="port"):
        LocalCluster(2, ports=ports)


def test_cluster_refuses_to_start_on_a_reachable_network():
    if network_isolated():
        pytest.skip("this process already runs in a loopback-only namespace")
    with pytest.raises(DeviceError, match="listen on all interfaces"):
        LocalCluster(2).start()


def test_shaping_loopback_is_refused_outside_a_namespace_and_for_unknown_rates():
    from placer.measure.cluster import shape_loopback

    if not network_isolated():
        with pytest.raises(DeviceError, match="loopback-only namespace"):
            shape_loopback("1gbit")   # would slow every process on this machine
    else:
        with pytest.raises(DeviceError, match="unknown link rate"):
            shape_loopback("3gbit")


@pytest.mark.skipif(not _namespace_works() or not shutil.which("tc"),
                    reason="needs unshare -rn, ip and tc (util-linux, iproute2)")
def test_a_shaped_loopback_is_what_the_link_calibration_measures():
    # inside a loopback-only namespace: loopback shaped to 1 Gbit/s, two workers, the link calibrated
    script = (
        "import json, sys\n"
        "from placer.measure.cluster import LocalCluster, shape_loopback\n"
        "rate = shape_loopback('1gbit')\n"
        "from placer.core.devices import resolve_devices\n"
        "from placer.measure.links import calibrate_links\n"
        "import placer\n"
        "with LocalCluster(2, pin_cores=True, threads=1) as c:\n"
        "    devs = resolve_devices(placer.connect(c))\n"
        "    out = calibrate_links(devs, cross_process_only=True)[0]\n"
        "    bw = [l.bandwidth_bytes_per_s for l in out.links.values()]\n"
        "    print(json.dumps({'rate': rate, 'bandwidth': bw}), flush=True)\n"
        "import os; os._exit(0)\n")
    r = _in_namespace(script)
    if r.returncode and "refused to shape loopback" in r.stderr:  # a kernel without the tbf queue discipline
        pytest.skip(r.stderr.strip().splitlines()[-1][:300])
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["bandwidth"] and all(abs(b - out["rate"]) / out["rate"] < 0.10 for b in out["bandwidth"]), out


@pytest.mark.skipif(not _namespace_works(), reason="needs unshare -rn and ip (util-linux, iproute2) for a "
                                                   "loopback-only network namespace")
def test_a_workers_memory_limit_is_enforced_and_planned_against():
    # a worker limited to its runtime, its transfers' pool + 256 MiB (a pool capped at 384 MiB): a 128 MiB tensor
    # fits, a 768 MiB one is a ResourceExhaustedError
    # (not a kill: the worker answers after it), and a model whose weights (512 MiB) exceed what is left is refused
    # before anything runs, the error naming the largest weights and the shortfall
    script = (
        "import json\n"
        "import keras, tensorflow as tf, placer\n"
        "from placer.measure.cluster import LocalCluster, MIN_WORKER_MEMORY_BYTES\n"
        "out = {}\n"
        "with LocalCluster(1, memory_limit_bytes=MIN_WORKER_MEMORY_BYTES) as c:\n"
        "    devices = placer.connect(c)\n"
        "    for mib in (128, 768):\n"
        "        try:\n"
        "            with tf.device(devices[0]):\n"
        "                v = tf.Variable(tf.zeros([mib << 18]))\n"
        "                out[mib] = float(tf.reduce_sum(v).numpy())\n"
        "            del v\n"
        "        except tf.errors.ResourceExhaustedError as e:\n"
        "            out[mib] = 'ResourceExhaustedError: ' + str(e).splitlines()[0]\n"
        "    out['alive'] = c.procs[0].poll() is None\n"
        "    m = keras.Sequential([keras.Input((8192,)), keras.layers.Dense(16384, name='big')])\n"
        "    try:\n"
        "        placer.autoplace(m, c.device_specs(devices), batch_size=1, calibrate_links=False)\n"
        "        out['refused'] = None\n"
        "    except placer.InsufficientMemoryError as e:\n"
        "        out['refused'] = str(e)\n"
        "    spec = c.device_specs(devices)[0]\n"
        "    out['memory'] = [spec.memory_bytes, spec.memory_pool_bytes]\n"
        "print(json.dumps(out), flush=True)\n"
        "import os; os._exit(0)\n")
    r = _in_namespace(script)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["128"] == 0.0, out
    assert out["768"].startswith("ResourceExhaustedError: OOM when allocating"), out
    # oneDNN's pool (TensorFlow's default here): a plan may use the pool's cap, the limit less the runtime
    assert out["alive"] and out["memory"] == [384 << 20, 384 << 20]
    assert out["refused"] and "big" in out["refused"] and "short" in out["refused"], out


def test_a_memory_limit_below_the_runtime_is_refused():
    with pytest.raises(DeviceError, match="memory_limit_bytes"):
        LocalCluster(1, memory_limit_bytes=512 << 20)


@pytest.mark.skipif(not _namespace_works(), reason="needs unshare -rn and ip (util-linux, iproute2) for a "
                                                   "loopback-only network namespace")
def test_two_pinned_workers_place_a_model_and_shut_down():
    env = dict(os.environ)
    env.pop("AUTOPLACE_CACHE_DIR", None)
    cmd = ["unshare", "-rn", "sh", "-c", f"ip link set lo up && exec {sys.executable} {HERE}/cluster_check.py"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail("the cluster check did not finish in 600 s; its progress:\n" +
                    "\n".join(ln for ln in err.splitlines() if "retracing" not in ln)[-4000:])
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, "\n".join(
        ln for ln in proc.stderr.splitlines() if "retracing" not in ln)[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["devices_visible"]
    assert out["dropped_variables"] > 0 and out["dropped_variables_alive"] == 0, out
    assert out["connected"] == sorted(f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(2))
    assert out["unreachable"]["error"] == "WorkerError" and out["unreachable"]["s"] < 30, out["unreachable"]
    assert out["bad_spec"]["error"] == "DeviceError", out["bad_spec"]
    assert out["port_in_use"]["error"] == "DeviceError" and "in use" in out["port_in_use"]["message"], \
        out["port_in_use"]
    assert out["double_start"]["error"] == "DeviceError" and out["alive_after_double_start"], out["double_start"]
    # a worker logging every kernel is not blocked by a full stderr pipe; its last lines are kept
    assert out["chatty"]["finished"] and out["chatty"]["tail_bytes"] > 0, out["chatty"]
    assert out["missing_device"]["error"] == "DeviceError", out["missing_device"]
    assert out["second_profile"]["error"] is None, out["second_profile"]
    assert out["pipelined_bit_exact"] and len(out["pipelined_devices"]) == 2, out
    assert len(out["pipelined_training_devices"]) == 2, out
    # a table no worker holds whole: profiled on worker 0 by a stand-in of its first rows (before: in the client's
    # own process), split by rows over both workers, and trained as model.fit does
    stand_in = out["stand_in"]
    assert any("cut to" in m and "task:0" in m for m in stand_in["log"]), stand_in
    assert any("ops profiled on /job:worker/replica:0/task:0" in m for m in stand_in["log"]), stand_in
    assert list(stand_in["splits"].values()) == [2], stand_in
    assert stand_in["rel"] <= 1e-5 and stand_in["weights"] <= 1e-5, stand_in
    assert out["pipelined_training_rel"] <= 1e-5 and out["pipelined_training_weights"] <= 1e-5, out
    # workers whose tensors come from allocator pools (memory_pool_bytes): two 4.06 MiB kernels take a whole
    # 8 MiB region each, so one worker with 12 MiB for the plan is refused (the same without a pool places
    # them), and two workers hold one kernel each: each peak is its pool's, over 8 MiB (one kernel's bytes
    # are 4.06 MiB; both on one worker would hold 16 MiB) and within 12 MiB, on links calibrated between them
    # (the simulation with transfer costs keeps the pools)
    # splits="auto" on real workers: the largest-first subsets, then layer by layer (at most split_toggles=6
    # scored; each scored plan a candidate), the kept plan no slower than any split plan scored, outputs equal
    layered = out["layer_splits"]
    said = layered["said"]
    assert len(said) == 1 and re.search(r"then [0-6] layers toggled one at a time", said[0]), layered
    # every toggle scored is a candidate of the plan (the report lists it), none more
    toggled = int(re.search(r"then ([0-6]) layers toggled", said[0]).group(1))
    assert (toggled == 0 or layered["toggles_listed"] >= 1) and layered["toggles_listed"] <= toggled, layered
    assert layered["scored"] and len(layered["kept"]) == 1, layered
    if layered["splits"]:
        assert layered["kept"][0] == min(layered["scored"]), layered
    assert layered["rel"] <= 1e-5, layered
    # a split export loads whole on one worker and split anew on two (placer.load re-shards it)
    again = out["resharded"]
    assert again["splits"] and set(again["splits"].values()) == {2} and again["one_splits"] == {}, again
    assert again["one_devices"] == ["/job:worker/replica:0/task:0/device:CPU:0"], again
    assert again["two_splits"] == again["splits"] and again["two_shards"] >= 4, again
    assert max(again["rel"]) <= 1e-5, again
    pooled = out["pooled"]
    assert pooled["one"] and "BFC allocator pool" in pooled["one"] and "Add devices" in pooled["one"], pooled
    assert pooled["plain"]["error"] is None, pooled
    assert all(8 << 20 < p <= 12 << 20 for p in pooled["peaks"]) and len(pooled["peaks"]) == 2, pooled
    assert pooled["link_sources"] == ["calibrated"] and pooled["pools"] == [64 << 20] * 2, pooled
    workers = {f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(2)}
    # a two-stage training split: its stage boundary's activation (and gradient) acknowledged with prompt
    # sends (and nothing with TensorFlow's order); both train as model.fit does
    prompt, executor = out["prompt_sends"], out["executor_sends"]
    # the activation into the second stage always (it unblocks that stage's forward and backward passes); the
    # gradient back where what it unblocks (the first stage's backward pass, about 1 ms here) profiles at
    # MIN_WORK_S or more: 2 acknowledgements until 2026-12-07, 1 on 2026-12-08 with the code of that day and of
    # the day before alike
    assert prompt["acks"] >= 1 and executor["acks"] == 0, out
    assert prompt["report"]["prompt"] and len(prompt["report"]["acknowledged"]) == prompt["acks"], prompt
    assert executor["report"] == {"prompt": False, "acknowledged": []}, executor
    for run in (prompt, executor):
        assert set(run["devices"]) == workers and run["rel"] <= 1e-5 and run["weights"] <= 1e-5, out
    assert set(out["used_devices"]) == workers
    assert set(out["variable_devices"]) <= workers
    # placed.measure's original runs on worker 0 with its weights there, as fast as a hand-built copy on worker 0
    # (before, it read the client's weights on every call: 1.5x slower on a real model)
    assert out["original_variable_devices"] == ["/job:worker/replica:0/task:0/device:CPU:0"], out
    assert 0.9 <= out["original_vs_hand"] <= 1.1, out["original_vs_hand"]
    assert "every op and a copy of every weight on /job:worker/replica:0/task:0/device:CPU:0" in out["measure_setup"]
    assert out["max_abs_diff"] <= 1e-5, out
    # the output comes back inside the call: fetched after it, a worker's output moved 2-3x as slowly
    assert out["output_device"] == "/job:localhost/replica:0/task:0/device:CPU:0", out["output_device"]
    assert out["link_sources"] == ["calibrated"]  # autoplace measured the link between the two workers
    assert out["ready_order"] == "lifo"  # LocalCluster's workers run one inter-op thread: detected, depth first
    # a worker's profile is cached for that process: measured once, then read back; each worker process
    # has its own identity, stable while it runs
    assert out["cache_sources"] == ["measured", "measured (cached)"] and out["cache_entries"] == 1, out
    # ... with what the plan also depends on: the runtime factor, and the link calibration and shared capacity
    assert out["cache_figures"] == 2, out
    first, second = out["identities"]
    assert first == second and first[0] != first[1] and all(i.count("|") == 1 for i in first), first
    # ... with its fit's quality in the report: 6 payload sizes, a coefficient of determination, a worst error
    assert [f["points"] for f in out["link_fits"]] == [6, 6], out["link_fits"]
    assert all(f["r2"] <= 1.0 and f["max_rel_error"] >= 0 for f in out["link_fits"]), out["link_fits"]
    assert out["report_shows_fit"]
    # the two worker processes run on one machine: one group, not pooled, its capacity measured
    (machine,) = out["shared"]
    assert set(machine["devices"]) == workers and machine["pooled"] is False and machine["source"] == "measured"
    assert 1.0 <= machine["capacity"] <= 2.0
    assert out["link"]["latency_s"] > 0  # a cross-process call costs something, unlike logical devices
    assert not out["hijacked"]  # the workers imported the installed packages, not the planted ones
    assert out["healthy"]["error"] is None
    assert sorted(out["traces"]) == ["0", "1"] and min(out["traces"].values()) > 1000, out["traces"]  # both workers
    for case in ("frozen_call", "frozen_predict", "frozen_check", "killed_call"):  # typed, within 30 s
        assert out[case]["error"] == "WorkerError" and out[case]["s"] < 30, (case, out[case])
    assert "task:1" in out["frozen_call"]["message"] and "not answering" in out["frozen_call"]["message"]
    # a profiling session on the frozen worker ends at its deadline (each run's, then closing's), said as such
    frozen = out["frozen_profile"]
    assert frozen["error"] == "ValueError" and "did not finish within 2 s" in frozen["message"], frozen
    assert frozen["s"] < 20, frozen
    assert out["resumed_max_abs_diff"] <= 1e-5  # a worker that comes back serves the placed model again
    for pid in out["worker_pids"]:  # the workers are gone
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


TRIM_PROBE = """
import sys, time
import numpy as np
sys.path.insert(0, {root!r})
from placer.measure.worker import _resident_bytes, start_heap_trimmer
if {trim}:
    assert start_heap_trimmer()
time.sleep(0.2)
arrays = [np.ones(100_000 // 8) for _ in range(3000)]  # 100 kB each: under glibc's mmap threshold, on the heap
kept = arrays[::100]  # one block in a hundred stays: the freed ones in between cannot shrink the heap's top
del arrays
held = _resident_bytes()
time.sleep(2.5)  # idle: the trimmer's second passes
print(held, _resident_bytes())
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm") or "glibc" not in " ".join(__import__("platform").libc_ver()),
                    reason="the heap trimmer needs glibc and /proc")
@pytest.mark.parametrize("trim", [True, False])
def test_an_idle_worker_hands_freed_heap_memory_back(trim):
    """The worker's trimmer (placer.measure.worker) returns the freed blocks of a fragmented heap once the process
    is idle; without it they stay resident."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE.format(root=root, trim=trim)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    held, after = map(int, out.stdout.split())
    assert held > 250e6, held  # the probe did fragment ~300 MB of heap
    if trim:
        assert after < held - 200e6, (held, after)
    else:
        assert after > held - 50e6, (held, after)
