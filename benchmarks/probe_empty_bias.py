"""Probe: a worker's fused product reading an empty bias ("Must provide as many biases as the channel size: [0]").

The hosts stage's shared-capacity probe (``placer.tf.timing.measure_shared_capacity`` on gRPC workers) times
one copy of the model on worker 0 and copies on workers 0 and 1 in turn, both functions reading the same
weight copies on worker 0. With a chain of 4 dense layers of 8192 and GELU, a call fails with the error above at
the last layer's fused ``MatMul + BiasAdd + GELU`` on worker 0 in about one probe in four (2026-12-06: 1, 2,
3, 1 and 3 of 8), although every weight copy reads back whole after the failure. Not seen with ReLU (0 of 5),
at width 2048 (0 of 8), with one function over both workers (0 of 8), or (weaker evidence) with each function
reading its own weight copies (0 of 16, against 2 of 16 shared in the same run). Giving the two functions'
ops distinct names did not help (1 and 3 of 8). The cause is not known; this script reproduces it for
whoever looks next. Runs itself inside a loopback-only network namespace.

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

    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        traced = trace_model(wide_mlp(args.width, 4, args.activation), batch_size=4)
        failed = 0
        for trial in range(args.trials):
            local = timing.weight_copies(traced, devices)
            placements = [devices[:1], devices]
            try:
                timing._interleaved(traced, placements, 7, 1.0, 0, local, stand_ins=placements)  # noqa: SLF001
            except Exception as e:  # noqa: BLE001 - counted and reported: what this probe is for
                failed += 1
                print(f"trial {trial}: {type(e).__name__}: {str(e).split('grpc_message')[-1][:160]}", flush=True)
            del local
        print(f"{args.width} wide, {args.activation}: {failed} of {args.trials} probes failed", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--activation", default="gelu", choices=("relu", "gelu"))
    ap.add_argument("--trials", type=int, default=8)
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
