"""Command lines of autoplace's child processes: they import only what this process imports (no TensorFlow).

``python -m pkg.mod`` puts the *current directory* first on the child's
``sys.path``, so a folder named ``ortools`` or ``tensorflow`` where the user
happens to stand would be imported instead of the installed package.
:func:`python_module_command` starts the module from a one-line bootstrap
that drops that entry before anything is imported; the child's path is this
process's own ``sys.path`` (passed as ``PYTHONPATH`` by :func:`child_environment`),
so it finds the same installed packages — and ``placer`` itself, installed or
not — and nothing else.

Examples
--------
>>> cmd = python_module_command("placer.solvers._child", "x")
>>> cmd[1:2], cmd[-2:]
(['-c'], ['placer.solvers._child', 'x'])
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

#: Runs ``sys.argv[1]`` as ``__main__`` with the remaining arguments, after removing the entry that
#: ``-c`` put first on ``sys.path`` (the current directory). Nothing is imported before that.
_BOOTSTRAP = ("import sys; del sys.path[0]; import runpy; "
              "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def python_module_command(module: str, *args: str) -> list[str]:
    """``[python, -c, BOOTSTRAP, module, *args]``: run ``module`` like ``-m`` without the current directory."""
    return [sys.executable, "-c", _BOOTSTRAP, module, *args]


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with ``PYTHONPATH`` = its own absolute ``sys.path`` (plus ``extra``).

    Relative and empty entries (the current directory) are left out.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isabs(p))
    env.update(extra or {})
    return env
