"""Probe: a worker's fused product reading an empty bias ("Must provide as many biases as the channel size: [0]").

The hosts stage's shared-capacity probe (``placer.tf.timing.measure_shared_capacity`` on gRPC workers) times
one copy of the model on worker 0 and copies on workers 0 and 1 in turn, both functions reading the same
weight copies on worker 0. With a chain of 4 dense layers of 8192 and GELU, a call fails with the error above at
the last layer's fused ``MatMul + BiasAdd + GELU`` on worker 0 in about one probe in four (2026-12-06: 1, 2,
3, 1 and 3 of 8), although every weight copy reads back whole after the failure. Not seen with ReLU (0 of 5),
at width 2048 (0 of 8), with one function over both workers (0 of 8), or (weaker evidence) with each function
reading its own weight copies (0 of 16, against 2 of 16 shared in the same run). Giving the two functions'
ops distinct names did not help (1 and 3 of 8). Grappler's remapper off (``--grappler-off remapping``) did not
help either (3 of 16, 2026-12-07): the unfused ``BiasAdd`` then fails the same way, so the fused kernel is not
the cause. Reading each weight copy back on its worker before the functions run (``--sync-copies``) ended
with worker 0 killed by the kernel's OOM killer (10.8 GB resident, the machine has 24 GB) before 16 trials
were done, twice; in 2 trials, nothing failed: the workers' memory grows over trials (their weight copies
outlive ``del``: TensorFlow logs "Releasing a multi-device component handle on a remote device is not yet
implemented", so each trial's functions may keep their captures alive). Run again at once with new weight
copies (``--retry``), a failed probe ran (2 of 2; in that run worker 0 died at trial 12, the memory growth
again). ``placer.tf.timing.measure_shared_capacity`` retries so. The cause is not known; this script
reproduces it for whoever looks next. Runs itself inside a loopback-only network namespace.

    python benchmarks/probe_empty_bias.py [--width 8192] [--activation gelu] [--trials 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from isolation import isolated  # noqa: E402
from splitting import wide_mlp  # noqa: E402


def run(args: argparse.Namespace) -> int:
    import placer
    from placer.tf import timing
    from placer.tf.trace import trace_model

    if args.grappler_off:
        import tensorflow as tf
        tf.config.optimizer.set_experimental_options({o: False for o in args.grappler_off})
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        traced = trace_model(wide_mlp(args.width, 4, args.activation), batch_size=4)
        failed = 0
        for trial in range(args.trials):
            local = timing.weight_copies(traced, devices)
            if args.sync_copies:  # each copy's size read on its device and fetched before any function runs
                import tensorflow as tf
                try:
                    for device, copies in local.items():
                        with tf.device(device):
                            [float(tf.reduce_sum(v[:1] if v.shape.rank else v)) for v in copies.values()]
                except Exception:
                    for i, proc in enumerate(cluster.procs):
                        print(f"worker {i}: exit {proc.poll()}; stderr: {cluster.stderr_tail(i)[-1500:]}", flush=True)
                    raise
            placements = [devices[:1], devices]
            try:
                timing._interleaved(traced, placements, 7, 1.0, 0, local, stand_ins=placements)  # noqa: SLF001
            except Exception as e:  # noqa: BLE001 - counted and reported: what this probe is for
                failed += 1
                print(f"trial {trial}: {type(e).__name__}: {str(e).split('grpc_message')[-1][:160]}", flush=True)
                if args.retry:  # the same probe again at once, with new weight copies
                    fresh = timing.weight_copies(traced, devices)
                    try:
                        timing._interleaved(traced, placements, 7, 1.0, 0, fresh, stand_ins=placements)  # noqa: SLF001
                        print(f"trial {trial}: the retry ran", flush=True)
                    except Exception as again:  # noqa: BLE001 - reported
                        print(f"trial {trial}: the retry failed too: {type(again).__name__}", flush=True)
                    del fresh
            del local
        off = f" (grappler off: {', '.join(args.grappler_off)})" if args.grappler_off else ""
        off += ", copies synced" if args.sync_copies else ""
        print(f"{args.width} wide, {args.activation}{off}: {failed} of {args.trials} probes failed", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--activation", default="gelu", choices=("relu", "gelu"))
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--retry", action="store_true", help="after a failure, run the probe again with new copies")
    ap.add_argument("--sync-copies", action="store_true",
                    help="read every weight copy's size on its device before the functions run")
    ap.add_argument("--grappler-off", nargs="*", default=[], metavar="OPTIMIZER",
                    help="Grappler optimizers turned off in this process (tf.config.optimizer), e.g. remapping")
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
