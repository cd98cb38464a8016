"""Measurement tools on real devices, for the TensorFlow back end to call (they never call back into it).

:mod:`.links` (link calibration, the fixed cost of a call), :mod:`.hosts` (which processes share a
machine, their executors' ready order, the arithmetic of shared capacity), :mod:`.steps` (interleaved step
timing), :mod:`.cluster` and :mod:`.worker` (local gRPC clusters), :mod:`.health` (worker probes).
"""
