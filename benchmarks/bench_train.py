"""Training: trainnet's steady-state steps/s against a hand-written jax.jit + optax loop.

The same small CNN (3x3 convolution with 20 filters, batch normalization, ELU, fully connected,
softmax, cross-entropy), the same digits mini-batches of 128 (device-resident data, a new
shuffle every epoch), and SGD with momentum 0.9, learn rate 0.01 and coupled L2 1e-4, in:

* ``df.trainnet``;
* a hand-written loop: a ``jax.jit`` step with donated buffers over an optax chain;
* flax.nnx (``nnx.jit`` step over ``nnx.Optimizer``) and equinox (``eqx.filter_jit`` step,
  ``eqx.nn.BatchNorm`` under ``vmap``), each written the way its documentation does.

Steady state: every candidate runs ``E_LONG`` and ``E_SHORT`` epochs; the difference of the two
median times over the difference in steps is the time per step, free of setup and compilation.
Target: trainnet >= 0.95x the hand-written loop's steps/s. Time to the first step (building the
model and optimizer, compiling, one step on one mini-batch of data) is measured once per
candidate, cold, before anything else of that candidate has run.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import difffn as df

from ._timing import compare, table

BATCH, FILTERS, CLASSES = 128, 20, 10
LEARN_RATE, MOMENTUM, L2 = 0.01, 0.9, 1e-4


def _data():
    X, T, _, _ = df.data.digits()
    return X, T


def _epoch_orders(n, epochs, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.permutation(n).astype(np.int32) for _ in range(epochs)]


# -- difffn ---------------------------------------------------------------------------------------


def _difffn_network():
    L = df.layers
    return df.Network(
        [
            L.ImageInput((8, 8, 1), normalization="none", name="input"),
            L.Conv2D(3, FILTERS, name="conv"),
            L.BatchNorm(name="bn"),
            L.ELU(name="elu"),
            L.FullyConnected(CLASSES, name="fc"),
            L.Softmax(name="softmax"),
        ]
    ).initialize(key=jax.random.key(0))


def _difffn(X, T):
    net = _difffn_network()

    def train(epochs):
        options = df.TrainingOptions(
            max_epochs=epochs, mini_batch_size=BATCH, shuffle="every-epoch", verbose=False
        )
        trained, _ = df.trainnet(X, T, net, "crossentropy", options)
        return jax.tree.leaves(trained)

    return train


# -- hand-written jax.jit + optax -----------------------------------------------------------------


def _init_params(key):
    k1, k2 = jax.random.split(key)
    conv_in, conv_out = 9, 9 * FILTERS
    features = 6 * 6 * FILTERS
    params = {
        "conv_w": jax.random.uniform(k1, (3, 3, 1, FILTERS), minval=-1, maxval=1)
        * np.sqrt(6 / (conv_in + conv_out)),
        "conv_b": jnp.zeros((FILTERS,)),
        "bn_offset": jnp.zeros((FILTERS,)),
        "bn_scale": jnp.ones((FILTERS,)),
        "fc_w": jax.random.uniform(k2, (features, CLASSES), minval=-1, maxval=1)
        * np.sqrt(6 / (features + CLASSES)),
        "fc_b": jnp.zeros((CLASSES,)),
    }
    state = {"mean": jnp.zeros((FILTERS,)), "var": jnp.ones((FILTERS,))}
    return params, state


def _forward(params, state, x):
    y = jax.lax.conv_general_dilated(
        x, params["conv_w"], (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    y = y + params["conv_b"]
    mean = jnp.mean(y, axis=(0, 1, 2))
    var = jnp.var(y, axis=(0, 1, 2))
    m = y.shape[0] * y.shape[1] * y.shape[2]
    state = {
        "mean": 0.9 * state["mean"] + 0.1 * mean,
        "var": 0.9 * state["var"] + 0.1 * var * m / (m - 1),
    }
    y = (y - mean) / jnp.sqrt(var + 1e-5) * params["bn_scale"] + params["bn_offset"]
    y = jax.nn.elu(y)
    y = y.reshape(y.shape[0], -1) @ params["fc_w"] + params["fc_b"]
    return jax.nn.softmax(y, axis=-1), state


def _hand_written(X, T):
    tx = optax.chain(optax.add_decayed_weights(L2), optax.sgd(LEARN_RATE, momentum=MOMENTUM))

    def step(params, state, opt_state, X, T, order, b):
        index = jax.lax.dynamic_slice_in_dim(order, b * BATCH, BATCH)
        x, t = X[index], T[index]

        def loss_fn(params):
            y, new_state = _forward(params, state, x)
            picked = jnp.take_along_axis(y, t[:, None], axis=1)
            return -jnp.sum(jnp.log(jnp.maximum(picked, 1e-7))) / BATCH, new_state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss

    step = jax.jit(step, donate_argnums=(0, 1, 2))
    Xd, Td = jnp.asarray(X), jnp.asarray(T)

    def train(epochs):
        params, state = _init_params(jax.random.key(0))
        opt_state = tx.init(params)
        for order in _epoch_orders(len(X), epochs):
            order = jnp.asarray(order)
            for b in range(len(X) // BATCH):
                params, state, opt_state, _ = step(params, state, opt_state, Xd, Td, order, b)
        return jax.tree.leaves(params)

    return train


# -- flax.nnx -------------------------------------------------------------------------------------


def _nnx(X, T):
    from flax import nnx

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(1, FILTERS, (3, 3), padding="VALID", rngs=rngs)
            self.bn = nnx.BatchNorm(FILTERS, momentum=0.9, epsilon=1e-5, rngs=rngs)
            self.fc = nnx.Linear(6 * 6 * FILTERS, CLASSES, rngs=rngs)

        def __call__(self, x):
            y = jax.nn.elu(self.bn(self.conv(x)))
            return jax.nn.softmax(self.fc(y.reshape(y.shape[0], -1)), axis=-1)

    tx = optax.chain(optax.add_decayed_weights(L2), optax.sgd(LEARN_RATE, momentum=MOMENTUM))

    @nnx.jit
    def step(model, optimizer, x, t):
        def loss_fn(model):
            y = model(x)
            picked = jnp.take_along_axis(y, t[:, None], axis=1)
            return -jnp.sum(jnp.log(jnp.maximum(picked, 1e-7))) / BATCH

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    Xd, Td = jnp.asarray(X), jnp.asarray(T)

    def train(epochs):
        model = CNN(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        for order in _epoch_orders(len(X), epochs):
            order = jnp.asarray(order)
            for b in range(len(X) // BATCH):
                index = order[b * BATCH : (b + 1) * BATCH]
                step(model, optimizer, Xd[index], Td[index])
        return jax.tree.leaves(nnx.state(model))

    return train


# -- equinox --------------------------------------------------------------------------------------


def _equinox(X, T):
    import equinox as eqx

    class CNN(eqx.Module):
        conv: eqx.nn.Conv2d
        bn: eqx.nn.BatchNorm
        fc: eqx.nn.Linear

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.conv = eqx.nn.Conv2d(1, FILTERS, 3, key=k1)
            self.bn = eqx.nn.BatchNorm(
                FILTERS, axis_name="batch", momentum=0.9, eps=1e-5, mode="batch"
            )
            self.fc = eqx.nn.Linear(6 * 6 * FILTERS, CLASSES, key=k2)

        def __call__(self, x, state):  # one observation, CHW
            y, state = self.bn(self.conv(x), state)
            return jax.nn.softmax(self.fc(jax.nn.elu(y).reshape(-1))), state

    tx = optax.chain(optax.add_decayed_weights(L2), optax.sgd(LEARN_RATE, momentum=MOMENTUM))

    @eqx.filter_jit(donate="all-except-first")
    def step(x, model, state, opt_state, t):
        def loss_fn(model, state):
            batched = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
            y, state = batched(x, state)
            picked = jnp.take_along_axis(y, t[:, None], axis=1)
            return -jnp.sum(jnp.log(jnp.maximum(picked, 1e-7))) / BATCH, state

        (loss, state), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(model, state)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state, opt_state

    Xd, Td = jnp.asarray(X).transpose(0, 3, 1, 2), jnp.asarray(T)  # equinox convolves CHW

    def train(epochs):
        model, state = eqx.nn.make_with_state(CNN)(jax.random.key(0))
        opt_state = tx.init(eqx.filter(model, eqx.is_array))
        for order in _epoch_orders(len(X), epochs):
            order = jnp.asarray(order)
            for b in range(len(X) // BATCH):
                index = order[b * BATCH : (b + 1) * BATCH]
                model, state, opt_state = step(Xd[index], model, state, opt_state, Td[index])
        return jax.tree.leaves(eqx.filter(model, eqx.is_array))

    return train


# -- the benchmark --------------------------------------------------------------------------------

CANDIDATES = {
    "difffn.trainnet": _difffn,
    "jax.jit + optax": _hand_written,
    "flax.nnx": _nnx,
    "equinox": _equinox,
}


def run(*, quick: bool = False) -> None:
    X, T = _data()
    steps_per_epoch = len(X) // BATCH
    short, long = (1, 4) if quick else (2, 22)
    rounds = 3 if quick else 11

    jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.zeros(1)))  # start the backend first
    first_step = {}
    for name, make in CANDIDATES.items():
        start = time.perf_counter()  # cold: build the model and optimizer, compile, one step
        jax.block_until_ready(make(X[:BATCH], T[:BATCH])(1))
        first_step[name] = time.perf_counter() - start
    trainers = {name: make(X, T) for name, make in CANDIDATES.items()}

    thunks = {}
    for name, train in trainers.items():
        thunks[f"{name} | {short}"] = lambda train=train: train(short)
        thunks[f"{name} | {long}"] = lambda train=train: train(long)
    timings = compare(thunks, rounds=rounds, min_round_s=0.0)

    per_step = {
        name: (timings[f"{name} | {long}"].median_s - timings[f"{name} | {short}"].median_s)
        / ((long - short) * steps_per_epoch)
        for name in CANDIDATES
    }
    base = per_step["jax.jit + optax"]
    rows = []
    for name in CANDIDATES:
        noise = max(timings[f"{name} | {long}"].noise, timings[f"{name} | {short}"].noise)
        rows.append(
            [
                name,
                f"{1 / per_step[name]:8.0f}",
                f"{per_step[name] * 1e3:6.3f} ms",
                f"{base / per_step[name]:5.2f}x",
                f"{first_step[name]:6.2f} s",
                f"{noise * 100:4.1f}%",
            ]
        )
    print(
        f"\nsteady-state training, digits ({len(X)} images), batch {BATCH}, "
        f"{long - short} epochs x {steps_per_epoch} steps measured"
    )
    print(
        table(
            rows,
            ["loop", "steps/s", "time/step", "steps/s vs jit+optax", "first step", "noise"],
        )
    )
    print(
        f"target: trainnet / jit+optax steps/s = {base / per_step['difffn.trainnet']:.2f}x "
        "(>= 0.95x); 'first step' is cold: building the model and optimizer, compiling, one "
        "step"
    )
    extra = (per_step["difffn.trainnet"] - base) * 1e6
    print(
        f"target (issue 16): trainnet's time per step / jit+optax's = "
        f"{per_step['difffn.trainnet'] / base:.2f}x (<= 1.2x), {extra:+.1f} us per step (<= 15 us)"
    )
