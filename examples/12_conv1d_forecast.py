"""12: forecast a multi-frequency waveform with causal 1-D convolutions (a temporal conv net).

MATLAB's time-series forecasting examples train on synthetic waveforms: each channel is a sum of
sine waves of different frequencies, amplitudes and phases, plus a little noise. The network
reads the sequence so far and predicts the next value of every channel, at every time step
(sequence-to-sequence regression with targets shifted by one step). Its convolutions are causal
(``Conv1D(padding="causal")``: each output sees only the past), dilated 1, 2, 4 so that the
receptive field grows to 29 steps, each followed by layer normalization and a ReLU, as in
MATLAB's 1-D convolution examples:

    SequenceInput(3) -> [Conv1D(5, 32, dilation=d, padding="causal") -> LayerNorm -> ReLU] x 3
    -> FullyConnected(3)

After training with ``df.trainnet`` (Adam, half-MSE loss), the script forecasts the test
waveforms in two ways and prints the root-mean-square errors next to the naive "the next value
is the last value" forecast:

* open loop: every step is predicted from the true past;
* closed loop: the last 20 steps are forecast from the network's own predictions, fed back one
  step at a time (each call sees the same fixed-length window, so one compiled trace serves all).

Run: ``python examples/12_conv1d_forecast.py [--small]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import difffn as df

L = df.layers
CHANNELS, LENGTH, HORIZON = 3, 120, 20


def waveforms(n: int, *, seed: int) -> np.ndarray:
    """``n`` sequences of ``LENGTH`` steps and ``CHANNELS`` channels: sums of sines plus noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(LENGTH, dtype=np.float64)
    out = np.zeros((n, LENGTH, CHANNELS))
    for k in range(3):  # three sine components per channel
        frequency = rng.uniform(0.02, 0.12, size=(n, 1, CHANNELS))
        amplitude = rng.uniform(0.3, 1.0, size=(n, 1, CHANNELS)) / (k + 1)
        phase = rng.uniform(0, 2 * np.pi, size=(n, 1, CHANNELS))
        out += amplitude * np.sin(2 * np.pi * frequency * t[None, :, None] + phase)
    out += 0.02 * rng.standard_normal(out.shape)
    return out.astype(np.float32)


def network(filters: int) -> df.Network:
    layers: list[df.Layer] = [L.SequenceInput(CHANNELS, name="input")]
    for i, dilation in enumerate((1, 2, 4)):
        layers += [
            L.Conv1D(5, filters, dilation=dilation, padding="causal", name=f"conv{i}"),
            L.LayerNorm(name=f"norm{i}"),
            L.ReLU(name=f"relu{i}"),
        ]
    layers.append(L.FullyConnected(CHANNELS, name="fc"))
    return df.Network(layers)


def rmse(a, b) -> float:
    return float(np.sqrt(np.mean((np.asarray(a) - np.asarray(b)) ** 2)))


def closed_loop(net: df.Network, sequences: np.ndarray) -> np.ndarray:
    """Forecast the last ``HORIZON`` steps from the first ``LENGTH - HORIZON``, feeding back."""
    window = sequences[:, : LENGTH - HORIZON].copy()
    forecast = []
    for _ in range(HORIZON):
        y = net.predict(df.dlarray(window, "BTC"))  # the same shape every step: one trace
        step = np.asarray(y.data[:, -1:])
        forecast.append(step)
        window = np.concatenate([window[:, 1:], step], axis=1)
    return np.concatenate(forecast, axis=1)


def main(small: bool) -> float:
    n_train, n_test = (64, 16) if small else (800, 200)
    epochs, filters = (2, 8) if small else (30, 32)
    train, test = waveforms(n_train, seed=0), waveforms(n_test, seed=1)
    X, T = train[:, :-1], train[:, 1:]  # predict the next step of every channel

    net = network(filters)
    options = df.TrainingOptions(
        "adam",
        max_epochs=epochs,
        mini_batch_size=32,
        initial_learn_rate=0.005,
        shuffle="every-epoch",
        verbose=False,
    )
    start = time.perf_counter()
    net, info = df.trainnet(X, T, net, "mse", options)
    seconds = time.perf_counter() - start
    print(net.summary())
    losses = info.training_history["loss"]
    print(f"trained {epochs} epochs in {seconds:.1f} s; loss {losses[0]:.4f} -> {losses[-1]:.4f}")

    predicted = net.predict(df.dlarray(test[:, :-1], "BTC")).data
    open_loop, naive = rmse(predicted, test[:, 1:]), rmse(test[:, :-1], test[:, 1:])
    print(f"open loop   (next step from the true past): RMSE {open_loop:.4f}; naive {naive:.4f}")
    forecast = closed_loop(net, test)
    closed = rmse(forecast, test[:, -HORIZON:])
    last_seen = test[:, -HORIZON - 1 : -HORIZON]
    naive_closed = rmse(np.repeat(last_seen, HORIZON, axis=1), test[:, -HORIZON:])
    print(f"closed loop ({HORIZON} steps fed back): RMSE {closed:.4f}; naive {naive_closed:.4f}")
    print(f"compiled predict traces: {net.cache_info()}")
    assert np.isfinite(open_loop) and np.isfinite(closed)
    if not small:
        assert open_loop < naive and closed < naive_closed, "the forecast should beat naive"
    jax.block_until_ready(forecast)
    return open_loop


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings for the test suite")
    main(parser.parse_args().small)
