"""difffn: MATLAB Deep Learning Toolbox's custom-layer machinery, on JAX.

This module only re-exports; each concept lives in one private module.
"""

from . import data as data
from . import layers as layers
from . import losses as losses
from . import metrics as metrics
from ._cache import RetraceWarning as RetraceWarning
from ._check_function import check_function as check_function
from ._check_layer import check_layer as check_layer
from ._check_report import CheckReport as CheckReport
from ._checkpoint import CheckpointWarning as CheckpointWarning
from ._deploy import ExportedNetwork as ExportedNetwork
from ._deploy import export as export
from ._deploy import load_exported as load_exported
from ._errors import AccelerationError as AccelerationError
from ._errors import BackwardError as BackwardError
from ._errors import CheckError as CheckError
from ._errors import DifferentiableFunctionError as DifferentiableFunctionError
from ._errors import Error as Error
from ._errors import FormatError as FormatError
from ._errors import ForwardError as ForwardError
from ._errors import ForwardModeError as ForwardModeError
from ._errors import LayerError as LayerError
from ._errors import NetworkError as NetworkError
from ._errors import ONNXExportError as ONNXExportError
from ._errors import ONNXImportError as ONNXImportError
from ._errors import OptionsError as OptionsError
from ._errors import SerializationError as SerializationError
from ._factors import get_l2_factor as get_l2_factor
from ._factors import get_learn_rate_factor as get_learn_rate_factor
from ._factors import set_l2_factor as set_l2_factor
from ._factors import set_learn_rate_factor as set_learn_rate_factor
from ._format import FormattedArray as FormattedArray
from ._format import Layout as Layout
from ._format import dims as dims
from ._format import dlarray as dlarray
from ._format import finddim as finddim
from ._format import permute as permute
from ._format import stripdims as stripdims
from ._function import DifferentiableFunction as DifferentiableFunction
from ._layer import InputLayer as InputLayer
from ._layer import Layer as Layer
from ._layer import learnable as learnable
from ._layer import state as state
from ._network import Network as Network
from ._onnx import import_onnx as import_onnx
from ._options import TrainingOptions as TrainingOptions
from ._predict import minibatchpredict as minibatchpredict
from ._predict import scores2label as scores2label
from ._predict import testnet as testnet
from ._serialization import load as load
from ._serialization import save as save
from ._solvers import adamupdate as adamupdate
from ._solvers import rmspropupdate as rmspropupdate
from ._solvers import sgdmupdate as sgdmupdate
from ._table import ParameterTable as ParameterTable
from ._trainer import TrainingInfo as TrainingInfo
from ._trainer import trainnet as trainnet

__version__ = "0.1.0"
