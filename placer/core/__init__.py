"""The TensorFlow-free core: device specs, attributes, the problem builder, objectives, plans, graph files.

Nothing in this package (nor in :mod:`placer.solvers`, :mod:`placer.planner`,
:mod:`placer.reporting`, :mod:`cost_models` other than ``cost_models.profile``)
imports TensorFlow or Keras: ``tests/test_boundary.py`` reads every import
(and which folder may import which), ``tests/test_replan.py`` imports them
in a process where importing either fails.
"""
