"""The TensorFlow back end, bottom to top (``docs/design.md``, the map; ``tests/test_boundary.py`` keeps it so).

* :mod:`.graphdef` — GraphDef facts every other module builds on (names, scopes, inputs, devices).
* :mod:`.trace`, :mod:`.remote`, :mod:`.codecs` — the trace stage, watched calls on workers, each codec's ops.
* :mod:`.opgraph`, :mod:`.timing`, :mod:`.replicas`, :mod:`.training` — the graph stage, the traced model's
  copies timed, replicated training steps, the training trace.
* :mod:`.costs`, :mod:`.rewrites` — the costs stage; the rewrites of an emitted graph, one file each.
* :mod:`.emit` — a trace rewritten and imported into a placed ``tf.function``.
* :mod:`.report`, :mod:`.export`, :mod:`.measuring` — the report, SavedModel exports and ``load``, ``measure``.
* :mod:`.placement` — variables on their devices, the placed functions, the frozen placement record.
* :mod:`.placed_model`, :mod:`.options` — the Keras-facing placed model; the options, one group per stage.
* :mod:`.runner` — ``autoplace`` and ``profile``: the stages in order.
"""
