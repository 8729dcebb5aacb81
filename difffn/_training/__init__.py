"""Training: options, solvers and schedules on optax, the compiled step, checkpoints, the loop.

`TrainingOptions` as one table with its validators, `trainnet` and its argument forms, the
custom-loop updates (`sgdmupdate`, `adamupdate`, `rmspropupdate`, `dlupdate`), the compute
precision, the run's fingerprint, the jitted step, the checkpointed state, checkpoints and the
training history, progress output.

This file is the package's internal API: the floors above import these names from here, and
nothing else from the package's modules (tests/test_architecture.py holds it).
"""

from ._checkpoint import CheckpointWarning as CheckpointWarning
from ._checkpoint_fields import DataWarning as DataWarning
from ._dlupdate import dlupdate as dlupdate
from ._options import TrainingOptions as TrainingOptions
from ._precision import DTYPES as DTYPES
from ._solvers import SolverWarning as SolverWarning
from ._solvers import adamupdate as adamupdate
from ._solvers import rmspropupdate as rmspropupdate
from ._solvers import sgdmupdate as sgdmupdate
from ._state import TrainingInfo as TrainingInfo
from ._trainer import trainnet as trainnet

__all__ = [
    "DataWarning",
    "CheckpointWarning",
    "SolverWarning",
    "DTYPES",
    "TrainingInfo",
    "TrainingOptions",
    "adamupdate",
    "dlupdate",
    "rmspropupdate",
    "sgdmupdate",
    "trainnet",
]
