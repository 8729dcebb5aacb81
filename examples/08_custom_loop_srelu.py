"""08: a model function with a custom operation, trained in a custom loop with ``df.adamupdate``.

The model is a plain function of a dict of parameters and a dict of state:

    convolution -> batch normalization -> SReLU (a DifferentiableFunction) -> fully connected
    -> softmax

SReLU has a hand-written backward (see example 01 for the derivation); batch normalization keeps
running statistics as state, updated in training mode like MATLAB's ``batchnorm`` in a model
function. The loop is the classic custom training loop: shuffle every epoch, compute the loss
and its gradients, update the parameters with ``df.adamupdate`` (MATLAB's Adam, bias-corrected
by the iteration number), and at the end classify the test digits.

The whole step (forward, backward, Adam update, state update) is one ``jax.jit`` function.

Run: ``python examples/08_custom_loop_srelu.py [--small]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from srelu_sums import srelu_parameter_gradients  # this folder's one-pass sums

import difffn as df


class SReLU(df.DifferentiableFunction):
    """S-shaped ReLU with per-channel thresholds ``tl, tr`` and slopes ``al, ar`` (NHWC data)."""

    save_inputs_for_backward = True

    def forward(self, x, tl, al, tr, ar):
        return jnp.where(x <= tl, tl + al * (x - tl), jnp.where(x >= tr, tr + ar * (x - tr), x))

    def backward(self, dy, compute_gradients, x, tl, al, tr, ar):
        left, right = x <= tl, x >= tr
        dx = dy * jnp.where(left, al, jnp.where(right, ar, 1.0)) if compute_gradients[0] else None
        # the parameters broadcast over batch and space: sums over those axes, in one pass
        grads = srelu_parameter_gradients((0, 1, 2), x, dy, left, right, tl, al, tr, ar)
        return dx, *(g if w else None for g, w in zip(grads, compute_gradients[1:]))


srelu = SReLU()


def init_model(key, *, filters: int, classes: int = 10):
    k_conv, k_fc = jax.random.split(key)
    fan_in, fan_out = 3 * 3 * 1, 3 * 3 * filters
    conv = jax.random.uniform(k_conv, (3, 3, 1, filters), minval=-1, maxval=1)
    features = 6 * 6 * filters
    fc = jax.random.uniform(k_fc, (features, classes), minval=-1, maxval=1)
    channel = (1, 1, 1, filters)
    params = {
        # Glorot-uniform weights, zero biases, MATLAB's batch-norm and SReLU starting values
        "conv_w": conv * jnp.sqrt(6 / (fan_in + fan_out)),
        "conv_b": jnp.zeros((filters,)),
        "bn_offset": jnp.zeros(channel),
        "bn_scale": jnp.ones(channel),
        "tl": jnp.zeros(channel),
        "al": jnp.full(channel, 0.01),
        "tr": jnp.ones(channel),
        "ar": jnp.ones(channel),
        "fc_w": fc * jnp.sqrt(6 / (features + classes)),
        "fc_b": jnp.zeros((1, classes)),
    }
    state = {"bn_mean": jnp.zeros(channel), "bn_var": jnp.ones(channel)}
    return params, state


def model(params, state, x, *, training: bool):
    """Class probabilities for images ``x`` (NHWC), and the updated batch-norm state."""
    y = jax.lax.conv_general_dilated(
        x, params["conv_w"], (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    y = y + params["conv_b"]
    if training:
        mean = jnp.mean(y, axis=(0, 1, 2), keepdims=True)
        var = jnp.var(y, axis=(0, 1, 2), keepdims=True)
        n = y.shape[0] * y.shape[1] * y.shape[2]
        state = {  # MATLAB's running statistics: decay 0.1, unbiased variance
            "bn_mean": 0.9 * state["bn_mean"] + 0.1 * mean,
            "bn_var": 0.9 * state["bn_var"] + 0.1 * var * n / (n - 1),
        }
    else:
        mean, var = state["bn_mean"], state["bn_var"]
    y = (y - mean) / jnp.sqrt(var + 1e-5) * params["bn_scale"] + params["bn_offset"]
    y = srelu(y, params["tl"], params["al"], params["tr"], params["ar"])
    y = y.reshape(y.shape[0], -1) @ params["fc_w"] + params["fc_b"]
    return jax.nn.softmax(y, axis=-1), state


@jax.jit
def train_step(params, state, avg_g, avg_sq_g, iteration, x, t, learn_rate):
    def loss_fn(params):
        y, new_state = model(params, state, x, training=True)
        return df.losses.crossentropy(y, t), new_state

    (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    params, avg_g, avg_sq_g = df.adamupdate(params, grads, avg_g, avg_sq_g, iteration, learn_rate)
    return params, state, avg_g, avg_sq_g, loss


def main(small: bool) -> float:
    X_train, T_train, X_test, T_test = df.data.digits()
    if small:
        X_train, T_train = X_train[:256], T_train[:256]
    epochs, batch, learn_rate = (2, 64, 0.01) if small else (30, 64, 0.01)
    mean = X_train.mean()  # zero-center the images, as an image input layer would
    X_train, X_test = X_train - mean, X_test - mean

    key = jax.random.key(0)
    params, state = init_model(key, filters=20)
    zeros = jax.tree.map(jnp.zeros_like, params)
    avg_g, avg_sq_g = zeros, zeros  # same structure from the start: one compiled step
    rng = np.random.default_rng(0)
    iteration = 0
    start = time.perf_counter()
    loss = jnp.nan
    print("Epoch  Iteration  Loss")
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(X_train))
        for b in range(len(order) // batch):  # the last partial mini-batch is dropped
            index = order[b * batch : (b + 1) * batch]
            iteration += 1
            x, t = X_train[index], T_train[index]
            params, state, avg_g, avg_sq_g, loss = train_step(
                params, state, avg_g, avg_sq_g, iteration, x, t, learn_rate
            )
        if epoch == 1 or epoch % 5 == 0 or epoch == epochs:
            print(f"{epoch:5d}  {iteration:9d}  {float(loss):.4f}")
    seconds = time.perf_counter() - start

    scores, _ = jax.jit(lambda p, s, x: model(p, s, x, training=False))(params, state, X_test)
    labels = df.scores2label(scores)
    accuracy = 100 * float(np.mean(labels == T_test))
    print(f"trained {iteration} iterations in {seconds:.1f} s; test accuracy {accuracy:.2f}%")
    assert np.isfinite(float(loss))
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings for the test suite")
    main(parser.parse_args().small)
