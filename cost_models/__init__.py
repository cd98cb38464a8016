"""Cost models of autoplace: compute (measured), communication, simulation.

This package never imports :mod:`placer`; the solver and simulator modules
import no TensorFlow either (only :mod:`cost_models.profile` does).
"""

from .comm import CalibrationError, Link, LinkFit, fit_link
from .simulate import Dependencies, MemoryTraits, SimOptions, SimResult, TensorEdge, dependencies_of, simulate

__all__ = ["CalibrationError", "Link", "LinkFit", "fit_link", "Dependencies", "MemoryTraits", "SimOptions", "SimResult",
           "TensorEdge", "dependencies_of", "simulate"]
