"""07: network composition: a layer holding a network, used twice (a siamese network on digits).

A layer field declared ``df.learnable()`` may hold a whole ``df.Network`` (MATLAB's network
composition): its parameters become learnables of the layer, listed in the outer network's
table under nested paths (``"siamese/encoder/fc/weights"``: layer, field, inner layer,
parameter), reachable by ``df.set_learn_rate_factor`` and trained by ``df.trainnet``.

``SiameseDistance`` holds one encoder network and runs it on both of its inputs, so the two
images are embedded with the same weights (weight sharing), and returns the distance between
the two embeddings. Trained with a contrastive loss on pairs of digits (pull pairs of the same
digit together, push other pairs at least ``MARGIN`` apart), the encoder learns an embedding
in which the nearest neighbour of a digit is usually the same digit.

This script
1. builds the encoder (image input, convolution, ReLU, fully connected), the siamese layer and a
   two-input network around it, and prints its learnables table with the nested paths;
2. checks in float64 that the gradient with respect to the shared encoder weights is the sum of
   the gradients of its two uses (computed with two separate copies of the encoder);
3. sets a learn-rate factor of 0.5 on a nested path and checks that one ``df.sgdmupdate`` step
   moves that parameter by half the learn rate times its gradient;
4. trains on pairs of digits with ``df.trainnet`` and a custom loss, then reports the distances
   between test pairs and the nearest-neighbour accuracy of the trained encoder alone.

Run: ``python examples/07_nested_network.py [--small]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df

MARGIN = 2.0
ENCODER_PARAMETER = "siamese/encoder/fc/weights"


def embedding_distance(e1, e2):
    """Euclidean distance between embeddings ``"BC"``, as ``"BC"`` with one channel."""
    (c_axis,) = df.finddim(e1, "C")
    squared = jnp.sum((df.stripdims(e1) - df.stripdims(e2)) ** 2, axis=c_axis, keepdims=True)
    return df.dlarray(jnp.sqrt(squared + 1e-9), "BC")  # + 1e-9: a finite gradient at 0


def contrastive_loss(distance, same):
    """Mean of ``same * d^2 + (1 - same) * max(MARGIN - d, 0)^2``, halved (Hadsell et al.)."""
    d = df.stripdims(distance)[:, 0]
    per_pair = same * d**2 + (1 - same) * jnp.maximum(MARGIN - d, 0.0) ** 2
    return 0.5 * jnp.mean(per_pair)


class SiameseDistance(df.Layer):
    """Distance between the embeddings of two images by one shared encoder network."""

    formattable = True  # it turns "BSSC" images into "BC" distances

    encoder: df.Network = df.learnable(default=None)  # a nested network, trained with the layer

    def initialize(self, left, right, *, key):
        if self.encoder.initialized:  # fill only what is still empty
            return self
        return self.replace(encoder=self.encoder.initialize(key=key))

    def predict(self, left, right):
        return embedding_distance(self.encoder.predict(left), self.encoder.predict(right))


def build_encoder(filters: int, embedding: int) -> df.Network:
    L = df.layers
    return df.Network(
        [
            L.ImageInput((8, 8, 1), normalization="none", name="input"),
            L.Conv2D(3, filters, name="conv"),
            L.ReLU(name="relu"),
            L.FullyConnected(embedding, name="fc"),
        ]
    )


def build_network(filters: int, embedding: int) -> df.Network:
    L = df.layers
    return df.Network(
        [
            [
                L.ImageInput((8, 8, 1), normalization="none", name="left"),
                SiameseDistance(encoder=build_encoder(filters, embedding), name="siamese"),
            ],
            [L.ImageInput((8, 8, 1), normalization="none", name="right")],
        ],
        connections=[("right", "siamese/in2")],
    )


def make_pairs(X, T, n: int, seed: int):
    """``n`` pairs of images, half of the same digit, and 1.0 where a pair is the same digit."""
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(T == c) for c in range(10)]
    first = rng.integers(0, len(X), n)
    second = np.empty(n, np.int64)
    same = np.arange(n) % 2 == 0
    for k in range(n):
        if same[k]:
            second[k] = rng.choice(by_class[T[first[k]]])
        else:
            second[k] = rng.choice(np.flatnonzero(T != T[first[k]]))
    return X[first], X[second], same.astype(np.float32)


def relative_difference(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), np.finfo(b.dtype).tiny))


def check_shared_gradient(net, left, right, same) -> float:
    """d(loss)/d(shared encoder) against the sum of the gradients of its two uses (float64)."""

    @jax.jit
    def gradients(net, left, right, same):
        net = jax.tree.map(lambda v: v.astype(jnp.float64), net)

        def loss(net):
            return contrastive_loss(net.predict(left, right), same)

        shared = jax.grad(loss)(net).learnables

        # The same loss with two separate copies of the encoder, one for each input.
        def split_loss(encoder_left, encoder_right):
            d = embedding_distance(encoder_left.predict(left), encoder_right.predict(right))
            return contrastive_loss(d, same)

        encoder = net.layer("siamese").encoder
        from_left, from_right = jax.grad(split_loss, argnums=(0, 1))(encoder, encoder)
        return shared, from_left.learnables, from_right.learnables

    with jax.enable_x64(True):
        shared, from_left, from_right = gradients(
            net, left.astype(np.float64), right.astype(np.float64), same.astype(np.float64)
        )
    worst = 0.0
    print(f"  {'parameter':<28} {'|left use|':>10} {'|right use|':>11}  shared vs sum")
    for path, g_left in from_left.items():
        g_shared, g_right = shared[f"siamese/encoder/{path}"], from_right[path]
        assert g_shared.dtype == np.float64
        error = relative_difference(g_shared, g_left + g_right)
        worst = max(worst, error)
        print(
            f"  {'siamese/encoder/' + path:<28} {np.linalg.norm(g_left):10.4f} "
            f"{np.linalg.norm(g_right):11.4f}  {error:.1e}"
        )
    return worst


def check_learn_rate_factor(net, left, right, same) -> df.Network:
    """One SGD step (no momentum): the factor-0.5 parameter moves by 0.5 * learn rate * grad."""
    net = df.set_learn_rate_factor(net, ENCODER_PARAMETER, 0.5)
    factors = {path: df.get_learn_rate_factor(net, path) for path in net.learnables}
    for path, factor in factors.items():
        print(f"  df.get_learn_rate_factor(net, {path!r}) = {factor:g}")
    assert factors[ENCODER_PARAMETER] == 0.5
    assert factors["siamese/encoder/conv/weights"] == 1.0

    grads = jax.grad(lambda net: contrastive_loss(net.predict(left, right), same))(net)
    learn_rate = 0.1
    stepped, _ = df.sgdmupdate(net, grads, None, learn_rate, 0.0)
    worst = 0.0
    for path in ("siamese/encoder/conv/weights", ENCODER_PARAMETER):
        moved = stepped.learnables[path] - net.learnables[path]
        expected = -factors[path] * learn_rate * grads.learnables[path]
        worst = max(worst, relative_difference(moved, expected))
    print(
        f"  one df.sgdmupdate step (learn rate {learn_rate}, momentum 0) moved each parameter "
        f"by -factor * {learn_rate} * gradient\n  (max relative difference {worst:.1e}, float32)"
    )
    assert worst < 1e-3, worst
    return net


def nearest_neighbour_accuracy(encoder, X_ref, T_ref, X, T) -> float:
    ref = np.asarray(df.stripdims(encoder.predict(X_ref)))
    emb = np.asarray(df.stripdims(encoder.predict(X)))
    squared = (emb**2).sum(1)[:, None] - 2 * emb @ ref.T + (ref**2).sum(1)[None]
    return 100 * float(np.mean(T_ref[np.argmin(squared, axis=1)] == T))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings (the test suite)")
    args = parser.parse_args(argv)
    filters, embedding = (4, 8) if args.small else (16, 16)
    n_pairs, epochs = (512, 2) if args.small else (8192, 10)

    net = build_network(filters, embedding).initialize(key=jax.random.key(0))
    print(net.summary())
    siamese = net.layer("siamese")
    print(f"\nnetwork inputs: {net.input_names}; the siamese layer's: {siamese.input_names}")
    print(f"\nnet.learnables:\n{net.learnables}")
    assert ENCODER_PARAMETER in net.learnables

    X_train, T_train, X_test, T_test = df.data.digits()
    left, right, same = make_pairs(X_train, T_train, 64, seed=0)
    print("\n== weight sharing: the gradient is the sum over both uses (float64, 64 pairs)")
    worst = check_shared_gradient(net, left, right, same)
    assert worst < 1e-10, f"the shared gradient is not the sum of the two uses: {worst:.2e}"

    print(f"\n== a learn-rate factor on a nested path: {ENCODER_PARAMETER!r}")
    net = check_learn_rate_factor(net, left, right, same)

    train_pairs = make_pairs(X_train, T_train, n_pairs, seed=1)
    test_left, test_right, test_same = make_pairs(X_test, T_test, 1000, seed=2)
    options = df.TrainingOptions(
        "adam",
        initial_learn_rate=0.01,
        max_epochs=epochs,
        mini_batch_size=64,
        shuffle="every-epoch",
        verbose_frequency=8 if args.small else 250,
    )
    print(f"\n== training on {n_pairs} pairs with df.trainnet and a contrastive loss")
    start = time.perf_counter()
    net, info = df.trainnet(
        train_pairs[:2], train_pairs[2], net, contrastive_loss, options, key=jax.random.key(0)
    )
    seconds = time.perf_counter() - start
    assert df.get_learn_rate_factor(net, ENCODER_PARAMETER) == 0.5  # kept through training

    d = np.asarray(df.stripdims(df.minibatchpredict(net, test_left, test_right)))[:, 0]
    mean_same, mean_other = d[test_same == 1].mean(), d[test_same == 0].mean()
    verified = 100 * np.mean((d < MARGIN / 2) == (test_same == 1))
    siamese = net.layer("siamese")
    assert isinstance(siamese, SiameseDistance)
    encoder = siamese.encoder  # the trained encoder, usable on its own
    knn = nearest_neighbour_accuracy(encoder, X_train, T_train, X_test, T_test)
    print(f"trained {len(info.training_history)} iterations in {seconds:.1f} s")
    print(f"test pairs: mean distance {mean_same:.2f} (same digit) vs {mean_other:.2f} (different)")
    print(f"same/different by distance < {MARGIN / 2:g}: {verified:.1f}% of 1000 test pairs right")
    print(f"nearest neighbour in the encoder's embedding: {knn:.1f}% of the test digits right")
    assert mean_same < mean_other
    assert knn > (50.0 if args.small else 90.0), f"nearest-neighbour accuracy only {knn:.1f}%"


if __name__ == "__main__":
    main()
