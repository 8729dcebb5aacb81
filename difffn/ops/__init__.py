"""Format-aware functional operations (MATLAB's dlconv, fullyconnect, batchnorm, ... in snake_case).

Each op reads the axes it works on from its input's format (a ``df.FormattedArray``, or a plain
array with ``fmt=``), keeps formats on its outputs with the labels MATLAB gives, and is a pure JAX
function (jit, vmap and grad apply). This module only re-exports; each family of operations lives
in one private module.
"""

from ._activation import clipped_relu as clipped_relu
from ._activation import elu as elu
from ._activation import gelu as gelu
from ._activation import leaky_relu as leaky_relu
from ._activation import relu as relu
from ._activation import sigmoid as sigmoid
from ._activation import softmax as softmax
from ._activation import swish as swish
from ._activation import tanh as tanh
from ._attention import attention as attention
from ._conv import conv as conv
from ._conv import conv_transpose as conv_transpose
from ._embedding import embed as embed
from ._embedding import onehot_decode as onehot_decode
from ._embedding import onehot_encode as onehot_encode
from ._fully_connect import fully_connect as fully_connect
from ._normalization import batchnorm as batchnorm
from ._normalization import groupnorm as groupnorm
from ._normalization import instancenorm as instancenorm
from ._normalization import layernorm as layernorm
from ._pooling import avg_pool as avg_pool
from ._pooling import max_pool as max_pool
from ._recurrent import gru as gru
from ._recurrent import lstm as lstm
