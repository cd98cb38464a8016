"""Child-process entry of the CP-SAT solver (see :mod:`placer.solvers.cpsat`).

Reads a pickled ``(PlacementProblem, SolveOptions)`` from stdin and writes the
pickled ``Solution`` (or ``None``) to stdout. Never imports TensorFlow.
"""

import pickle
import sys

from placer.solvers.cpsat import _solve

if __name__ == "__main__":
    problem, options = pickle.loads(sys.stdin.buffer.read())
    sys.stdout.buffer.write(pickle.dumps(_solve(problem, options)))
