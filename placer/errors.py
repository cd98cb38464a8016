"""The one exception hierarchy of autoplace.

Every error the library raises on bad input or an impossible request is an
:class:`AutoplaceError`. Each message says what went wrong *and* what to do.

Examples
--------
>>> from placer.errors import AutoplaceError, DeviceError
>>> issubclass(DeviceError, AutoplaceError)
True
"""

from __future__ import annotations


class AutoplaceError(Exception):
    """Base class of every error autoplace raises on purpose.

    Attributes
    ----------
    stage : str or None
        The pipeline stage of :func:`placer.autoplace` that raised it (``None``
        outside the pipeline); the message then starts with it.
    """

    stage: str | None = None

    def in_stage(self, stage: str) -> "AutoplaceError":
        """Record the pipeline stage that raised this error and name it in the message (once)."""
        if self.stage is None:
            self.stage = stage
            self.args = (f"[{stage} stage] {self.args[0] if self.args else ''}", *self.args[1:])
        return self


class ModelError(AutoplaceError, TypeError):
    """The object given is not a usable Keras 3 model."""


class InputSignatureError(AutoplaceError, ValueError):
    """Input shapes are missing or ambiguous (e.g. unknown batch dimension)."""


class DeviceError(AutoplaceError, ValueError):
    """A device list is empty, malformed, duplicated or names a missing device."""


class GraphError(AutoplaceError, ValueError):
    """A placement graph is malformed: cycles, missing or invalid attributes."""


class CostError(GraphError):
    """A cost is negative, NaN or infinite, or could not be measured."""


class InsufficientMemoryError(AutoplaceError):
    """The model's resident memory does not fit the declared device memory."""


class NoFeasiblePlanError(AutoplaceError):
    """No placement satisfying all constraints was found in the time limit."""


class PlanError(AutoplaceError, ValueError):
    """A saved plan is malformed or does not fit the graph or devices it is applied to."""


class ReportError(AutoplaceError, ValueError):
    """A report file is not a report, is of an unknown version, or does not match its schema."""


class SolverError(AutoplaceError, ValueError):
    """An unknown solver name or a solver used outside its domain."""


class ExportError(AutoplaceError):
    """A placed model could not be exported."""


class TrainingError(AutoplaceError, ValueError):
    """Placed training cannot run as asked: no optimizer or loss, a placement made for inference,
    labels that do not fit the model, replicas that do not divide the devices or the batch."""


class OutputError(AutoplaceError, OSError):
    """An output path cannot be written: a missing or read-only folder, a full disk, a folder where a file
    goes, or a path that is also an input."""


class WorkerError(AutoplaceError, RuntimeError):
    """A remote worker died, froze or cannot be reached while autoplace (or a placed call) used it."""


class UnsupportedError(AutoplaceError, NotImplementedError):
    """A feature autoplace does not have yet (the message says which)."""
