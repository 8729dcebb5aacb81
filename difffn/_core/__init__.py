"""The ground floor: errors, the words of messages, formats and formatted arrays, data as numbers.

The `df.Error` family; `who(layer)` and the other words of messages; format labels,
`FormattedArray`, `dlarray`/`dims`/`finddim`/`stripdims`/`permute`, `Layout`; what counts as a
key; opening files without leaving the user's folder (`files`); strings, ragged lists and complex
data named before JAX sees them; observations along the batch axis; padding masks; what a user
method takes (signatures); the XLA compile options of set-up programs (`compile_once`,
`run_once`) and of trainnet's CPU kernels (`kernel_options`); running user code so that what
JAX cannot trace is a named error.

This file is the package's internal API: the floors above import these names from here, and
nothing else from the package's modules (tests/test_architecture.py holds it).
"""

from . import _batches as batches
from . import _files as files
from . import _mask as mask
from . import _user_code as user_code
from ._arrays import as_numbers as as_numbers
from ._arrays import check_numbers as check_numbers
from ._arrays import to_device as to_device
from ._batches import as_device_array as as_device_array
from ._batches import batch_axis as batch_axis
from ._batches import count as count
from ._batches import pad_with_first as pad_with_first
from ._compiler_options import compile_once as compile_once
from ._compiler_options import kernel_options as kernel_options
from ._compiler_options import run_once as run_once
from ._describe import is_array as is_array
from ._describe import raised_at as raised_at
from ._describe import short as short
from ._describe import who as who
from ._errors import AccelerationError as AccelerationError
from ._errors import BackwardError as BackwardError
from ._errors import CheckError as CheckError
from ._errors import DifferentiableFunctionError as DifferentiableFunctionError
from ._errors import Error as Error
from ._errors import FormatError as FormatError
from ._errors import ForwardError as ForwardError
from ._errors import ForwardModeError as ForwardModeError
from ._errors import HigherOrderError as HigherOrderError
from ._errors import LayerError as LayerError
from ._errors import MissingDependencyError as MissingDependencyError
from ._errors import NetworkError as NetworkError
from ._errors import ONNXExportError as ONNXExportError
from ._errors import ONNXImportError as ONNXImportError
from ._errors import OpError as OpError
from ._errors import OptionsError as OptionsError
from ._errors import SerializationError as SerializationError
from ._errors import type_name as type_name
from ._format import FormattedArray as FormattedArray
from ._format import Layout as Layout
from ._format import _validate_format as validate_format
from ._format import dims as dims
from ._format import dlarray as dlarray
from ._format import finddim as finddim
from ._format import permute as permute
from ._format import stripdims as stripdims
from ._formatted_array import asarray as asarray
from ._keys import check_key as check_key
from ._mask import as_mask as as_mask
from ._mask import fits as fits
from ._mask import spread as spread
from ._mask import value_axes as value_axes
from ._moved import current_path as current_path
from ._moved import former_path as former_path
from ._signatures import LAYER_METHODS as LAYER_METHODS
from ._signatures import accepts_key as accepts_key
from ._signatures import accepts_mask as accepts_mask
from ._signatures import backward_takes_state as backward_takes_state
from ._signatures import has_backward as has_backward
from ._signatures import has_method as has_method
from ._signatures import positional as positional
from ._signatures import predict_arity as predict_arity
from ._types import Data as Data
from ._types import Output as Output
from ._types import PyTree as PyTree
from ._user_code import CONCRETIZATION_ERRORS as CONCRETIZATION_ERRORS
from ._version import __version__ as __version__

__all__ = [
    "current_path",
    "former_path",
    "AccelerationError",
    "BackwardError",
    "CONCRETIZATION_ERRORS",
    "CheckError",
    "DifferentiableFunctionError",
    "Error",
    "FormatError",
    "FormattedArray",
    "Data",
    "Output",
    "PyTree",
    "ForwardError",
    "ForwardModeError",
    "HigherOrderError",
    "LAYER_METHODS",
    "LayerError",
    "Layout",
    "MissingDependencyError",
    "NetworkError",
    "ONNXExportError",
    "ONNXImportError",
    "OpError",
    "OptionsError",
    "SerializationError",
    "__version__",
    "validate_format",
    "accepts_key",
    "accepts_mask",
    "as_device_array",
    "as_mask",
    "as_numbers",
    "asarray",
    "backward_takes_state",
    "batch_axis",
    "batches",
    "check_key",
    "check_numbers",
    "compile_once",
    "count",
    "dims",
    "dlarray",
    "files",
    "finddim",
    "fits",
    "has_backward",
    "has_method",
    "is_array",
    "kernel_options",
    "mask",
    "pad_with_first",
    "permute",
    "positional",
    "predict_arity",
    "raised_at",
    "run_once",
    "short",
    "spread",
    "stripdims",
    "to_device",
    "type_name",
    "user_code",
    "value_axes",
    "who",
]
