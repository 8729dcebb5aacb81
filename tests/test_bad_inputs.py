"""A catalogue of realistic user mistakes, each answered by a named ``df.Error`` (issue 12).

Every row is one mistake a user makes: a short id, a callable that makes it through the public
API, the ``df.Error`` subclass expected, and regexes the message must match: what is named (the
layer, argument, option, path) and what was expected or got. Every message must also say how to
fix it (``FIX``). A raw Python or JAX exception, a silent result or a message without a fix is a
failing row: the fix belongs in the module that owns the concept, not here.

The file is one table on purpose (past the usual length of a module): a mistake is found, and
a duplicate id caught, by reading or searching one catalogue; its sections follow the public API.
"""

from __future__ import annotations

import functools
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df
from difffn import layers as L

FIX = r"Fix|Fixes:"


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], Any]
    error: type[df.Error]
    match: tuple[str, ...]


CASES: list[Case] = []


def case(id: str, error: type[df.Error], *match: str):
    """Register the decorated function as the mistake ``id``."""

    def register(fn):
        CASES.append(Case(id, fn, error, match))
        return fn

    return register


def row(id: str, make, error: type[df.Error], *match: str) -> None:
    CASES.append(Case(id, make, error, match))


KEY = jax.random.key(0)


@functools.cache
def fc_net() -> df.Network:
    """``FeatureInput(3) -> FullyConnected(2)``, initialized."""
    layers = [L.FeatureInput(3, name="in"), L.FullyConnected(2, name="fc")]
    return df.Network(layers).initialize(key=KEY)


@functools.cache
def cls_net() -> df.Network:
    layers = [L.FeatureInput(4, name="in"), L.FullyConnected(3, name="fc"), L.Softmax(name="sm")]
    return df.Network(layers).initialize(key=KEY)


def X(n=8, c=3):
    return np.ones((n, c), np.float32)


def quiet(**options):
    return df.TrainingOptions(
        **{"verbose": False, "max_epochs": 1, "mini_batch_size": 4, **options}
    )


def train(x=None, t=None, net=None, loss="mse", options=None, **kwargs):
    x = X() if x is None else x
    t = np.zeros((8, 2), np.float32) if t is None else t
    return df.trainnet(x, t, fc_net() if net is None else net, loss, options or quiet(), **kwargs)


def train_cls(t, loss="crossentropy", **options):
    x = np.ones((len(t), 4), np.float32)
    return df.trainnet(x, np.asarray(t), cls_net(), loss, quiet(**options))


class Square(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, x):
        return x * x

    def backward(self, dy, compute_gradients, x):
        return 2 * x * dy


class Scale(df.Layer):
    factor: float = 2.0

    def predict(self, x):
        return self.factor * x


# -- formats ----------------------------------------------------------------------------------

row("dlarray-rank", lambda: df.dlarray(np.zeros((2, 3)), "SSC"), df.FormatError, "SSC", "3")
row("dlarray-label", lambda: df.dlarray(np.zeros((2, 3)), "BQ"), df.FormatError, "Q")
row("dlarray-two-B", lambda: df.dlarray(np.zeros((2, 3)), "BB"), df.FormatError, "B")
row("dlarray-strings", lambda: df.dlarray(["a", "b"], "B"), df.FormatError, "dlarray", "str|<U")
row("dlarray-ragged", lambda: df.dlarray([[1, 2], [3]], "BC"), df.FormatError, "ragged")
row("dlarray-fmt-int", lambda: df.dlarray(np.zeros((2, 3)), 12), df.FormatError, "fmt", "int")
row("dlarray-none-data", lambda: df.dlarray(None, "BC"), df.FormatError, "None")
row("layout-shape-str", lambda: df.Layout("23", "BC"), df.FormatError, "shape", "str")
row("layout-negative", lambda: df.Layout((-1, 3), "BC"), df.FormatError, "-1")
row("layout-float-size", lambda: df.Layout((2.5, 3), "BC"), df.FormatError, "2.5")
row("layout-rank", lambda: df.Layout((2, 3, 4), "BC"), df.FormatError, "BC", "3")
row(
    "finddim-unknown",
    lambda: df.finddim(df.dlarray(np.zeros((2, 3)), "BC"), "Q"),
    df.FormatError,
    "Q",
)
row(
    "permute-missing",
    lambda: df.permute(df.dlarray(np.zeros((2, 3)), "BC"), "SC"),
    df.FormatError,
    "SC|BC",
)
row(
    "add-mismatched-formats",
    lambda: df.dlarray(np.zeros((2, 3)), "BC") + df.dlarray(np.zeros((2, 3)), "CB"),
    df.FormatError,
    "BC",
    "CB",
)
row(
    "index-drops-label",
    lambda: df.dlarray(np.zeros((2, 3)), "BC")["x"],
    df.FormatError,
    "str|'x'",
)


@case("jnp-log-on-formatted-in-loss", df.FormatError, "stripdims", "loss")
def _():
    def my_loss(Y, T):
        return jnp.mean(jnp.log(Y) * T)

    train(loss=my_loss)


# -- DifferentiableFunction -------------------------------------------------------------------


@case("function-inputs-to-constructor", df.DifferentiableFunctionError, "Square", r"\(x")
def _():
    Square(jnp.ones(3))


@case("function-control-flow", df.AccelerationError, r"Branchy\.forward", "jnp.where")
def _():
    class Branchy(df.DifferentiableFunction):
        def forward(self, x):
            return x if x.sum() > 0 else -x

        def backward(self, dy, compute_gradients):
            return dy

    jax.jit(Branchy())(jnp.ones(3))


@case("function-forward-returns-none", df.ForwardError, r"NoReturn\.forward", "None", "return")
def _():
    class NoReturn(df.DifferentiableFunction):
        def forward(self, x):
            x * 2

        def backward(self, dy, compute_gradients):
            return dy

    NoReturn()(jnp.ones(3))


@case("function-backward-too-few-args", df.DifferentiableFunctionError, "Bad", "backward")
def _():
    class Bad(df.DifferentiableFunction):
        def forward(self, x):
            return 2 * x

        def backward(self, dy, compute_gradients, x):
            return 2 * dy


@case("function-backward-wrong-count", df.BackwardError, r"TwoGrads\.backward", "1")
def _():
    class TwoGrads(df.DifferentiableFunction):
        def forward(self, x):
            return 2 * x

        def backward(self, dy, compute_gradients):
            return 2 * dy, dy

    jax.grad(lambda x: TwoGrads()(x).sum())(jnp.ones(3))


