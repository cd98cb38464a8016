"""Cost models of autoplace: compute (measured), communication, simulation.

This package never imports :mod:`placer`; the solver and simulator modules
import no TensorFlow either (only :mod:`cost_models.profile` does).
"""

from .comm import CalibrationError, Link, LinkFit, fit_link
from .simulate import MemoryTraits, SimOptions, SimResult, TensorEdge, simulate

__all__ = ["CalibrationError", "Link", "LinkFit", "fit_link", "MemoryTraits", "SimOptions", "SimResult", "TensorEdge",
           "simulate"]
