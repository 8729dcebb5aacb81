"""Format-aware functional operations (MATLAB's dlconv, fullyconnect, batchnorm, ... in snake_case).

Each op reads the axes it works on from its input's format (a ``df.FormattedArray``, or a plain
array with ``fmt=``), keeps formats on its outputs with the labels MATLAB gives, and is a pure JAX
function (jit, vmap and grad apply). This module only re-exports; each family of operations lives
in one private module.
"""

from ._attention import attention as attention
from ._embedding import embed as embed
from ._embedding import onehot_decode as onehot_decode
from ._embedding import onehot_encode as onehot_encode
from ._recurrent import gru as gru
from ._recurrent import lstm as lstm