@case("function-backward-wrong-shape", df.BackwardError, r"WrongShape\.backward", r"\(3,\)")
def _():
    class WrongShape(df.DifferentiableFunction):
        def forward(self, x):
            return 2 * x

        def backward(self, dy, compute_gradients):
            return jnp.ones(4)

    jax.grad(lambda x: WrongShape()(x).sum())(jnp.ones(3))


@case("function-string-input", df.Error, "Square|str")
def _():
    Square()("abc")


@case("function-forward-mode", df.ForwardModeError, "Square", "jvp")
def _():
    jax.jvp(Square(), (jnp.ones(3),), (jnp.ones(3),))


# -- layers: built-in options -----------------------------------------------------------------

row("fc-size-zero", lambda: L.FullyConnected(0), df.LayerError, "output_size", "0")
row("fc-size-float", lambda: L.FullyConnected(2.5), df.LayerError, "output_size", "2.5")
row("fc-size-str", lambda: L.FullyConnected("10"), df.LayerError, "output_size", "str|'10'")
row(
    "fc-initializer",
    lambda: L.FullyConnected(2, weights_initializer="glorrot"),
    df.LayerError,
    "glorrot",
)
row("conv-filter-zero", lambda: L.Conv2D(0, 4), df.LayerError, "filter_size")
row("conv-filters-neg", lambda: L.Conv2D(3, -4), df.LayerError, "num_filters", "-4")
row("conv-stride-zero", lambda: L.Conv2D(3, 4, stride=0), df.LayerError, "stride")
row("conv-padding-word", lambda: L.Conv2D(3, 4, padding="sam"), df.LayerError, "padding", "sam")
row("conv-groups", lambda: L.Conv2D(3, 4, groups=0), df.LayerError, "groups")
row("conv-dilation", lambda: L.Conv2D(3, 4, dilation=0), df.LayerError, "dilation")
row("pool-size-zero", lambda: L.MaxPool2D(0), df.LayerError, "pool_size")
row("pool-stride-neg", lambda: L.MaxPool2D(2, stride=-1), df.LayerError, "stride")
row("dropout-prob-one", lambda: L.Dropout(1.5), df.LayerError, "probability", "1.5")
row("dropout-prob-str", lambda: L.Dropout("half"), df.LayerError, "probability")
row("elu-alpha-str", lambda: L.ELU(alpha="one"), df.LayerError, "alpha")
row("bn-epsilon-neg", lambda: L.BatchNorm(epsilon=-1.0), df.LayerError, "epsilon")
row("bn-decay", lambda: L.BatchNorm(mean_decay=2.0), df.LayerError, "mean_decay")
row("embedding-dim", lambda: L.Embedding(0, 10), df.LayerError, "dimension")
row("embedding-oov", lambda: L.Embedding(4, 10, oov_mode="drop"), df.LayerError, "oov_mode", "drop")
row("posemb-max", lambda: L.PositionEmbedding(4, 0), df.LayerError, "max_position")
row("sinusoid-odd", lambda: L.SinusoidalPositionEncoding(3), df.LayerError, "output_size", "3")
row("lstm-units", lambda: L.LSTM(0), df.LayerError, "num_hidden_units")
row("lstm-mode", lambda: L.LSTM(4, output_mode="all"), df.LayerError, "output_mode", "all")
row("lstm-activation", lambda: L.LSTM(4, state_activation_function="relu6"), df.LayerError, "relu6")
row("gru-reset", lambda: L.GRU(4, reset_gate_mode="never"), df.LayerError, "reset_gate_mode")
row("bilstm-units", lambda: L.BiLSTM(-2), df.LayerError, "num_hidden_units")
row("attention-heads", lambda: L.SelfAttention(0, 8), df.LayerError, "num_heads")
row(
    "attention-mask",
    lambda: L.SelfAttention(2, 8, attention_mask="upper"),
    df.LayerError,
    "attention_mask",
)
row(
    "attention-dropout",
    lambda: L.SelfAttention(2, 8, dropout_probability=1.5),
    df.LayerError,
    "dropout_probability",
)
row("addition-inputs", lambda: L.Addition(1), df.LayerError, "num_inputs", "1")
row("concat-label", lambda: L.Concatenation(2, label="Q"), df.Error, "Q")
row("function-layer-not-callable", lambda: L.FunctionLayer(3), df.LayerError, "fn")
row("feature-input-zero", lambda: L.FeatureInput(0), df.LayerError, "num_features")
row("image-input-size", lambda: L.ImageInput((28,)), df.LayerError, "input_size")
row(
    "image-input-norm",
    lambda: L.ImageInput((4, 4, 1), normalization="z-score"),
    df.LayerError,
    "normalization",
    "z-score",
)
row("layer-name-int", lambda: L.ReLU(name=3), df.LayerError, "name", "int")
row("layer-unknown-option", lambda: L.FullyConnected(2, outputsize=3), df.LayerError, "outputsize")

# -- layers: calls, formats, user layers -------------------------------------------------------

row(
    "fc-uninitialized-call",
    lambda: L.FullyConnected(2)(df.dlarray(np.ones((2, 3)), "BC")),
    df.LayerError,
    "FullyConnected|fc",
    "initialize",
)
row(
    "conv-on-BC",
    lambda: df.Network([L.FeatureInput(3), L.Conv2D(3, 4)]).initialize(key=KEY),
    df.Error,
    "Conv2D|conv",
    "S",
)
row(
    "pool-on-BC",
    lambda: df.Network([L.FeatureInput(3), L.MaxPool2D(2)]).initialize(key=KEY),
    df.Error,
    "MaxPool2D|pool",
)
row(
    "embedding-on-float",
    lambda: df.Network([L.FeatureInput(3), L.Embedding(4, 10)]).initialize(key=KEY),
    df.Error,
    "Embedding|embedding",
)
row(
    "addition-sizes",
    lambda: df.Network(
        [L.FeatureInput(3, name="a"), L.FeatureInput(4, name="b"), L.Addition(name="add")],
        connections=[("a", "add/in1"), ("b", "add/in2")],
    ).initialize(key=KEY),
    df.Error,
    "add",
    "3|4",
)
row(
    "image-input-wrong-data",
    lambda: (
        df.Network([L.ImageInput((4, 4, 1)), L.Flatten()])
        .initialize(key=KEY)
        .predict(np.ones((2, 5, 5, 1), np.float32))
    ),
    df.Error,
    "5|4",
)
row(
    "layer-initialize-int-key",
    lambda: L.FullyConnected(2).initialize(df.Layout((None, 3), "BC"), key=0),
    df.LayerError,
    "key",
    r"jax\.random\.key\(0\)",
)
row(
    "layer-initialize-tuple-layout",
    lambda: L.FullyConnected(2).initialize((None, 3), key=KEY),
    df.LayerError,
    "Layout",
)


