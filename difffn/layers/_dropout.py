"""``Dropout``: MATLAB's ``dropoutLayer``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._core import Data, LayerError, Output
from .._layer import Layer
from ._checks import real, who


class Dropout(Layer):
    """Randomly zero elements during training (MATLAB's ``dropoutLayer``); any format.

    Training (``forward``) keeps each element with probability ``1 - probability`` and scales the
    kept ones by ``1 / (1 - probability)``, so the expected value is unchanged; it needs an
    explicit ``key``. Inference (``predict``) is the identity.

    Args:
      probability: the probability of dropping an element, in [0, 1) (default 0.5).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.Dropout(0.5)
      >>> layer(jnp.ones(4))
      Array([1., 1., 1., 1.], dtype=float32)
      >>> y = layer.forward(jnp.ones(1000), key=jax.random.key(0))  # training
      >>> sorted(set(y.tolist())), bool(abs(y.mean() - 1) < 0.1)
      ([0.0, 2.0], True)
    """

    probability: float = 0.5

    def __post_init__(self) -> None:
        self.probability = real(
            self,
            "probability",
            self.probability,
            low=0.0,
            high=1.0,
            open_high=True,
            expected="a number in [0, 1)",
            fix="e.g. Dropout(0.5) (MATLAB's default); 1 would drop everything.",
        )

    def predict(self, x: Data) -> Output:
        return x

    def forward(self, x: Data, *, key: jax.Array | None = None) -> Output:
        if key is None:
            raise LayerError(
                f"{who(self)}: training-time dropout needs randomness, but no key was given. "
                "Fix: pass key=jax.random.key(...) (e.g. net.forward(x, key=key), or "
                "call_layer(layer, (x,), training=True, key=key))."
            )
        if self.probability == 0:
            return x
        keep = 1.0 - self.probability
        mask = jax.random.bernoulli(key, keep, jnp.shape(x))
        return jnp.where(mask, x / keep, 0)
