"""Data in mini-batches: training data sources, sequences of different lengths, prediction.

Array and iterable data sources for training (`source`, `validation_batches`), lists of sequences
(padding, splitting, buckets), `minibatchpredict`/`testnet`/`scores2label`, `minibatchqueue`
(mini-batches for custom loops and trainnet), and data described by shape, dtype and hash.

This file is the package's internal API: the floors above import these names from here, and
nothing else from the package's modules (tests/test_architecture.py holds it).
"""

from . import _sequence_source as sequence_source
from . import _sequences as sequences
from ._data_description import describe_array as describe_array
from ._data_description import describe_data as describe_data
from ._minibatchqueue import MiniBatchQueue as MiniBatchQueue
from ._minibatchqueue import minibatchqueue as minibatchqueue
from ._predict import minibatchpredict as minibatchpredict
from ._predict import scores2label as scores2label
from ._predict import testnet as testnet
from ._sequences import SequenceOptions as SequenceOptions
from ._sequences import padsequences as padsequences
from ._sources import ArraySource as ArraySource
from ._sources import IterableSource as IterableSource
from ._sources import gather_batch as gather_batch
from ._sources import global_batch as global_batch
from ._sources import label_check as label_check
from ._sources import validation_batches as validation_batches

__all__ = [
    "ArraySource",
    "IterableSource",
    "MiniBatchQueue",
    "SequenceOptions",
    "describe_array",
    "describe_data",
    "gather_batch",
    "global_batch",
    "label_check",
    "minibatchqueue",
    "minibatchpredict",
    "padsequences",
    "scores2label",
    "sequence_source",
    "sequences",
    "testnet",
    "validation_batches",
]