@case("user-layer-control-flow", df.AccelerationError, r"Branchy\.predict", "jnp.where")
def _():
    class Branchy(df.Layer):
        def predict(self, x):
            return x if x.sum() > 0 else -x

    df.Network([L.FeatureInput(3), Branchy()]).initialize(key=KEY).predict(X())


@case("user-layer-jnp-on-formatted", df.FormatError, r"LogLayer\.predict", "stripdims")
def _():
    class LogLayer(df.Layer):
        formattable = True

        def predict(self, x):
            return jnp.log(x)

    df.Network([L.FeatureInput(3), LogLayer()]).initialize(key=KEY).predict(X())


@case("user-layer-predict-returns-none", df.Error, "NoReturn", "None")
def _():
    class NoReturn(df.Layer):
        def predict(self, x):
            x * 2

    df.Network([L.FeatureInput(3), NoReturn()]).initialize(key=KEY).predict(X())


@case("user-layer-initialize-without-key", df.LayerError, r"NoKey\.initialize", "key")
def _():
    class NoKey(df.Layer):
        w: jax.Array | None = df.learnable(default=None)

        def initialize(self, layout):
            return self.replace(w=jnp.ones(layout.size("C")))

        def predict(self, x):
            return x * self.w

    df.Network([L.FeatureInput(3), NoKey()]).initialize(key=KEY)


@case("user-layer-initialize-index-error", df.LayerError, "Indexy", "IndexError")
def _():
    class Indexy(df.Layer):
        w: jax.Array | None = df.learnable(default=None)

        def initialize(self, layout, *, key):
            return self.replace(w=jnp.ones(layout.shape[5]))

        def predict(self, x):
            return x * self.w

    df.Network([L.FeatureInput(3), Indexy(name="idx")]).initialize(key=KEY)


@case("user-layer-learnable-not-array", df.LayerError, "Strange", "w")
def _():
    class Strange(df.Layer):
        w: Any = df.learnable(default=None)

        def predict(self, x):
            return x

    Strange(w="abc")


@case("user-layer-forward-wrong-outputs", df.Error, "Pair", "2|1")
def _():
    class Pair(df.Layer):
        def predict(self, x):
            return x, x

    df.Network([L.FeatureInput(3), Pair()]).initialize(key=KEY).predict(X())


# -- networks ---------------------------------------------------------------------------------

row(
    "network-of-non-layers",
    lambda: df.Network([L.FeatureInput(3), "relu"]),
    df.NetworkError,
    "str|'relu'",
)
row("network-empty", lambda: df.Network([]), df.NetworkError, "layer")
row(
    "network-duplicate-names",
    lambda: df.Network([L.FeatureInput(3, name="a"), L.ReLU(name="a")]),
    df.NetworkError,
    "'a'",
)
row(
    "network-connection-unknown",
    lambda: df.Network(
        [L.FeatureInput(3, name="in"), L.ReLU(name="r")], connections=[("in", "nope")]
    ),
    df.NetworkError,
    "nope",
)
row(
    "network-connection-port",
    lambda: df.Network(
        [L.FeatureInput(3, name="in"), L.ReLU(name="r")], connections=[("in", "r/in9")]
    ),
    df.NetworkError,
    "in9",
)
row(
    "network-cycle",
    lambda: df.Network([L.ReLU(name="a"), L.ReLU(name="b")], connections=[("a", "b"), ("b", "a")]),
    df.NetworkError,
    "cycle|a|b",
)
row(
    "network-initialize-no-key",
    lambda: df.Network([L.FeatureInput(3), L.FullyConnected(2)]).initialize(),
    df.NetworkError,
    "key",
)
row(
    "network-initialize-int-key",
    lambda: df.Network([L.FeatureInput(3), L.FullyConnected(2)]).initialize(key=42),
    df.NetworkError,
    "key",
    r"jax\.random\.key\(42\)",
)
row(
    "network-initialize-tuple-layout",
    lambda: df.Network([L.FullyConnected(2)]).initialize((None, 3), key=KEY),
    df.NetworkError,
    "Layout|layout",
)
row(
    "network-initialize-missing-layout",
    lambda: df.Network([L.FullyConnected(2)]).initialize(key=KEY),
    df.NetworkError,
    "input|layout",
)
row(
    "predict-uninitialized",
    lambda: df.Network([L.FeatureInput(3), L.FullyConnected(2)]).predict(X()),
    df.NetworkError,
    "initialize",
)
row("predict-wrong-features", lambda: fc_net().predict(X(c=4)), df.NetworkError, "'in'", "3", "4")
row(
    "predict-wrong-rank",
    lambda: fc_net().predict(np.ones(3, np.float32)),
    df.NetworkError,
    "'in'",
    "2-D",
)
row("predict-complex", lambda: fc_net().predict(X() + 1j), df.NetworkError, "complex", "imaginary")
row(
    "predict-strings",
    lambda: fc_net().predict(np.array([["a", "b", "c"]])),
    df.NetworkError,
    "'in'",
    "dtype|str",
)
row("predict-ragged", lambda: fc_net().predict([[1.0, 2.0, 3.0], [1.0]]), df.NetworkError, "ragged")
row("predict-none", lambda: fc_net().predict(None), df.NetworkError, "None")
row("predict-two-inputs", lambda: fc_net().predict(X(), X()), df.NetworkError, "1 input", "2")
row("predict-keyword-input", lambda: fc_net().predict(x=X()), df.NetworkError, "x|keyword")
row(
    "predict-wrong-format",
    lambda: fc_net().predict(df.dlarray(X(), "CB")),
    df.NetworkError,
    "CB|BC",
)
row(
    "predict-acceleration-word",
    lambda: fc_net().predict(X(), acceleration="fast"),
    df.NetworkError,
    "fast",
    "auto",
)
row(
    "predict-outputs-unknown",
    lambda: fc_net().predict(X(), outputs="nope"),
    df.NetworkError,
    "nope",
)
row("forward-int-key", lambda: fc_net().forward(X(), key=3), df.NetworkError, "key")
row("layer-lookup-unknown", lambda: fc_net().layer("nope"), df.NetworkError, "nope", "fc")
row(
    "replace-learnable-shape",
    lambda: fc_net().replace(learnables={"fc/bias": jnp.ones(5)}),
    df.Error,
    "'bias'",
    r"float32\[5\]",
    r"\(2,\)",
)
row(
    "replace-learnable-int",
    lambda: fc_net().replace(learnables={"fc/weights": jnp.ones((2, 3), jnp.int32)}),
    df.Error,
    "weights",
    "int",
)
row(
    "replace-learnable-unknown",
    lambda: fc_net().replace(learnables={"fc/bais": jnp.ones(2)}),
    df.NetworkError,
    "bais",
)
row(
    "replace-learnable-no-slash",
    lambda: fc_net().replace(learnables={"bias": jnp.ones(2)}),
    df.NetworkError,
    "bias",
    "layer/parameter",
)
row(
    "replace-learnable-list",
    lambda: fc_net().replace(learnables=[1, 2]),
    df.NetworkError,
    "learnables",
    "list",
)
row(
    "replace-layer-unknown",
    lambda: fc_net().replace_layer("nope", L.ReLU()),
    df.NetworkError,
    "nope",
)
row(
    "replace-layer-reconnect",
    lambda: fc_net().replace_layer("fc", L.ReLU(), reconnect_by="port"),
    df.NetworkError,
    "reconnect_by",
    "port",
)
row("remove-layers-unknown", lambda: fc_net().remove_layers("nope"), df.NetworkError, "nope")
row(
    "connect-unknown",
    lambda: fc_net().add_layers(L.ReLU(name="r")).connect_layers("fc", "nope"),
    df.NetworkError,
    "nope",
)
row("add-layers-duplicate", lambda: fc_net().add_layers(L.ReLU(name="fc")), df.NetworkError, "'fc'")
row(
    "disconnect-unconnected",
    lambda: fc_net().disconnect_layers("in", "nope"),
    df.NetworkError,
    "nope",
)
row(
    "trainnet-on-layer",
    lambda: df.trainnet(X(), X(c=2), L.FullyConnected(2), "mse", quiet()),
    df.OptionsError,
    "Network|layer",
)

