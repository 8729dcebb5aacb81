"""05: a custom recurrent layer with state: a peephole LSTM, run in chunks and trained.

A peephole LSTM lets its gates see the cell state. With ``z = x_t W + h_{t-1} R + b`` split into
four blocks (input i, forget f, cell candidate g, output o) and peephole weights ``p_i, p_f,
p_o``:

    i_t = sigmoid(z_i + p_i * c_{t-1})      f_t = sigmoid(z_f + p_f * c_{t-1})
    g_t = tanh(z_g)                         c_t = f_t * c_{t-1} + i_t * g_t
    o_t = sigmoid(z_o + p_o * c_t)          h_t = o_t * tanh(c_t)

The hidden state h and the cell state c are the layer's state (``df.state()`` fields, MATLAB's
``properties (State)``): ``predict`` returns the outputs and then their new values, so a network
can carry them from one call to the next, and ``reset_state`` sets them back to zeros.

This script
1. writes ``PeepholeLSTM(num_hidden_units)``, a formattable layer: it finds the batch, time and
   channel axes of its input with ``df.finddim`` (any order: ``"BTC"``, ``"TBC"``, ...), runs
   ``jax.lax.scan`` over time and returns the sequence of hidden states in the input's format;
2. builds a network (sequence input, the peephole LSTM, fully connected, softmax) for a
   synthetic task: at every time step, say whether the running sum of the inputs so far is
   positive;
3. shows that running a sequence in two chunks, carrying the state that ``predict`` (and
   ``forward``) return with ``net.replace(state=...)``, gives exactly the outputs of running it
   whole, and that ``net.reset_state()`` starts over;
4. trains it for a few steps in a jitted custom loop with ``df.adamupdate`` (each mini-batch of
   independent sequences starts from the reset state) and prints the per-step accuracy.

Run: ``python examples/05_peephole_lstm.py [--small]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df


class PeepholeLSTM(df.Layer):
    """LSTM with peephole connections; input and output sequences with ``B``, ``T``, ``C``."""

    formattable = True  # it receives df.FormattedArray and finds its axes by label

    num_hidden_units: int
    _: dataclasses.KW_ONLY
    input_weights: jax.Array = df.learnable(default=None)  # (C, 4H): gates i, f, g, o
    recurrent_weights: jax.Array = df.learnable(default=None)  # (H, 4H)
    peephole_weights: jax.Array = df.learnable(default=None)  # (3, H): gates i, f, o
    bias: jax.Array = df.learnable(default=None)  # (4H,)
    hidden_state: jax.Array = df.state(default=None)  # (batch, H); (1, H) broadcasts
    cell_state: jax.Array = df.state(default=None)

    def initialize(self, layout, *, key):
        channels, h = layout.size("C"), self.num_hidden_units
        k_in, k_rec = jax.random.split(key)
        new = {}
        if self.input_weights is None:
            limit = np.sqrt(6 / (channels + 4 * h))  # Glorot uniform
            new["input_weights"] = jax.random.uniform(
                k_in, (channels, 4 * h), minval=-limit, maxval=limit
            )
        if self.recurrent_weights is None:
            new["recurrent_weights"] = jax.nn.initializers.orthogonal()(k_rec, (h, 4 * h))
        if self.peephole_weights is None:
            new["peephole_weights"] = jnp.zeros((3, h))
        if self.bias is None:
            new["bias"] = jnp.zeros(4 * h).at[h : 2 * h].set(1.0)  # forget gate starts open
        if self.hidden_state is None:
            new["hidden_state"] = jnp.zeros((1, h))
        if self.cell_state is None:
            new["cell_state"] = jnp.zeros((1, h))
        return self.replace(**new) if new else self

    def reset_state(self):
        h = self.num_hidden_units
        return self.replace(hidden_state=jnp.zeros((1, h)), cell_state=jnp.zeros((1, h)))

    def predict(self, x):
        (b_axis,) = df.finddim(x, "B")  # the axes are found by label, not by position
        batch, h = x.shape[b_axis], self.num_hidden_units
        xs = df.stripdims(df.permute(x, "TBC"))  # scan runs over the leading axis: time
        # Project every time step's input at once; the scan does only the recurrence.
        z_inputs = xs @ self.input_weights + self.bias
        p_i, p_f, p_o = self.peephole_weights
        h0 = jnp.broadcast_to(self.hidden_state, (batch, h))
        c0 = jnp.broadcast_to(self.cell_state, (batch, h))

        def step(carry, z_input):
            h_prev, c_prev = carry
            z = z_input + h_prev @ self.recurrent_weights
            z_i, z_f, z_g, z_o = jnp.split(z, 4, axis=-1)
            i = jax.nn.sigmoid(z_i + p_i * c_prev)
            f = jax.nn.sigmoid(z_f + p_f * c_prev)
            c = f * c_prev + i * jnp.tanh(z_g)
            o = jax.nn.sigmoid(z_o + p_o * c)
            h_new = o * jnp.tanh(c)
            return (h_new, c), h_new

        (h_last, c_last), hs = jax.lax.scan(step, (h0, c0), z_inputs)
        y = df.permute(df.dlarray(hs, "TBC"), x.format)  # back to the input's axis order
        return y, h_last, c_last  # the output, then the state fields in declaration order


def running_sum_task(n: int, length: int, seed: int):
    """Sequences ``(n, length, 1)`` and labels ``(n, length)``: 1 where the running sum > 0."""
    x = np.random.default_rng(seed).standard_normal((n, length, 1)).astype(np.float32)
    return x, (np.cumsum(x[..., 0], axis=1) > 0).astype(np.int32)


def build_network(hidden: int) -> df.Network:
    L = df.layers
    return df.Network(
        [
            L.SequenceInput(1, name="input"),  # "BTC"
            PeepholeLSTM(hidden, name="lstm"),
            L.FullyConnected(2, name="fc"),  # keeps B and T: "BTC" -> "BTC"
            L.Softmax(name="softmax"),
        ]
    )


def max_difference(a, b) -> float:
    return float(np.max(np.abs(np.asarray(df.stripdims(a)) - np.asarray(df.stripdims(b)))))


def show_state_carrying(net: df.Network, x) -> None:
    length = x.shape[1]
    half = length // 2
    whole = net.predict(x)

    first, state = net.predict(x[:, :half], return_state=True)
    print("state after the first chunk (net.predict(..., return_state=True)):")
    print(state)
    second = net.replace(state=state).predict(x[:, half:])
    chunked = jnp.concatenate([df.stripdims(first), df.stripdims(second)], axis=1)
    gap = max_difference(chunked, whole)
    print(f"steps 1-{half} then {half + 1}-{length}, state carried: max difference {gap:.1e}")
    assert gap < 1e-6, gap

    # forward (training mode) returns the new state in the same way.
    first, state = net.forward(x[:, :half])
    second, _ = net.replace(state=state).forward(x[:, half:])
    chunked = jnp.concatenate([df.stripdims(first), df.stripdims(second)], axis=1)
    gap = max_difference(chunked, whole)
    print(f"the same with net.forward: max difference {gap:.1e}")
    assert gap < 1e-6, gap

    # Without resetting, the second chunk starts from the carried state, not from zeros.
    carried = net.replace(state=state)
    stale = max_difference(carried.predict(x[:, half:]), net.predict(x[:, half:]))
    reset = carried.reset_state()
    print(
        "the second chunk from the carried state vs from zeros: max difference "
        f"{stale:.2f}; after net.reset_state(): "
        f"{max_difference(reset.predict(x[:, half:]), net.predict(x[:, half:])):.1e}"
    )
    assert stale > 1e-3
    for value in reset.state.values():
        lstm = net.layer("lstm")
        assert isinstance(lstm, PeepholeLSTM)
        assert value.shape == (1, lstm.num_hidden_units) and not np.any(value)


def accuracy(net, x, t) -> float:
    y = df.stripdims(net.predict(x))
    return 100 * float(np.mean(np.argmax(np.asarray(y), axis=-1) == t))


def train(net, x, t, *, steps: int, batch: int, learn_rate: float):
    @jax.jit
    def step(net, average_grad, average_sq_grad, iteration, x, t):
        def loss(net):
            y, _ = net.forward(x)  # the new state is dropped: sequences are independent
            return df.losses.crossentropy(y, t)

        value, grads = jax.value_and_grad(loss)(net)
        net, average_grad, average_sq_grad = df.adamupdate(
            net, grads, average_grad, average_sq_grad, iteration, learn_rate
        )
        return net, average_grad, average_sq_grad, value

    zeros = net.learnables.map(jnp.zeros_like)  # Adam's averages, one per learnable
    average_grad, average_sq_grad = zeros, zeros
    rng = np.random.default_rng(1)
    losses = []
    for iteration in range(1, steps + 1):
        index = rng.choice(len(x), batch, replace=False)
        net, average_grad, average_sq_grad, value = step(
            net, average_grad, average_sq_grad, iteration, x[index], t[index]
        )
        losses.append(float(value))
    return net, losses


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings (the test suite)")
    args = parser.parse_args(argv)
    hidden, length = (8, 12) if args.small else (32, 40)
    steps, n_train = (40, 512) if args.small else (600, 4096)

    net = build_network(hidden).initialize(key=jax.random.key(0))
    print(net.summary())
    print(f"\nstate table (net.state):\n{net.state}\n")

    x_train, t_train = running_sum_task(n_train, length, seed=0)
    x_test, t_test = running_sum_task(512, length, seed=1)
    print(f"== carrying the state: {len(x_test[:8])} sequences of {length} steps")
    show_state_carrying(net, x_test[:8])

    print(f"\n== training: {steps} Adam steps on mini-batches of 32 of {n_train} sequences")
    before = accuracy(net, x_test, t_test)
    start = time.perf_counter()
    net, losses = train(net, x_train, t_train, steps=steps, batch=32, learn_rate=0.01)
    seconds = time.perf_counter() - start
    after = accuracy(net, x_test, t_test)
    every = max(steps // 5, 1)
    for i in range(0, steps, every):
        print(f"  step {i + 1:4d}  loss {losses[i]:.4f}")
    print(f"  step {steps:4d}  loss {losses[-1]:.4f}")
    print(f"trained in {seconds:.1f} s; per-step test accuracy {before:.1f}% -> {after:.1f}%")
    assert np.isfinite(losses[-1]) and losses[-1] < losses[0]
    assert after > (before if args.small else 95.0), f"test accuracy only {after:.1f}%"


if __name__ == "__main__":
    main()
