"""One TensorFlow gRPC worker process, started by :class:`placer.measure.cluster.LocalCluster`.

``python -m placer.measure.worker CLUSTER_JSON TASK_INDEX THREADS [PROFILER_PORT]``

With ``PROFILER_PORT`` the worker also runs TensorFlow's profiler server there
(``tf.profiler.experimental.server.start``), so that a client can trace its
ops (``tf.profiler.experimental.client.trace``; docs/costs.md, "How to look
inside a worker").
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> None:
    cluster, task, threads = json.loads(argv[0]), int(argv[1]), int(argv[2])
    profiler_port = int(argv[3]) if len(argv) > 3 else None
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=task, config=cfg,
                                  start=True)
    if profiler_port is not None:
        tf.profiler.experimental.server.start(profiler_port)
    server.join()


if __name__ == "__main__":
    main(sys.argv[1:])