# -- checking ---------------------------------------------------------------------------------

row(
    "check-layer-not-layer",
    lambda: df.check_layer(jnp.ones(3), df.Layout((2, 3), "BC")),
    df.CheckError,
    "Layer|layer",
)
row("check-layer-tuple-layout", lambda: df.check_layer(L.ReLU(), (2, 3)), df.Error, "Layout|layout")
row(
    "check-function-not-function",
    lambda: df.check_function(lambda x: x, jnp.ones(3)),
    df.CheckError,
    "DifferentiableFunction",
)
row(
    "check-function-string-input", lambda: df.check_function(Square(), "abc"), df.Error, "str|input"
)

# -- training: options ------------------------------------------------------------------------

row(
    "options-unknown",
    lambda: df.TrainingOptions(max_epoch=3),
    df.OptionsError,
    "max_epoch",
    "max_epochs",
)
row("options-solver", lambda: df.TrainingOptions("adamw"), df.OptionsError, "adamw", "sgdm")
row(
    "options-pairs",
    lambda: df.TrainingOptions("adam", "MaxEpochs", 3),
    df.OptionsError,
    "MaxEpochs",
    "max_epochs=3",
)
row(
    "options-epochs-zero",
    lambda: df.TrainingOptions(max_epochs=0),
    df.OptionsError,
    "max_epochs",
    "0",
)
row(
    "options-epochs-float",
    lambda: df.TrainingOptions(max_epochs=2.5),
    df.OptionsError,
    "max_epochs",
    "2.5",
)
row(
    "options-batch-neg",
    lambda: df.TrainingOptions(mini_batch_size=-1),
    df.OptionsError,
    "mini_batch_size",
)
row(
    "options-batch-str",
    lambda: df.TrainingOptions(mini_batch_size="32"),
    df.OptionsError,
    "mini_batch_size",
)
row(
    "options-shuffle",
    lambda: df.TrainingOptions(shuffle="always"),
    df.OptionsError,
    "shuffle",
    "always",
)
row(
    "options-lr-neg",
    lambda: df.TrainingOptions(initial_learn_rate=-0.1),
    df.OptionsError,
    "initial_learn_rate",
)
row(
    "options-lr-str",
    lambda: df.TrainingOptions(initial_learn_rate="fast"),
    df.OptionsError,
    "initial_learn_rate",
)
row(
    "options-drop-factor",
    lambda: df.TrainingOptions(learn_rate_drop_factor=2.0),
    df.OptionsError,
    "learn_rate_drop_factor",
)
row(
    "options-schedule",
    lambda: df.TrainingOptions(learn_rate_schedule="cosine-ish"),
    df.OptionsError,
    "learn_rate_schedule",
)
row(
    "options-momentum-adam",
    lambda: df.TrainingOptions("adam", momentum=0.9),
    df.OptionsError,
    "momentum",
    "sgdm",
)
row("options-momentum-range", lambda: df.TrainingOptions(momentum=1.5), df.OptionsError, "momentum")
row(
    "options-beta-rmsprop",
    lambda: df.TrainingOptions("rmsprop", gradient_decay_factor=0.9),
    df.OptionsError,
    "gradient_decay_factor",
)
row("options-epsilon", lambda: df.TrainingOptions("adam", epsilon=-1.0), df.OptionsError, "epsilon")
row(
    "options-l2",
    lambda: df.TrainingOptions(l2_regularization=-1e-4),
    df.OptionsError,
    "l2_regularization",
)
row(
    "options-threshold-method",
    lambda: df.TrainingOptions(gradient_threshold_method="l1"),
    df.OptionsError,
    "gradient_threshold_method",
    "l1",
)
row(
    "options-threshold",
    lambda: df.TrainingOptions(gradient_threshold=-1),
    df.OptionsError,
    "gradient_threshold",
)
row(
    "options-validation-frequency",
    lambda: df.TrainingOptions(validation_frequency=0),
    df.OptionsError,
    "validation_frequency",
)
row(
    "options-patience",
    lambda: df.TrainingOptions(validation_patience=0),
    df.OptionsError,
    "validation_patience",
)
row(
    "options-objective",
    lambda: df.TrainingOptions(objective_metric_name=3),
    df.OptionsError,
    "objective_metric_name",
)
row(
    "options-output-network",
    lambda: df.TrainingOptions(output_network="last"),
    df.OptionsError,
    "output_network",
    "last",
)
row("options-verbose", lambda: df.TrainingOptions(verbose="yes"), df.OptionsError, "verbose")
row(
    "options-verbose-frequency",
    lambda: df.TrainingOptions(verbose_frequency=0),
    df.OptionsError,
    "verbose_frequency",
)
row(
    "options-plots",
    lambda: df.TrainingOptions(plots="training"),
    df.OptionsError,
    "plots",
    "training",
)
row("options-output-fcn", lambda: df.TrainingOptions(output_fcn=3), df.OptionsError, "output_fcn")
row(
    "options-execution-environment",
    lambda: df.TrainingOptions(execution_environment="tpu9"),
    df.OptionsError,
    "execution_environment",
    "tpu9",
)
row(
    "options-checkpoint-frequency",
    lambda: df.TrainingOptions(checkpoint_frequency=0),
    df.OptionsError,
    "checkpoint_frequency",
)
row(
    "options-checkpoint-unit",
    lambda: df.TrainingOptions(checkpoint_frequency_unit="step"),
    df.OptionsError,
    "checkpoint_frequency_unit",
    "step",
)
row(
    "options-checkpoint-keep",
    lambda: df.TrainingOptions(checkpoint_keep=0),
    df.OptionsError,
    "checkpoint_keep",
)
row(
    "options-checkpoint-path-int",
    lambda: df.TrainingOptions(checkpoint_path=3),
    df.OptionsError,
    "checkpoint_path",
)
row(
    "options-steps-per-epoch",
    lambda: df.TrainingOptions(steps_per_epoch=0),
    df.OptionsError,
    "steps_per_epoch",
)
row(
    "options-metrics-unknown",
    lambda: df.TrainingOptions(metrics="acuracy"),
    df.OptionsError,
    "acuracy",
)
row(
    "options-metrics-class",
    lambda: df.TrainingOptions(metrics=df.metrics.Accuracy),
    df.OptionsError,
    "Accuracy",
    r"Accuracy\(\)",
)
row(
    "options-metric-fn-not-callable",
    lambda: df.metrics.FunctionMetric(3),
    df.OptionsError,
    "fn",
    "int",
)

