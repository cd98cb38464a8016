"""The TensorFlow-facing stages: trace, costs, op graph, emit, placed model, report, export, and the pipeline."""
