"""The one validation layer for numbers at the public boundary (no TensorFlow).

API options (:class:`placer.planner.PlanOptions`, ``PlacementOptions``),
:class:`~placer.core.devices.DeviceSpec`, graph files and CLI arguments all
check their numbers here: of the right type (``True`` is not a number,
``"3"`` is not an integer), finite, and inside the range the solvers and
TensorFlow can take. Each failure is the caller's
:class:`~placer.errors.AutoplaceError` subclass, naming the value and the range.

Examples
--------
>>> integer("seed", 3, maximum=MAX_SEED)
3
>>> real("time_limit_s", float("inf"), maximum=MAX_TIME_LIMIT_S)
Traceback (most recent call last):
...
placer.errors.AutoplaceError: time_limit_s must be a finite number, got inf
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from ..errors import AutoplaceError

#: A week: the longest search any option may ask for (CP-SAT's time limit overflows far above).
MAX_TIME_LIMIT_S = 7 * 24 * 3600.0
#: Seeds are 32-bit for CP-SAT and METIS.
MAX_SEED = 2**31 - 1
#: Byte counts the CP-SAT models sum over devices and nodes must stay well inside int64.
MAX_BYTES = 2**62
#: Largest planning batch (the profile materialises one batch of every input).
MAX_BATCH_SIZE = 2**24


def boolean(name: str, value: Any, *, error: type[AutoplaceError] = AutoplaceError) -> bool:
    """``value`` if it is ``True`` or ``False`` (not ``1``, not ``"yes"``).

    >>> boolean("training", True)
    True
    """
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {value!r}")
    return value


def integer(name: str, value: Any, *, minimum: int = 0, maximum: int = 2**63 - 1,
            error: type[AutoplaceError] = AutoplaceError) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]``; integral floats (``8.0``) are accepted."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be an integer, got {value!r}")
    if isinstance(value, numbers.Integral):
        out = int(value)
    elif not math.isfinite(value) or value != int(value):
        raise error(f"{name} must be an integer, got {value!r}")
    else:
        out = int(value)
    if not minimum <= out <= maximum:
        raise error(f"{name} must be between {minimum} and {maximum}, got {value!r}")
    return out


def real(name: str, value: Any, *, minimum: float = 0.0, maximum: float = math.inf, strict: bool = False,
         error: type[AutoplaceError] = AutoplaceError) -> float:
    """``value`` as a finite ``float`` in ``[minimum, maximum]`` (``(minimum, maximum]`` with ``strict``)."""
    if type(value) is not float and type(value) is not int and (  # the common cases skip the ABC check
            isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise error(f"{name} must be a number, got {value!r}")
    try:
        out = float(value)
    except OverflowError:
        raise error(f"{name} must be a finite number, got {value!r}") from None
    if not math.isfinite(out):
        raise error(f"{name} must be a finite number, got {value!r}")
    if out < minimum or (strict and out == minimum) or out > maximum:
        low = f"greater than {minimum:g}" if strict else f"at least {minimum:g}"
        raise error(f"{name} must be {low} and at most {maximum:g}, got {value!r}")
    return out