# -- training: data ---------------------------------------------------------------------------

row(
    "trainnet-options-forgotten",
    lambda: df.trainnet(X(), X(c=2), fc_net(), "mse"),
    df.OptionsError,
    "options",
)
row(
    "trainnet-options-dict",
    lambda: train(options={"max_epochs": 1}),
    df.OptionsError,
    "options",
    "dict",
)
row("trainnet-int-key", lambda: train(key=0), df.OptionsError, "key", r"jax\.random\.key\(0\)")
row(
    "trainnet-empty-data",
    lambda: train(x=np.ones((0, 3), np.float32), t=np.ones((0, 2), np.float32)),
    df.OptionsError,
    "empty|0 observations|no observations",
)
row(
    "trainnet-count-mismatch",
    lambda: train(t=np.zeros((7, 2), np.float32)),
    df.OptionsError,
    "8",
    "7",
)
row("trainnet-complex-data", lambda: train(x=X() + 1j), df.OptionsError, "complex")
row(
    "trainnet-string-targets",
    lambda: train(t=np.array([["a", "b"]] * 8)),
    df.OptionsError,
    "dtype|str",
)
row(
    "trainnet-none-targets",
    lambda: df.trainnet(X(), None, fc_net(), "mse", quiet()),
    df.OptionsError,
    "None|target",
)
row("trainnet-wrong-features", lambda: train(x=X(c=5)), df.Error, "'in'|in", "3", "5")
row(
    "trainnet-labels-one-based",
    lambda: train_cls([1, 2, 3, 3]),
    df.OptionsError,
    "3",
    "class|label",
)
row("trainnet-labels-negative", lambda: train_cls([0, -1, 2, 1]), df.OptionsError, "-1")
row(
    "trainnet-labels-float",
    lambda: train_cls([0.5, 1.0, 2.0, 0.0]),
    df.OptionsError,
    "label|int|class",
)
row(
    "trainnet-int-onehot",
    lambda: train_cls(np.eye(3, dtype=np.int32)[[0, 1, 2, 0]], "index-crossentropy"),
    df.OptionsError,
    "one-hot",
    "argmax",
)
row(
    "trainnet-validation-no-targets",
    lambda: train(options=quiet(validation_data=X())),
    df.OptionsError,
    "validation_data",
)
row(
    "trainnet-validation-features",
    lambda: train(options=quiet(validation_data=(X(c=4), np.zeros((8, 2), np.float32)))),
    df.Error,
    "validation|'in'",
    "4",
)
row(
    "trainnet-loss-unknown",
    lambda: train(loss="mean-squared"),
    df.OptionsError,
    "mean-squared",
    "mse",
)
row(
    "trainnet-loss-class",
    lambda: train(loss=df.losses.MSE if hasattr(df.losses, "MSE") else type("MyLoss", (), {})),
    df.OptionsError,
    "class",
)
row("trainnet-loss-not-callable", lambda: train(loss=3), df.OptionsError, "loss", "int")


@case("trainnet-loss-returns-vector", df.OptionsError, "vector_loss", "scalar")
def _():
    def vector_loss(Y, T):
        return (df.stripdims(Y) - T) ** 2

    train(loss=vector_loss)


@case("trainnet-loss-returns-none", df.OptionsError, "no_return", "None", "return")
def _():
    def no_return(Y, T):
        jnp.mean((df.stripdims(Y) - T) ** 2)

    train(loss=no_return)


@case("trainnet-loss-arity", df.OptionsError, "three_args", "loss")
def _():
    def three_args(Y, T, W):
        return jnp.mean(W)

    train(loss=three_args)


