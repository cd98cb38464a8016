"""Node and edge attribute names shared by the op graph and the graph API (no TensorFlow).

The TensorFlow op graph (:mod:`placer.tf.opgraph`) and a user's
``networkx.DiGraph`` handed to :func:`placer.solve` use the same names, so
one graph format and one problem builder (:mod:`placer.core.build`) serve
both (see ``docs/graph-format.md``). The op-type sets at the end are the
per-op knowledge the simulator's memory model reads from ``op_type``.
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
#: Node: the variable a resource placeholder holds (op graphs; names it in memory errors).
VARIABLE = "variable"
#: Node: TensorFlow op type.
OP_TYPE = "op_type"
#: Node (training steps): which part of the step the op is, one of :data:`PHASES` (default ``"forward"``).
#: A pipeline of micro-batches copies the forward and backward ops per micro-batch, orders each device's
#: copies per phase, and runs the update once (:mod:`placer.core.microbatch`).
PHASE = "phase"
#: The values of :data:`PHASE`: the forward pass and the loss, the gradients, and what runs once per step
#: (the optimizer's update, the metrics and the loss tracker).
PHASES = ("forward", "backward", "update")
#: Node: bytes of all outputs at the planning batch size.
OUTPUT_BYTES = "output_bytes"
#: Edge: bytes moved when the edge crosses devices.
BYTES = "bytes"
#: Edge: names of the tensors behind the edge (op graph), or a key that groups
#: a node's out-edges carrying the same tensor (graph API).
TENSORS = "tensors"
TENSOR = "tensor"
#: Edge (op graphs): bytes of each tensor named in ``tensors``, in the same order; with it, every
#: tensor is its own transfer (as TensorFlow sends it), sent once per receiving device.
TENSOR_BYTES = "tensor_bytes"
#: Edge: True for an ordering-only dependency.
CONTROL = "control"

# --- per-op-type knowledge of the memory model (read from ``op_type``) -------
#: Op types whose output shares a buffer that already exists (a variable's, or
#: the input's): they allocate no new memory in the simulator's peak.
ALIASING_OP_TYPES: frozenset[str] = frozenset({"ReadVariableOp", "Identity", "Reshape", "Squeeze", "ExpandDims",
                                               "StopGradient", "Snapshot", "Const"})
#: Op types whose outputs stay allocated for the whole step: the inputs a
#: caller feeds (its call frame holds them). Variables' handles are
#: placeholders too, but a handle has no bytes.
HELD_OP_TYPES: frozenset[str] = frozenset({"Placeholder"})
#: Element-wise op types whose kernels forward an input buffer to the output
#: when nothing else reads it (``forward_input_or_allocate_output``).
INPLACE_OP_TYPES: frozenset[str] = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "Tanh", "Sigmoid", "BiasAdd", "Add", "AddV2", "Sub", "Mul", "RealDiv", "Maximum",
    "Minimum", "Neg", "Square", "Sqrt", "Rsqrt", "Exp", "ReluGrad", "TanhGrad", "SigmoidGrad", "AddN", "Erf",
    "Softplus", "Softmax",
    # further cwise unary/binary kernels (UnaryOp / BinaryOp forward too)
    "Erfc", "Log", "Log1p", "Expm1", "Abs", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Softsign",
    "LeakyRelu", "Pow", "SquaredDifference", "DivNoNan", "FloorDiv", "FloorMod", "Relu6Grad", "EluGrad", "SeluGrad",
    "SoftplusGrad", "SqrtGrad", "RsqrtGrad", "LeakyReluGrad"})
#: Op types TensorFlow's graph optimizer fuses into the product before them (``_FusedMatMul``: the bias and an
#: activation): profiled with it on, the fused kernel's time lands on the last of them and the product reads
#: about 0 µs. Splitting the product (:mod:`placer.core.splits`) moves that time back onto its parts.
FUSED_AFTER_PRODUCT_OP_TYPES: frozenset[str] = frozenset({
    "BiasAdd", "Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid"})
#: The element-wise ops of a GELU (``0.5 * x * erfc(-x / √2)``, or its tanh form) after a product's bias add,
#: which TensorFlow's graph optimizer fuses into the product as one activation; the fused kernel's time lands
#: on the GELU's last op (:func:`placer.core.splits.fused_after`).
FUSED_GELU_OP_TYPES: frozenset[str] = frozenset({
    "Mul", "Neg", "Erf", "Erfc", "AddV2", "Add", "RealDiv", "Tanh", "Pow"})
