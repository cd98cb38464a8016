"""autoplace: automatic model-parallel placement for Keras 3 / TensorFlow.

The public API is imported lazily so that the TensorFlow-free part
(:mod:`placer.core`, :mod:`placer.solvers`, :func:`placer.solve`) can be
used without paying for (or even having) TensorFlow. The folders are the
pipeline's stages: ``core/`` and ``solvers/`` never import TensorFlow,
``tf/`` holds the stages that do, ``measure/`` the measurement tools
(``docs/design.md``).

Examples
--------
>>> import placer
>>> sorted(placer.solvers.available_solvers())[:3]
['auto', 'contiguous', 'contiguous_dp']
"""

from __future__ import annotations

import importlib
from typing import Any

from .core.devices import DeviceSpec
from .errors import (
    AutoplaceError,
    CostError,
    DeviceError,
    ExportError,
    GraphError,
    InputSignatureError,
    InsufficientMemoryError,
    ModelError,
    NoFeasiblePlanError,
    OutputError,
    PlanError,
    ReportError,
    SolverError,
    TrainingError,
    UnsupportedError,
    WorkerError,
)

__version__ = "0.1.0"

_LAZY = {
    "autoplace": ("placer.tf.runner", "autoplace"),
    "PlacementOptions": ("placer.tf.options", "PlacementOptions"),
    "PlacedModel": ("placer.tf.placed_model", "PlacedModel"),
    "Plan": ("placer.core.plan", "Plan"),
    "solvers": ("placer.solvers", None),
    "solve": ("placer.planner", "solve"),
    "PlanOptions": ("placer.planner", "PlanOptions"),
    "load_graph": ("placer.core.graph_io", "load_graph"),
    "load": ("placer.tf.export", "load"),
    "LoadedModel": ("placer.tf.export", "LoadedModel"),
    "save_graph": ("placer.core.graph_io", "save_graph"),
    "connect": ("placer.measure.cluster", "connect"),
    "LocalCluster": ("placer.measure.cluster", "LocalCluster"),
}

__all__ = [
    "AutoplaceError", "CostError", "DeviceError", "DeviceSpec", "ExportError", "GraphError",
    "InputSignatureError", "InsufficientMemoryError", "ModelError", "NoFeasiblePlanError", "OutputError", "PlanError",
    "ReportError", "SolverError", "TrainingError", "UnsupportedError", "WorkerError", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        return mod if attr is None else getattr(mod, attr)
    raise AttributeError(f"module 'placer' has no attribute {name!r}")