@case("trainnet-loss-control-flow", df.AccelerationError, "branchy_loss", "jnp.where")
def _():
    def branchy_loss(Y, T):
        d = jnp.mean((df.stripdims(Y) - T) ** 2)
        return d if d > 1 else 2 * d

    train(loss=branchy_loss)


@case("trainnet-metric-arity", df.OptionsError, "one_arg", "metric")
def _():
    def one_arg(Y):
        return jnp.mean(df.stripdims(Y))

    train(options=quiet(metrics=one_arg, validation_data=(X(), np.zeros((8, 2), np.float32))))


# -- training: resume -------------------------------------------------------------------------

row("resume-missing", lambda: train(resume_from="/nonexistent/run"), df.Error, "nonexistent")


@case("resume-not-checkpoint", df.SerializationError, "network", "load")
def _(tmp=None):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = df.save(f"{folder}/net.difffn", fc_net())
        train(resume_from=str(path))


# -- persistence ------------------------------------------------------------------------------


def _in_tmp(fn):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return fn(folder)


row(
    "save-args-swapped",
    lambda: _in_tmp(lambda d: df.save(fc_net(), f"{d}/a.difffn")),
    df.SerializationError,
    "Network",
    "path first",
)
row("save-path-int", lambda: df.save(3, fc_net()), df.SerializationError, "path", "int")
row(
    "save-to-folder",
    lambda: _in_tmp(lambda d: df.save(d, fc_net())),
    df.SerializationError,
    "folder|directory",
)
row(
    "save-layer",
    lambda: _in_tmp(lambda d: df.save(f"{d}/a.difffn", L.ReLU())),
    df.SerializationError,
    "ReLU",
    "Network",
)
row(
    "load-missing",
    lambda: df.load("/nonexistent/a.difffn", like=fc_net()),
    df.SerializationError,
    "nonexistent",
    "does not exist",
)
row("load-no-like", lambda: df.load("/nonexistent/a.difffn"), df.SerializationError, "like")
row(
    "load-like-layer",
    lambda: df.load("/nonexistent/a.difffn", like=L.ReLU()),
    df.SerializationError,
    "like",
    "ReLU",
)
row(
    "load-folder",
    lambda: _in_tmp(lambda d: df.load(d, like=fc_net())),
    df.SerializationError,
    "folder",
)


def _write(folder, data: bytes):
    path = f"{folder}/bad.difffn"
    with open(path, "wb") as handle:
        handle.write(data)
    return path


row(
    "load-not-difffn",
    lambda: _in_tmp(lambda d: df.load(_write(d, b"PK\x03\x04" * 40), like=fc_net())),
    df.SerializationError,
    "bad.difffn",
    "difffn",
)
row(
    "load-empty-file",
    lambda: _in_tmp(lambda d: df.load(_write(d, b""), like=fc_net())),
    df.SerializationError,
    "bad.difffn",
)


@case("load-truncated", df.SerializationError, "truncated")
def _():
    def go(folder):
        path = df.save(f"{folder}/n.difffn", fc_net())
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        df.load(path, like=fc_net())

    _in_tmp(go)


@case("load-other-structure", df.SerializationError, "does not match", "like=")
def _():
    def go(folder):
        path = df.save(f"{folder}/n.difffn", fc_net())
        other = df.Network([L.FeatureInput(3, name="in"), L.FullyConnected(5, name="fc")])
        df.load(path, like=other.initialize(key=KEY))

    _in_tmp(go)


@case("load-exported-as-network", df.SerializationError, "exported", "load_exported")
def _():
    def go(folder):
        path = df.export(fc_net(), df.Layout((None, 3), "BC"), path=f"{folder}/e.difffn")
        df.load(path, like=fc_net())

    _in_tmp(go)


@case("load-exported-network-as-exported", df.SerializationError, "network", "like=")
def _():
    def go(folder):
        path = df.save(f"{folder}/n.difffn", fc_net())
        df.load_exported(path)

    _in_tmp(go)


row(
    "export-layer",
    lambda: df.export(L.ReLU(), df.Layout((None, 3), "BC"), path="x.difffn"),
    df.SerializationError,
    "ReLU",
    "Network",
)
row(
    "export-vjp-order",
    lambda: df.export(fc_net(), df.Layout((None, 3), "BC"), path="x.difffn", vjp_order=-1),
    df.SerializationError,
    "vjp_order",
    "-1",
)


@case("exported-wrong-shape", df.NetworkError, "'in'", r"\(8, 4\)")
def _():
    def go(folder):
        path = df.export(fc_net(), df.Layout((None, 3), "BC"), path=f"{folder}/e.difffn")
        df.load_exported(path)(X(c=4))

    _in_tmp(go)


@case("exported-strings", df.NetworkError, "'in'", "dtype|str")
def _():
    def go(folder):
        path = df.export(fc_net(), df.Layout((None, 3), "BC"), path=f"{folder}/e.difffn")
        df.load_exported(path)(np.array([["a", "b", "c"]]))

    _in_tmp(go)


@case("exported-two-inputs", df.NetworkError, "1 input", "2")
def _():
    def go(folder):
        path = df.export(fc_net(), df.Layout((None, 3), "BC"), path=f"{folder}/e.difffn")
        df.load_exported(path)(X(), X())

    _in_tmp(go)


# -- df.ops: format-aware operations ----------------------------------------------------------

