"""00: a custom ELU layer with its own backward, checked, and trained with trainnet on digits.

The exponential linear unit, with one learnable ``alpha`` per channel:

    f(x) = x                       if x > 0
           alpha (exp(x) - 1)      if x <= 0

This script
1. writes ELU as a ``df.Layer`` with a learnable ``alpha`` and a hand-written ``backward``;
2. checks it with ``df.check_layer`` (gradients against finite differences) and prints the report;
3. builds the post's network: image input, convolution, batch normalization, the ELU layer, a
   fully connected layer and softmax. The post used 20 filters of 5x5 on 28x28 images; these
   digits are 8x8, so the filters are 2x2 (32 of them);
4. trains it with ``df.trainnet`` and the default solver (SGDM, momentum 0.9, learn rate 0.01,
   L2 1e-4, 30 epochs) on scikit-learn's 8x8 handwritten digits, with mini-batches of 32 (the
   1347 training images make only 10 mini-batches of MATLAB's default 128) reshuffled every
   epoch, printing MATLAB's progress table under a progress bar (rate, time left, loss) and
   redrawing the training-progress plot while it trains (open the PNG in an image viewer that
   reloads it; create the ``.stop`` file it names to stop training early). With tensorboardX
   installed, every logged scalar also goes to TensorBoard event files
   (``tensorboard --logdir $DIFFFN_OUTPUT_DIR/elu_digits_logs``);
5. prints the trained network's summary (layouts, learnable and state values, bytes) and draws
   its layer graph;
6. reports the accuracy on the held-out test split.

Run: ``python examples/00_elu_digits.py [--small]`` (``make demo`` runs it in full). The
pictures go to ``$DIFFFN_OUTPUT_DIR`` (default: the working directory).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

import jax
import jax.numpy as jnp

import difffn as df


class ELULayer(df.Layer):
    """Exponential linear unit with a learnable ``alpha`` per channel (format ``"...C"``)."""

    alpha: jax.Array = df.learnable(default=None)
    num_channels: int = 0

    def initialize(self, layout, *, key):
        if self.alpha is not None:
            return self
        channels = layout.size("C")
        shape = [1] * layout.ndim
        shape[layout.finddim("C")[0]] = channels
        # As in the original post: alpha starts uniformly random in [0, 1).
        return self.replace(alpha=jax.random.uniform(key, tuple(shape)), num_channels=channels)

    def predict(self, x):
        # exp(min(x, 0)) never overflows, so large positive inputs cannot make NaNs.
        return jnp.maximum(x, 0) + self.alpha * (jnp.exp(jnp.minimum(x, 0)) - 1)

    def backward(self, x, z, dLdZ, memory):
        negative = x <= 0
        dLdX = jnp.where(negative, dLdZ * self.alpha * jnp.exp(jnp.minimum(x, 0)), dLdZ)
        # alpha is broadcast over every axis but C: sum its gradient over those axes. The summand
        # is plain arithmetic, which XLA's CPU backend fuses into its reduction (one pass over x
        # and dL/dZ). expm1(m) is exp(m) - 1 without the rounding near 0. -0.0 instead of 0 (the
        # same sum) keeps XLA from sharing min(x, 0) with dL/dX above: a value two kernels share
        # is written out at full size (docs/performance.md, "Custom backwards").
        per_element = dLdZ * jnp.expm1(jnp.minimum(x, -0.0))
        axes = tuple(i for i, n in enumerate(self.alpha.shape) if n == 1)
        dLdAlpha = jnp.sum(per_element, axis=axes, keepdims=True)
        return dLdX, dLdAlpha


FILTER_SIZE = 2
FILTERS = 32
MINI_BATCH_SIZE = 32
VERBOSE_FREQUENCY = 100


def build_network(filters: int = FILTERS) -> df.Network:
    L = df.layers
    return df.Network(
        [
            L.ImageInput((8, 8, 1), name="input"),
            L.Conv2D(FILTER_SIZE, filters, name="conv"),
            L.BatchNorm(name="batchnorm"),
            ELULayer(name="elu", description=f"ELU with {filters} channels"),
            L.FullyConnected(10, name="fc"),
            L.Softmax(name="softmax"),
        ]
    )


def main(small: bool) -> float:
    out_dir = os.environ.get("DIFFFN_OUTPUT_DIR", ".")
    filters = FILTERS
    spatial = 8 - FILTER_SIZE + 1  # the convolution has no padding

    print(
        f"== check_layer(ELULayer) on its input: (batch, {spatial}, {spatial}, {filters}), 'BSSC'"
    )
    report = df.check_layer(
        ELULayer(name="elu"), df.Layout((None, spatial, spatial, filters), "BSSC")
    )
    print(report)
    if not report.ok:
        raise SystemExit("the ELU layer failed its checks")

    X_train, T_train, X_test, T_test = df.data.digits()
    if small:
        X_train, T_train = X_train[:256], T_train[:256]
    print(f"\n== training on {len(X_train)} digits, testing on {len(X_test)}")
    options = df.TrainingOptions(
        "sgdm",
        max_epochs=2 if small else 30,
        mini_batch_size=MINI_BATCH_SIZE,
        shuffle="every-epoch",
        metrics="accuracy",
        verbose_frequency=10 if small else VERBOSE_FREQUENCY,
        plots="training-progress",
        plots_path=os.path.join(out_dir, "elu_digits_training_progress.png"),
        log_dir=(
            os.path.join(out_dir, "elu_digits_logs")
            if importlib.util.find_spec("tensorboardX") is not None
            else None
        ),
    )
    start = time.perf_counter()
    net, info = df.trainnet(
        X_train, T_train, build_network(filters), "crossentropy", options, key=jax.random.key(0)
    )
    seconds = time.perf_counter() - start
    print("\n== the trained network")
    print(net.summary())
    picture = os.path.join(out_dir, "elu_digits_network.png")
    net.plot(picture, title="ELU network for the 8x8 digits")
    print(f"layer graph: {os.path.abspath(picture)}")
    if options.log_dir is not None:
        print(f"TensorBoard: tensorboard --logdir {options.log_dir}")
    accuracy = df.testnet(net, X_test, T_test, "accuracy")
    elu = net.layer("elu")
    assert isinstance(elu, ELULayer)
    alpha = elu.alpha.ravel()
    print(
        f"\nlearned alpha per channel: min {float(alpha.min()):.3f}, max {float(alpha.max()):.3f}"
    )
    print(f"training time: {seconds:.1f} s ({len(info.training_history)} iterations)")
    print(f"test accuracy: {accuracy:.2f}%")
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings for the test suite")
    main(parser.parse_args().small)
