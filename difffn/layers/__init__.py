"""Built-in layers (MATLAB Deep Learning Toolbox's layer functions), as ``df.Layer`` pytrees.

This module only re-exports; each family of layers lives in one private module.
"""

from ._activation import ELU as ELU
from ._activation import GELU as GELU
from ._activation import ClippedReLU as ClippedReLU
from ._activation import LeakyReLU as LeakyReLU
from ._activation import ReLU as ReLU
from ._activation import Sigmoid as Sigmoid
from ._activation import Softmax as Softmax
from ._activation import Swish as Swish
from ._activation import Tanh as Tanh
from ._attention import SelfAttention as SelfAttention
from ._convolution import Conv1D as Conv1D
from ._convolution import Conv2D as Conv2D
from ._convolution import Conv3D as Conv3D
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
from ._identity import Identity as Identity
from ._input import FeatureInput as FeatureInput
from ._input import ImageInput as ImageInput
from ._input import SequenceInput as SequenceInput
from ._merge import Addition as Addition
from ._merge import Concatenation as Concatenation
from ._merge import Multiplication as Multiplication
from ._normalization import BatchNorm as BatchNorm
from ._normalization import GroupNorm as GroupNorm
from ._normalization import InstanceNorm as InstanceNorm
from ._normalization import LayerNorm as LayerNorm
from ._placeholder import Placeholder as Placeholder
from ._pooling import AveragePool2D as AveragePool2D
from ._pooling import GlobalAveragePool2D as GlobalAveragePool2D
from ._pooling import GlobalMaxPool2D as GlobalMaxPool2D
from ._pooling import MaxPool2D as MaxPool2D
from ._pooling_1d import AveragePool1D as AveragePool1D
from ._pooling_1d import GlobalAveragePool1D as GlobalAveragePool1D
from ._pooling_1d import GlobalMaxPool1D as GlobalMaxPool1D
from ._pooling_1d import MaxPool1D as MaxPool1D
from ._recurrent import LSTM as LSTM
from ._recurrent import BiLSTM as BiLSTM
from ._resize import Resize2D as Resize2D
from ._transposed_convolution import TransposedConv2D as TransposedConv2D

__all__ = [
    "Addition",
    "AveragePool1D",
    "AveragePool2D",
    "BatchNorm",
    "BiLSTM",
    "ClippedReLU",
    "Concatenation",
    "Conv1D",
    "Conv2D",
    "Conv3D",
    "Dropout",
    "ELU",
    "Embedding",
    "FeatureInput",
    "Flatten",
    "FromEquinox",
    "FromNNX",
    "FullyConnected",
    "FunctionLayer",
    "GELU",
    "GRU",
    "GlobalAveragePool1D",
    "GlobalAveragePool2D",
    "GlobalMaxPool1D",
    "GlobalMaxPool2D",
    "GroupNorm",
    "Identity",
    "ImageInput",
    "InstanceNorm",
    "LSTM",
    "LayerNorm",
    "LeakyReLU",
    "MaxPool1D",
    "MaxPool2D",
    "Multiplication",
    "Placeholder",
    "PositionEmbedding",
    "ReLU",
    "Resize2D",
    "SelfAttention",
    "SequenceInput",
    "Sigmoid",
    "SinusoidalPositionEncoding",
    "Softmax",
    "Swish",
    "Tanh",
    "TransposedConv2D",
]
