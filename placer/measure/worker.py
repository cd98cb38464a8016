"""One TensorFlow gRPC worker process, started by :class:`placer.measure.cluster.LocalCluster`.

``python -m placer.measure.worker CLUSTER_JSON TASK_INDEX THREADS``
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> None:
    cluster, task, threads = json.loads(argv[0]), int(argv[1]), int(argv[2])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=task, config=cfg,
                                  start=True)
    server.join()


if __name__ == "__main__":
    main(sys.argv[1:])
