"""Node and edge attribute names shared by the op graph and the graph API (no TensorFlow).

The TensorFlow op graph (:mod:`placer.opgraph`) and a user's
``networkx.DiGraph`` handed to :func:`placer.solve` use the same names, so
one graph format serves both (see ``docs/graph-format.md``).
"""

#: Node: µs per run, a float (any device kind) or a dict device kind -> µs.
COMPUTE_US = "compute_us"
#: Node: bytes resident on the node's device (variables, optimizer slots).
MEMORY_BYTES = "memory_bytes"
#: Node: hashable key; nodes sharing it share a device.
COLOCATION = "colocation"
#: Node: device kinds with a kernel for the node (None = any).
ALLOWED_KINDS = "allowed_kinds"
#: Node: the layer scope the op belongs to (a coarsening hint).
LAYER = "layer"
#: Node: TensorFlow op type.
OP_TYPE = "op_type"
#: Node: bytes of all outputs at the planning batch size.
OUTPUT_BYTES = "output_bytes"
#: Node: position in a topological order.
TOPO = "topo_index"
#: Edge: bytes moved when the edge crosses devices.
BYTES = "bytes"
#: Edge: names of the tensors behind the edge (op graph), or a key that groups
#: a node's out-edges carrying the same tensor (graph API).
TENSORS = "tensors"
TENSOR = "tensor"
#: Edge: True for an ordering-only dependency.
CONTROL = "control"
