"""Is a TensorFlow gRPC worker alive? A probe that cannot hang (no TensorFlow; grpcio, which TF depends on).

TensorFlow's own ``context.check_alive`` blocks — holding the GIL — when the
worker is frozen (stopped, swapping, deadlocked), and a placed call on such a
worker waits forever. :func:`probe_worker` instead sends the worker service's
``GetStatus`` RPC with a deadline: a live worker answers in milliseconds
(also while it computes: gRPC has its own threads), a frozen one misses the
deadline, a dead one refuses the connection.

Examples
--------
>>> probe_worker("127.0.0.1:1", timeout_s=0.5).alive
False
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

_GET_STATUS = "/tensorflow.WorkerService/GetStatus"


class WorkerState(enum.Enum):
    ALIVE = "alive"
    FROZEN = "not answering"  # connection open, no reply within the deadline
    UNREACHABLE = "unreachable"  # connection refused or reset: dead, or a wrong address


@dataclass(frozen=True)
class WorkerStatus:
    """What one probe of one worker found."""

    address: str
    state: WorkerState
    detail: str = ""
    #: A live worker's reply: a serialized ``tensorflow.GetStatusResponse`` (its devices' attributes).
    reply: bytes = b""

    @property
    def alive(self) -> bool:
        return self.state is WorkerState.ALIVE


def probe_worker(address: str, *, timeout_s: float = 5.0) -> WorkerStatus:
    """Send ``GetStatus`` to the TensorFlow worker at ``host:port`` and wait at most ``timeout_s``."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        rpc = channel.unary_unary(_GET_STATUS, request_serializer=None, response_deserializer=None)
        try:
            reply = rpc(b"", timeout=timeout_s)  # an empty GetStatusRequest
        except grpc.RpcError as e:
            code = e.code()
            state = WorkerState.FROZEN if code == grpc.StatusCode.DEADLINE_EXCEEDED else WorkerState.UNREACHABLE
            return WorkerStatus(address, state, f"{code.name}: {e.details()}")
    return WorkerStatus(address, WorkerState.ALIVE, reply=bytes(reply))
