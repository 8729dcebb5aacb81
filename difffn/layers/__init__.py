"""Built-in layers (MATLAB Deep Learning Toolbox's layer functions), as ``df.Layer`` pytrees.

This module only re-exports; each family of layers lives in one private module.
"""

from ._activation import ELU as ELU
from ._activation import ReLU as ReLU
from ._activation import Softmax as Softmax
from ._attention import SelfAttention as SelfAttention
from ._convolution import Conv2D as Conv2D
from ._dropout import Dropout as Dropout
from ._embedding import Embedding as Embedding
from ._embedding import PositionEmbedding as PositionEmbedding
from ._embedding import SinusoidalPositionEncoding as SinusoidalPositionEncoding
from ._flatten import Flatten as Flatten
from ._from_equinox import FromEquinox as FromEquinox
from ._from_nnx import FromNNX as FromNNX
from ._fully_connected import FullyConnected as FullyConnected
from ._function_layer import FunctionLayer as FunctionLayer
from ._gru import GRU as GRU
from ._input import FeatureInput as FeatureInput
from ._input import ImageInput as ImageInput
from ._input import SequenceInput as SequenceInput
from ._merge import Addition as Addition
from ._merge import Concatenation as Concatenation
from ._normalization import BatchNorm as BatchNorm
from ._placeholder import Placeholder as Placeholder
from ._pooling import GlobalAveragePool2D as GlobalAveragePool2D
from ._pooling import MaxPool2D as MaxPool2D
from ._recurrent import LSTM as LSTM
from ._recurrent import BiLSTM as BiLSTM

__all__ = [
    "Addition",
    "BatchNorm",
    "BiLSTM",
    "Concatenation",
    "Conv2D",
    "Dropout",
    "ELU",
    "Embedding",
    "FeatureInput",
    "Flatten",
    "FromEquinox",
    "FromNNX",
    "FullyConnected",
    "FunctionLayer",
    "GRU",
    "GlobalAveragePool2D",
    "ImageInput",
    "LSTM",
    "MaxPool2D",
    "Placeholder",
    "PositionEmbedding",
    "ReLU",
    "SelfAttention",
    "SequenceInput",
    "SinusoidalPositionEncoding",
    "Softmax",
]
