"""autoplace: automatic model-parallel placement for Keras 3 / TensorFlow.

The public API is imported lazily so that the pure solver modules
(:mod:`placer.solvers`, :mod:`placer.problem`) can be used without paying
for (or even having) TensorFlow.

Examples
--------
>>> import placer
>>> sorted(placer.solvers.available_solvers())[:3]
['auto', 'contiguous', 'cpsat']
"""

from __future__ import annotations

import importlib
from typing import Any

from .devices import DeviceSpec
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
    SolverError,
    UnsupportedError,
)

__version__ = "0.1.0"

_LAZY = {
    "autoplace": ("placer.api", "autoplace"),
    "PlacementOptions": ("placer.api", "PlacementOptions"),
    "PlacedModel": ("placer.placed_model", "PlacedModel"),
    "Plan": ("placer.plan", "Plan"),
    "solvers": ("placer.solvers", None),
    "solve": ("placer.placement", "solve"),
    "Placement": ("placer.placement", "Placement"),
    "load_graph": ("placer.graphs", "load_graph"),
    "save_graph": ("placer.graphs", "save_graph"),
}

__all__ = [
    "AutoplaceError", "CostError", "DeviceError", "DeviceSpec", "ExportError", "GraphError",
    "InputSignatureError", "InsufficientMemoryError", "ModelError", "NoFeasiblePlanError",
    "SolverError", "UnsupportedError", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        return mod if attr is None else getattr(mod, attr)
    raise AttributeError(f"module 'placer' has no attribute {name!r}")