IMAGE = df.dlarray(np.ones((5, 5, 2, 1), np.float32), "SSCB")
SEQ = df.dlarray(np.ones((4, 2, 3), np.float32), "CBT")
row(
    "ops-conv-plain-without-fmt",
    lambda: df.ops.conv(np.ones((5, 5, 2, 1), np.float32), jnp.ones((3, 3, 2, 4))),
    df.FormatError,
    "df.ops.conv",
    r"\(5, 5, 2, 1\)",
    "fmt=",
)
row(
    "ops-conv-fmt-on-formatted",
    lambda: df.ops.conv(IMAGE, jnp.ones((3, 3, 2, 4)), fmt="SSBC"),
    df.FormatError,
    "df.ops.conv",
    "'SSCB'",
    "'SSBC'",
)
row(
    "ops-conv-no-channel-axis",
    lambda: df.ops.conv(df.dlarray(np.ones((5, 5, 1), np.float32), "SSB"), jnp.ones((3, 3, 2, 4))),
    df.FormatError,
    "df.ops.conv",
    "'SSB'",
    "'C'",
)
row(
    "ops-conv-weights-channels",
    lambda: df.ops.conv(IMAGE, jnp.ones((3, 3, 3, 4))),
    df.OpError,
    "df.ops.conv",
    "2 channels",
    r"\(3, 3, 3, 4\)",
)
row(
    "ops-fully-connect-weights",
    lambda: df.ops.fully_connect(df.dlarray(np.ones((2, 3), np.float32), "BC"), jnp.ones((4, 5))),
    df.OpError,
    "df.ops.fully_connect",
    "3 features",
    r"\(4, 5\)",
)
row(
    "ops-softmax-no-channel-axis",
    lambda: df.ops.softmax(df.dlarray(np.ones((2, 3), np.float32), "BT")),
    df.FormatError,
    "df.ops.softmax",
    "'BT'",
    "'C'",
)
row(
    "ops-layernorm-offset-size",
    lambda: df.ops.layernorm(
        df.dlarray(np.ones((2, 3), np.float32), "BC"), jnp.zeros(4), jnp.ones(4)
    ),
    df.OpError,
    "df.ops.layernorm",
    "offset",
    r"\(4,\)",
    "3 channels",
)
row(
    "ops-attention-formats-differ",
    lambda: df.ops.attention(SEQ, df.permute(SEQ, "BTC"), SEQ, 1),
    df.FormatError,
    "df.ops.attention",
    "'BTC'",
    "'CBT'",
)
row(
    "ops-attention-heads",
    lambda: df.ops.attention(SEQ, SEQ, SEQ, 3),
    df.OpError,
    "num_heads=3",
    "4 channels",
)
row("ops-max-pool-window", lambda: df.ops.max_pool(IMAGE, 7), df.OpError, "max_pool", "7", "5")
row(
    "ops-groupnorm-groups",
    lambda: df.ops.groupnorm(IMAGE, 3, jnp.zeros(2), jnp.ones(2)),
    df.OpError,
    "df.ops.groupnorm",
    "num_groups=3",
    "2 channels",
)
row(
    "ops-lstm-recurrent-weights",
    lambda: df.ops.lstm(
        df.dlarray(np.ones((2, 3), np.float32), "BC"),
        jnp.zeros((2, 4)),
        jnp.zeros((2, 4)),
        jnp.ones((16, 3)),
        jnp.ones((16, 4)),
        jnp.zeros(16),
    ),
    df.OpError,
    "df.ops.lstm",
    "recurrent_weights",
    r"\(16, 4\)",
)
row(
    "ops-onehot-decode-no-channel-axis",
    lambda: df.ops.onehot_decode(df.dlarray(np.ones((2, 3), np.float32), "BT")),
    df.FormatError,
    "onehot_decode",
    "'BT'",
    "'C'",
)

# -- layers of version 2: options and formats --------------------------------------------------

row("conv1d-filter-pair", lambda: L.Conv1D((3, 3), 4), df.LayerError, "Conv1D", r"\(3, 3\)")
row("conv1d-padding-valid", lambda: L.Conv1D(3, 4, padding="valid"), df.LayerError, "valid")
row("conv3d-filter-pair", lambda: L.Conv3D((3, 3), 4), df.LayerError, "Conv3D", "3 positive")
row("conv3d-stride", lambda: L.Conv3D(3, 4, stride=(1, 0, 1)), df.LayerError, r"\(1, 0, 1\)")
row(
    "transposed-conv-cropping",
    lambda: L.TransposedConv2D(3, 4, cropping="full"),
    df.LayerError,
    "TransposedConv2D",
    "cropping",
    "'full'",
    "cropping='same'",
)
row("transposed-conv-filters", lambda: L.TransposedConv2D(3, 0), df.LayerError, "num_filters")
row("avgpool-size-zero", lambda: L.AveragePool2D(0), df.LayerError, "AveragePool2D", "pool_size")
row(
    "avgpool-padding-value",
    lambda: L.AveragePool2D(2, padding_value="max"),
    df.LayerError,
    "padding_value",
    "'max'",
)
row("groupnorm-groups-word", lambda: L.GroupNorm("all"), df.LayerError, "num_groups", "'all'")
row(
    "groupnorm-groups-divide",
    lambda: df.Network([L.ImageInput((4, 4, 3)), L.GroupNorm(2)]).initialize(key=KEY),
    df.LayerError,
    "GroupNorm",
    "3 channels",
    "num_groups=2",
)
row("resize-method", lambda: L.Resize2D(scale=2, method="cubic"), df.LayerError, "cubic")
row(
    "resize-scale-and-size",
    lambda: L.Resize2D(scale=2, output_size=(4, 4)),
    df.LayerError,
    "Resize2D",
    "scale",
    "output_size",
)
row("leaky-relu-scale", lambda: L.LeakyReLU("a"), df.LayerError, "LeakyReLU", "scale", "'a'")
row("clipped-relu-ceiling", lambda: L.ClippedReLU(-1), df.LayerError, "ceiling", "-1")
row(
    "global-max-pool-on-features",
    lambda: df.Network([L.FeatureInput(3), L.GlobalMaxPool2D()]).initialize(key=KEY),
    df.FormatError,
    "GlobalMaxPool2D",
    "'BC'",
)
row(
    "conv1d-on-images",
    lambda: df.Network([L.ImageInput((4, 4, 3)), L.Conv1D(3, 2)]).initialize(key=KEY),
    df.FormatError,
    "Conv1D",
    "'BSSC'",
    "Conv2D",
)
row(
    "conv3d-on-images",
    lambda: df.Network([L.ImageInput((4, 4, 3)), L.Conv3D(3, 2)]).initialize(key=KEY),
    df.FormatError,
    "Conv3D",
    "'BSSC'",
    "'BSSSC'",
)

# -- sequences, precision and scale options ----------------------------------------------------

