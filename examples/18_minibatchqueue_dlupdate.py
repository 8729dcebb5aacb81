"""18: a custom training loop with ``df.minibatchqueue`` and ``df.dlupdate`` (MATLAB's
``minibatchqueue``/``dlupdate`` workflow).

The digits are read by a mini-batch queue, as MATLAB's custom training loops read a datastore:
``mini_batch_fcn`` rescales the images to [-1, 1] and one-hot encodes the labels,
``mini_batch_format`` labels them ``"BSSC"`` and ``"BC"``, the order is reshuffled every epoch from
a key, and the last partial mini-batch is discarded. The next mini-batch is prepared in the
background while the step runs.

The update is written with ``df.dlupdate``: stochastic gradient descent with momentum as a function
of one learnable, its gradient and its velocity, returning two values, so ``dlupdate`` returns the
updated network and the new velocities (a table like ``net.learnables``), as MATLAB's
``[net, vel] = dlupdate(@sgdmFunction, net, grad, vel)``. The step is one ``jax.jit`` function.
At the end the script checks the loop against ``df.sgdmupdate`` on one mini-batch (the same
formula, MATLAB's), and classifies the test digits.

Run: ``python examples/18_minibatchqueue_dlupdate.py [--small]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df

L = df.layers
LEARN_RATE, MOMENTUM = 0.05, 0.9


def build(filters: int) -> df.Network:
    return df.Network(
        [
            L.ImageInput((8, 8, 1), normalization="none", name="input"),
            L.Conv2D(3, filters, padding="same", name="conv"),
            L.BatchNorm(name="bn"),
            L.ReLU(name="relu"),
            L.MaxPool2D(2, stride=2, name="pool"),
            L.FullyConnected(10, name="fc"),
            L.Softmax(name="softmax"),
        ]
    )


def preprocess(images, labels):
    """MATLAB's MiniBatchFcn: the images to [-1, 1], the labels one-hot."""
    return images * 2 - 1, np.eye(10, dtype=np.float32)[labels]


def sgdm(w, g, v):
    """One learnable's SGDM step (MATLAB's sgdmupdate formula): v <- m v - lr g; w <- w + v."""
    v = MOMENTUM * v - LEARN_RATE * g
    return w + v, v


def loss_and_state(net, X, T):
    Y, state = net.forward(X)
    return df.losses.crossentropy(Y, T), state


@jax.jit
def step(net, vel, X, T):
    (loss, state), grad = jax.value_and_grad(loss_and_state, has_aux=True)(net, X, T)
    net, vel = df.dlupdate(sgdm, net, grad, vel)
    return net.replace(state=state), vel, loss


def main(small: bool = False) -> float:
    X_train, T_train, X_test, T_test = df.data.digits()
    if small:
        X_train, T_train = X_train[:256], T_train[:256]
    epochs, filters, batch = (2, 4, 64) if small else (10, 16, 64)
    net = build(filters).initialize(key=jax.random.key(0))
    mbq = df.minibatchqueue(
        (X_train, T_train),
        mini_batch_size=batch,
        mini_batch_fcn=preprocess,
        mini_batch_format=("BSSC", "BC"),
        partial_mini_batch="discard",
        shuffle="every-epoch",
        key=jax.random.key(1),
    )
    print(mbq)
    zeros = df.dlupdate(jnp.zeros_like, net)
    assert isinstance(zeros, df.Network)  # fn returns one value: the network, not a tuple
    vel = zeros.learnables  # zero velocities, a table as the step gives
    start, iteration, loss = time.perf_counter(), 0, jnp.nan
    for epoch in range(1, epochs + 1):
        for X, T in mbq:  # each loop is a new pass, in a new order
            net, vel, loss = step(net, vel, X, T)
            iteration += 1
        print(f"epoch {epoch}: iteration {iteration}, mini-batch loss {float(loss):.4f}")
    print(f"{iteration} iterations in {time.perf_counter() - start:.1f} s")

    # dlupdate's SGDM is MATLAB's sgdmupdate: one step of each, from the same velocities
    mbq.reset()
    X, T = mbq.next()
    grad = jax.grad(lambda n: loss_and_state(n, X, T)[0])(net)
    ours, _ = df.dlupdate(sgdm, net, grad, vel)
    theirs, _ = df.sgdmupdate(net, grad, vel, LEARN_RATE, MOMENTUM)
    gap = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(ours.learnables.values(), theirs.learnables.values(), strict=True)
    )
    print(f"dlupdate vs sgdmupdate, largest difference: {gap:.2e}")
    assert gap < 1e-5

    images = df.dlarray(X_test * 2 - 1, "BSSC")
    predicted = np.asarray(df.scores2label(net.predict(images)))
    accuracy = float(np.mean(predicted == T_test))
    print(f"test accuracy {accuracy:.3f} on {len(T_test)} digits")
    if not small:
        assert accuracy > 0.9, "the network should learn the digits"
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny settings for the test suite")
    main(parser.parse_args().small)
