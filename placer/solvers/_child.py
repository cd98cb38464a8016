"""Child-process entry of the CP-SAT solver (see :mod:`placer.solvers.cpsat`).

Reads a pickled ``(PlacementProblem, SolveOptions)`` from stdin and writes the
pickled ``CpSatResult`` to stdout; warnings go to stderr, which the
parent logs again. Never imports TensorFlow.
"""

import logging
import pickle
import sys

from placer.solvers.cpsat import _solve

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    problem, options = pickle.loads(sys.stdin.buffer.read())
    sys.stdout.buffer.write(pickle.dumps(_solve(problem, options)))