row(
    "options-sequence-length-word",
    lambda: df.TrainingOptions(sequence_length="longests"),
    df.OptionsError,
    "sequence_length",
    "'longests'",
    "'longest'",
)
row(
    "options-sequence-length-zero",
    lambda: df.TrainingOptions(sequence_length=0),
    df.OptionsError,
    "sequence_length",
    "got 0",
)
row(
    "options-sequence-direction",
    lambda: df.TrainingOptions(sequence_padding_direction="up"),
    df.OptionsError,
    "sequence_padding_direction",
    "'up'",
)
row(
    "options-sequence-padding-value",
    lambda: df.TrainingOptions(sequence_padding_value="zero"),
    df.OptionsError,
    "sequence_padding_value",
    "'zero'",
)
row(
    "options-sequence-bucketing",
    lambda: df.TrainingOptions(sequence_bucketing=0),
    df.OptionsError,
    "sequence_bucketing",
    "got 0",
)
row(
    "options-precision-fp8",
    lambda: df.TrainingOptions(precision="fp8"),
    df.OptionsError,
    "precision",
    "'fp8'",
    "'bfloat16'",
)
row(
    "options-fsdp-on-one-device",
    lambda: df.TrainingOptions(parameter_sharding="fsdp"),
    df.OptionsError,
    "parameter_sharding",
    "execution_environment='auto'",
)
row(
    "options-mesh-axis",
    lambda: df.TrainingOptions(execution_environment="multi-device", mesh_shape={"batch": 2}),
    df.OptionsError,
    "mesh_shape",
    "'batch'",
    "'data', 'model'",
)
row(
    "options-mesh-two-inferred",
    lambda: df.TrainingOptions(
        execution_environment="multi-device", mesh_shape={"data": -1, "model": -1}
    ),
    df.OptionsError,
    "mesh_shape",
    "-1",
)
row(
    "trainnet-multi-host-without-jax-distributed",
    lambda: train(options=quiet(execution_environment="multi-host")),
    df.OptionsError,
    "multi-host",
    r"jax\.distributed\.initialize",
)
row(
    "learnable-sharding-tuple",
    lambda: df.learnable(sharding=(None, "model")),
    df.LayerError,
    "sharding",
    "tuple",
    "PartitionSpec",
)


@case("partition-spec-unknown-mesh-axis", df.OptionsError, "'bad/weights'", "'tensor'", "'data'")
def _():
    class TensorParallel(df.Layer):
        weights: jax.Array | None = df.learnable(
            default=None, sharding=jax.sharding.PartitionSpec(None, "tensor")
        )

        def initialize(self, layout, *, key):
            return self.replace(weights=jnp.ones((layout.size("C"), 2)))

        def predict(self, x):
            return x @ self.weights

    net = df.Network([L.FeatureInput(3, name="in"), TensorParallel(name="bad")])
    train(net=net, options=quiet(execution_environment="multi-device"))


# -- ONNX --------------------------------------------------------------------------------------


def _onnx_relu(opset: int) -> bytes:
    """A one-node ONNX model made with the onnx package itself (not by difffn)."""
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [value("x", TensorProto.FLOAT, [1, 3])],
        [value("y", TensorProto.FLOAT, [1, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model.SerializeToString()


def _import_file(content: bytes):
    def go(folder):
        with open(f"{folder}/model.onnx", "wb") as file:
            file.write(content)
        return df.import_onnx(f"{folder}/model.onnx")

    return _in_tmp(go)


row(
    "onnx-truncated-file",
    lambda: _import_file(_onnx_relu(13)[:20]),
    df.ONNXImportError,
    "model.onnx",
    "truncated",
)
row(
    "onnx-not-an-onnx-file",
    lambda: _import_file(b"name,value\n1,2\n"),
    df.ONNXImportError,
    "model.onnx",
    "not an ONNX model",
)
row(  # opsets 6-8 are converted by onnx.version_converter since issue 25: no longer a mistake
    "onnx-input-data-formats-not-a-format",
    lambda: df.import_onnx(_onnx_relu(13), input_data_formats=3),
    df.ONNXImportError,
    "input_data_formats",
    "'onnx'",
)
row("onnx-source-int", lambda: df.import_onnx(3), df.ONNXImportError, "import_onnx", "int")
row(
    "onnx-export-a-layer",
    lambda: df.export_onnx(L.ReLU(), df.Layout((None, 3), "BC"), path="x.onnx"),
    df.ONNXExportError,
    "df.Network",
    "ReLU",
)


# -- solvers and small functions --------------------------------------------------------------

row(
    "adamupdate-iteration-zero",
    lambda: df.adamupdate({"w": jnp.ones(2)}, {"w": jnp.ones(2)}, None, None, 0),
    df.OptionsError,
    "iteration",
    "1",
)
row(
    "sgdmupdate-lr",
    lambda: df.sgdmupdate({"w": jnp.ones(2)}, {"w": jnp.ones(2)}, None, learn_rate=-1.0),
    df.OptionsError,
    "learn_rate",
)
row(
    "scores2label-classes",
    lambda: df.scores2label(np.ones((2, 3), np.float32), ["a", "b"]),
    df.Error,
    "3",
    "2",
)
row(
    "minibatchpredict-batch",
    lambda: df.minibatchpredict(fc_net(), X(), mini_batch_size=0),
    df.Error,
    "mini_batch_size",
)
row(
    "testnet-metric",
    lambda: df.testnet(fc_net(), X(), np.zeros((8, 2), np.float32), "acuracy"),
    df.Error,
    "acuracy",
)


# -- the test ---------------------------------------------------------------------------------


def test_the_catalogue_is_large_and_distinct():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert len(ids) >= 150, len(ids)


@pytest.mark.parametrize("mistake", CASES, ids=[c.id for c in CASES])
def test_a_mistake_gets_a_named_error_with_a_fix(mistake: Case):
    with pytest.raises(df.Error) as caught:
        mistake.make()
    error = caught.value
    message = str(error)
    assert isinstance(error, mistake.error), f"{type(error).__name__}: {message}"
    for pattern in (*mistake.match, FIX):
        assert re.search(pattern, message, re.S), f"{pattern!r} not in: {message}"


def test_an_error_in_backward_under_grad_shows_one_traceback():
    # Item 12: JAX chains its record of the forward call (JaxStackTraceBeforeTransformation) to
    # an error raised in a backward rule, printed as a second traceback of JAX's frames.
    class WrongShape(df.DifferentiableFunction):
        def forward(self, x):
            return 2 * x

        def backward(self, dy, compute_gradients):
            return jnp.ones(4)

    with pytest.raises(df.BackwardError, match=r"WrongShape\.backward") as caught:
        jax.grad(lambda x: WrongShape()(x).sum())(jnp.ones(3))
    assert type(caught.value.__cause__).__name__ != "JaxStackTraceBeforeTransformation"
    printed = "".join(traceback.format_exception(caught.value))
    assert "preceding stack trace" not in printed
