"""13: a model function written with ``df.ops`` only, trained in a custom loop on the digits.

MATLAB's custom training loops often define the model as a function of a parameter struct built
from ``dlconv``, ``batchnorm``, ``relu``, ``maxpool``, ``fullyconnect`` and ``softmax``. Here the
same model is a function of a parameter dictionary built from their difffn counterparts:

    df.ops.conv -> df.ops.batchnorm -> df.ops.relu -> df.ops.max_pool -> df.ops.conv
    -> df.ops.batchnorm -> df.ops.relu -> df.ops.fully_connect -> df.ops.softmax

The ops read the axes from the input's format (``"BSSC"`` images), so the function never spells
an axis number. Batch normalization keeps running statistics as state: in training,
``df.ops.batchnorm(..., mean, variance, training=True)`` normalizes with the mini-batch's
statistics and returns the updated running ones; at test time it normalizes with them.

The loop is MATLAB's classic one: shuffle every epoch, compute the loss and its gradients with
``jax.value_and_grad``, update with ``df.adamupdate``; the whole step is one ``jax.jit`` function.
At the end the test digits are classified and the accuracy printed.

Run: ``python examples/13_ops_model_function.py [--small]``.
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df

ops = df.ops


def glorot(key, shape, fan_in, fan_out):
    bound = math.sqrt(6 / (fan_in + fan_out))
    return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


def init_model(key, *, filters: int, classes: int = 10):
    """Parameters with MATLAB's initializers (Glorot weights, zero biases and offsets)."""
    k1, k2, k3 = jax.random.split(key, 3)
    params = {
        "conv1_w": glorot(k1, (3, 3, 1, filters), 9, 9 * filters),
        "conv1_b": jnp.zeros(filters),
        "bn1_offset": jnp.zeros(filters),
        "bn1_scale": jnp.ones(filters),
        "conv2_w": glorot(k2, (3, 3, filters, 2 * filters), 9 * filters, 18 * filters),
        "conv2_b": jnp.zeros(2 * filters),
        "bn2_offset": jnp.zeros(2 * filters),
        "bn2_scale": jnp.ones(2 * filters),
        "fc_w": glorot(k3, (4 * 4 * 2 * filters, classes), 32 * filters, classes),
        "fc_b": jnp.zeros(classes),
    }
    state = {
        "bn1_mean": jnp.zeros(filters),
        "bn1_var": jnp.ones(filters),
        "bn2_mean": jnp.zeros(2 * filters),
        "bn2_var": jnp.ones(2 * filters),
    }
    return params, state


def model(params, state, x, *, training: bool):
    """Class probabilities (``"BC"``) for ``"BSSC"`` images, and the updated running statistics."""
    new_state = dict(state)

    def batchnorm(y, name):
        offset, scale = params[f"{name}_offset"], params[f"{name}_scale"]
        mean, var = state[f"{name}_mean"], state[f"{name}_var"]
        if not training:
            return ops.batchnorm(y, offset, scale, mean, var)
        y, new_state[f"{name}_mean"], new_state[f"{name}_var"] = ops.batchnorm(
            y, offset, scale, mean, var, training=True
        )
        return y

    y = ops.conv(x, params["conv1_w"], params["conv1_b"], padding="same")
    y = ops.relu(batchnorm(y, "bn1"))
    y = ops.max_pool(y, 2, stride=2)  # 8x8 -> 4x4
    y = ops.conv(y, params["conv2_w"], params["conv2_b"], padding="same")
    y = ops.relu(batchnorm(y, "bn2"))
    y = ops.fully_connect(y, params["fc_w"], params["fc_b"])  # "BSSC" -> "BC"
    return ops.softmax(y), new_state


@jax.jit
def train_step(params, state, avg_g, avg_sq_g, iteration, x, t, learn_rate):
    def loss_fn(params):
        y, new_state = model(params, state, df.dlarray(x, "BSSC"), training=True)
        return df.losses.crossentropy(y, t), new_state

    (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    params, avg_g, avg_sq_g = df.adamupdate(params, grads, avg_g, avg_sq_g, iteration, learn_rate)
    return params, state, avg_g, avg_sq_g, loss


def main(small: bool) -> float:
    X_train, T_train, X_test, T_test = df.data.digits()
    if small:
        X_train, T_train = X_train[:256], T_train[:256]
    epochs, batch, learn_rate, filters = (2, 64, 0.01, 4) if small else (20, 64, 0.005, 8)
    mean = X_train.mean()  # zero-center the images, as an image input layer would
    X_train, X_test = X_train - mean, X_test - mean

    params, state = init_model(jax.random.key(0), filters=filters)
    zeros = jax.tree.map(jnp.zeros_like, params)
    avg_g, avg_sq_g = zeros, zeros
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
            params, state, avg_g, avg_sq_g, loss = train_step(
                params,
                state,
                avg_g,
                avg_sq_g,
                iteration,
                X_train[index],
                T_train[index],
                learn_rate,
            )
        if epoch == 1 or epoch % 5 == 0 or epoch == epochs:
            print(f"{epoch:5d}  {iteration:9d}  {float(loss):.4f}")
    seconds = time.perf_counter() - start

    predict = jax.jit(lambda p, s, x: model(p, s, df.dlarray(x, "BSSC"), training=False)[0])
    scores = predict(params, state, X_test)
    labels = df.scores2label(scores)
    accuracy = 100 * float(np.mean(np.asarray(labels) == T_test))
    print(f"trained {iteration} iterations in {seconds:.1f} s; test accuracy {accuracy:.2f}%")
    assert np.isfinite(float(loss))
    if not small:
        assert accuracy > 90, "the model function should classify the digits"
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings for the test suite")
    main(parser.parse_args().small)
