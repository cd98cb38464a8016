"""The TensorFlow-free core: device specs, attributes, the problem builder, objectives, plans, graph files.

Nothing in this package (nor in :mod:`placer.solvers`, :mod:`placer.planner`,
:mod:`cost_models` other than ``cost_models.profile``) imports TensorFlow or
Keras; ``tests/test_boundary.py`` checks it in a process where importing
either fails.
"""
