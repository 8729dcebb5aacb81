"""df.Layer: fields and pytrees, base properties, the method contract, formats, custom backward."""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df
from difffn._layer._layer_call import call_layer

# --------------------------------------------------------------------------------------------
# Layers used in these tests


class PReLU(df.Layer):
    """Per-channel PReLU with a correct custom backward; counts backward calls."""

    alpha: jax.Array | None = df.learnable(default=None)
    calls = []  # a class attribute without annotation: not a field

    def initialize(self, layout, *, key):
        if self.alpha is None:
            shape = [1] * layout.ndim
            shape[layout.finddim("C")[0]] = layout.size("C")
            return self.replace(alpha=0.25 + 0.1 * jax.random.uniform(key, shape))
        return self

    def predict(self, x):
        return jnp.maximum(x, 0) + self.alpha * jnp.minimum(x, 0)

    def backward(self, x, y, dy, memory):
        PReLU.calls.append("backward")
        dx = jnp.where(x > 0, dy, self.alpha * dy)
        dalpha = jnp.sum(jnp.where(x > 0, 0.0, x * dy), axis=(0, 1, 2), keepdims=True)
        return dx, dalpha


def prelu_reference(alpha, x):
    return jnp.maximum(x, 0) + alpha * jnp.minimum(x, 0)


class WeightedAddition(df.Layer):
    """Several inputs, one learnable weight per input (MATLAB's weighted addition example)."""

    weights: jax.Array | None = df.learnable(default=None)

    def __init__(self, num_inputs, *, name=""):
        self.num_inputs = num_inputs
        self.name = name

    def initialize(self, *layouts, key):
        if self.weights is None:
            return self.replace(weights=jax.random.uniform(key, (len(layouts),)))
        return self

    def predict(self, *xs):
        return sum(w * x for w, x in zip(self.weights, xs))

    def backward(self, *args):
        n = self.num_inputs
        xs, dy = args[:n], args[n + 1]
        dxs = tuple(w * dy for w in self.weights)
        dw = jnp.stack([jnp.sum(dy * x) for x in xs])
        return (*dxs, dw)


class SplitWithMemory(df.Layer):
    """Two outputs, a forward that hands a memory value to backward."""

    scale: jax.Array | None = df.learnable(default=None)

    def predict(self, x):
        return jnp.sin(x) * self.scale, jnp.cos(x) * self.scale

    def forward(self, x):
        s, c = jnp.sin(x), jnp.cos(x)
        return s * self.scale, c * self.scale, (s, c)

    def backward(self, x, y1, y2, dy1, dy2, memory):
        s, c = memory
        dx = (dy1 * c - dy2 * s) * self.scale
        dscale = jnp.sum(dy1 * s + dy2 * c)
        return dx, dscale


class Accumulator(df.Layer):
    """A state that the output depends on, with dLdSout/dLdSin in backward."""

    total: jax.Array | None = df.state(default=None)

    def initialize(self, layout, *, key):
        return self if self.total is not None else self.replace(total=jnp.zeros(layout.size("C")))

    def predict(self, x):
        new_total = self.total + jnp.sum(x, axis=0)
        return x * new_total[None, :], new_total

    def backward(self, x, y, dy, dtotal_out, memory):
        new_total = self.total + jnp.sum(x, axis=0)
        dnew = jnp.sum(dy * x, axis=0) + dtotal_out
        dx = dy * new_total[None, :] + dnew[None, :]
        return dx, dnew

    def reset_state(self):
        return self.replace(total=jnp.zeros_like(self.total))


def accumulator_reference(total, x):
    new_total = total + jnp.sum(x, axis=0)
    return x * new_total[None, :], new_total


class Projection(df.Layer):
    """Formattable: "BSSC" in, "BC" out."""

    formattable = True
    weights: jax.Array | None = df.learnable(default=None)
    output_size: int = 3

    def initialize(self, layout, *, key):
        if self.weights is None:
            features = layout.size("C") * int(np.prod(layout.size("S")))
            return self.replace(weights=jax.random.normal(key, (features, self.output_size)))
        return self

    def predict(self, x):
        assert isinstance(x, df.FormattedArray)
        flat = df.stripdims(x).reshape(x.shape[df.finddim(x, "B")[0]], -1)
        return df.dlarray(flat @ self.weights, "BC")


def image(key, shape=(2, 3, 3, 4), dtype=jnp.float32):
    return jax.random.normal(key, shape, dtype)


def init(layer, layout_shape=(None, 3, 3, 4), fmt="BSSC", key=None):
    return layer.initialize(
        df.Layout(layout_shape, fmt), key=jax.random.key(1) if key is None else key
    )


# --------------------------------------------------------------------------------------------
# fields, pytrees, immutability


def test_fields_are_classified_by_kind_and_value(key):
    class Mixed(df.Layer):
        w: jax.Array | None = df.learnable(default=None)
        s: jax.Array | None = df.state(default=None)
        table: jax.Array | None = None  # an array property: a non-trained leaf
        size: int = 3  # hashable property: static

        def predict(self, x):
            return x * self.w + self.table, self.s

    layer = Mixed(w=jnp.ones(2), s=jnp.zeros(2), table=jnp.arange(2.0))
    leaves, tree = jax.tree.flatten(layer)
    assert len(leaves) == 3
    assert [jax.tree_util.keystr(p) for p, _ in jax.tree.flatten_with_path(layer)[0]] == [
        ".w",
        ".s",
        ".table",
    ]
    # static values are part of the structure: changing one changes the compiled trace's key
    assert jax.tree.structure(layer.replace(size=4)) != tree
    assert layer.learnable_names == ("w",) and layer.state_names == ("s",)
    # mapping keeps the structure even when leaves become non-arrays
    assert jax.tree.structure(jax.tree.map(lambda _: True, layer)) == tree


def test_layers_are_immutable_and_replace_returns_a_new_layer():
    layer = PReLU(alpha=jnp.ones((1, 1, 1, 2)), name="p")
    with pytest.raises(
        df.LayerError, match=r"PReLU is immutable.*layer = layer\.replace\(alpha=\.\.\.\)"
    ):
        layer.alpha = jnp.zeros(2)
    new = layer.replace(alpha=jnp.zeros((1, 1, 1, 2)))
    assert new is not layer and float(layer.alpha.sum()) == 2.0
    with pytest.raises(df.LayerError, match=r"PReLU\.replace got unknown field\(s\) \['beta'\]"):
        layer.replace(beta=1)


def test_unhashable_property_is_a_clear_error():
    class Bad(df.Layer):
        sizes: list = None

        def predict(self, x):
            return x

    with pytest.raises(df.LayerError, match=r"Bad\.sizes holds an unhashable list.*use a tuple"):
        Bad(sizes=[1, 2])


def test_integer_learnable_is_a_clear_error():
    with pytest.raises(
        df.LayerError, match=r"PReLU\.alpha is a learnable parameter but holds a int32"
    ):
        PReLU(alpha=jnp.array([1, 2]))


def test_python_number_learnable_becomes_a_float_array():
    assert PReLU(alpha=2).alpha.dtype == jnp.float32


def test_hand_written_init_sets_defaults_and_missing_fields_are_errors():
    layer = WeightedAddition(3, name="wadd")
    assert layer.weights is None and layer.num_inputs == 3
    assert layer.input_names == ("in1", "in2", "in3")

    class NoDefault(df.Layer):
        size: int

        def __init__(self):
            pass

        def predict(self, x):
            return x

    with pytest.raises(
        df.LayerError, match=r"NoDefault\.__init__ did not set field\(s\) \['size'\]"
    ):
        NoDefault()


def test_constructor_arguments_are_checked_before_the_call():
    with pytest.raises(
        df.LayerError,
        match=r"PReLU\(\.\.\.\) could not be constructed: got an unexpected keyword argument "
        r"'beta'\. Its fields are: name, .*, alpha\.",
    ):
        PReLU(beta=1.0)
    with pytest.raises(df.LayerError, match=r"WeightedAddition\(\.\.\.\) could not be constructed"):
        WeightedAddition()

    class Strict(df.Layer):
        def __init__(self, size):
            self.size = int(size)  # a TypeError raised here is the user's own, and stays one

        size: int = 1

        def predict(self, x):
            return x

    with pytest.raises(TypeError, match=r"int\(\) argument must be") as caught:
        Strict(None)
    assert not isinstance(caught.value, df.Error)


# --------------------------------------------------------------------------------------------
# base properties


def test_base_properties_have_matlab_defaults():
    layer = PReLU()
    assert (layer.name, layer.type, layer.description) == ("", "PReLU", "PReLU")
    assert (layer.num_inputs, layer.input_names) == (1, ("in",))
    assert (layer.num_outputs, layer.output_names) == (1, ("out",))
    assert SplitWithMemory(num_outputs=2).output_names == ("out1", "out2")


def test_num_inputs_is_inferred_from_predict_and_names_follow():
    class Three(df.Layer):
        def predict(self, a, b, c):
            return a + b + c

    assert Three().num_inputs == 3 and Three().input_names == ("in1", "in2", "in3")
    assert Three(input_names=("x", "y", "z")).num_inputs == 3


def test_inconsistent_ports_are_errors():
    with pytest.raises(
        df.LayerError, match=r"num_outputs=3 but output_names=\('a', 'b'\) \(2 names\)"
    ):
        SplitWithMemory(num_outputs=3, output_names=("a", "b"))
    with pytest.raises(df.LayerError, match=r"predict takes 1 input\(s\) but num_inputs is 2"):
        PReLU(num_inputs=2)
    with pytest.raises(df.LayerError, match=r"expected distinct non-empty strings"):
        WeightedAddition(2).replace(input_names=("a", "a"))


def test_replacing_a_count_regenerates_default_names():
    layer = WeightedAddition(2).replace(num_inputs=4)
    assert layer.input_names == ("in1", "in2", "in3", "in4")


# --------------------------------------------------------------------------------------------
# initialize, predict, forward, backward


def test_initialize_fills_only_empty_parameters_and_is_idempotent(key):
    layer = init(PReLU())
    again = layer.initialize(df.Layout((None, 3, 3, 4), "BSSC"), key=jax.random.key(99))
    assert again.alpha is layer.alpha
    assert layer.initialized and not PReLU().initialized


def test_calling_an_uninitialized_layer_says_to_initialize(key):
    class Scale(df.Layer):  # no custom backward: the raw error used to come from `x * None`
        w: jax.Array | None = df.learnable(default=None)

        def predict(self, x):
            return x * self.w

    for layer in (Scale(name="s"), PReLU(name="p")):
        name = type(layer).__name__
        with pytest.raises(
            df.LayerError,
            match=rf"{name} \(layer '{layer.name}'\): parameter\(s\) \['(w|alpha)'\] are None, so "
            r"the layer cannot run\. Fix: call layer\.initialize\(layout, key=key\)",
        ):
            layer(jnp.ones((1, 1, 1, 2)))


def test_initialize_takes_layouts_or_formatted_examples_not_tuples(key):
    with pytest.raises(
        df.LayerError,
        match=r"PReLU \(layer 'p'\)\.initialize takes a df\.Layout .*; layout 1 is a tuple \(None, "
        r"3, 3, 4\)\. Fix: layer\.initialize\(df\.Layout\(\(None, 3\), 'BC'\), key=key\)",
    ):
        PReLU(name="p").initialize((None, 3, 3, 4), key=key)
    example = df.dlarray(image(key), "BSSC")  # MATLAB's initialize also takes an example dlarray
    assert PReLU().initialize(example, key=key).alpha.shape == (1, 1, 1, 4)


def test_an_exception_in_initialize_names_the_layer_and_keeps_the_cause(key):
    class Fragile(PReLU):
        def initialize(self, layout, *, key):
            return self.replace(alpha=jnp.ones(layout.shape[7]))

    with pytest.raises(
        df.LayerError,
        match=r"Fragile\.initialize \(layer 'f'\) raised IndexError: tuple index out of range \(at "
        r"test_layer\.py:\d+, in initialize\), given the layouts \[\"Layout\(\(None, 3, 3, 4\), "
        r"'BSSC'\)\"\]",
    ) as caught:
        init(Fragile(name="f"))
    assert isinstance(caught.value.__cause__, IndexError)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_custom_backward_is_used_and_matches_autodiff(jit, key, x64):
    layer = init(PReLU()).replace(alpha=jnp.full((1, 1, 1, 4), 0.3, jnp.float64))
    x = image(key, dtype=jnp.float64)
    upstream = jax.random.normal(jax.random.fold_in(key, 1), x.shape, jnp.float64)

    def loss(layer, x):
        return jnp.sum(layer(x) * upstream)

    grad_fn = jax.jit(jax.grad(loss, (0, 1))) if jit else jax.grad(loss, (0, 1))
    PReLU.calls.clear()
    g_layer, g_x = grad_fn(layer, x)
    assert PReLU.calls == ["backward"]
    expected = jax.grad(lambda a, x: jnp.sum(prelu_reference(a, x) * upstream), (0, 1))(
        layer.alpha, x
    )
    assert_tree_allclose((g_layer.alpha, g_x), expected, rtol=1e-12)
    assert isinstance(g_layer, PReLU)


def test_multiple_inputs_and_learnable_gradients_in_declaration_order(key, x64):
    layer = WeightedAddition(3).initialize(*[df.Layout((None, 2), "BC")] * 3, key=key)
    xs = [jax.random.normal(jax.random.fold_in(key, i), (4, 2), jnp.float64) for i in range(3)]
    layer = layer.replace(weights=jnp.array([0.5, -1.0, 2.0]))

    def loss(layer, *xs):
        return jnp.sum(jnp.tanh(layer(*xs)))

    got = jax.grad(loss, (0, 1, 2, 3))(layer, *xs)
    expected = jax.grad(
        lambda w, *xs: jnp.sum(jnp.tanh(sum(wi * x for wi, x in zip(w, xs)))), (0, 1, 2, 3)
    )(layer.weights, *xs)
    assert_tree_allclose((got[0].weights, *got[1:]), expected, rtol=1e-12)


def test_memory_goes_from_forward_to_backward(key, x64):
    layer = SplitWithMemory(scale=jnp.array(1.5, jnp.float64), num_outputs=2)
    x = jax.random.normal(key, (5,), jnp.float64)

    def loss(layer, x):
        (y1, y2), _ = call_layer(layer, (x,), training=True)
        return jnp.sum(y1 * 2 + y2**2)

    got = jax.grad(loss, (0, 1))(layer, x)
    expected = jax.grad(lambda s, x: jnp.sum(jnp.sin(x) * s * 2 + (jnp.cos(x) * s) ** 2), (0, 1))(
        layer.scale, x
    )
    assert_tree_allclose((got[0].scale, got[1]), expected, rtol=1e-12)


def test_state_outputs_and_their_gradients(key, x64):
    layer = Accumulator(total=jnp.array([0.5, -1.0], jnp.float64))
    x = jax.random.normal(key, (3, 2), jnp.float64)

    def loss(layer, x):
        y, new_total = layer(x)
        return jnp.sum(jnp.sin(y)) + jnp.sum(new_total**2)

    got = jax.grad(loss, (0, 1))(layer, x)
    expected = jax.grad(
        lambda t, x: (lambda y, n: jnp.sum(jnp.sin(y)) + jnp.sum(n**2))(
            *accumulator_reference(t, x)
        ),
        (0, 1),
    )(layer.total, x)
    assert_tree_allclose((got[0].total, got[1]), expected, rtol=1e-12)
    assert float(Accumulator(total=jnp.ones(2)).reset_state().total.sum()) == 0.0


def test_without_backward_autodiff_is_used(key):
    class Square(df.Layer):
        def predict(self, x):
            return x**2

    x = jnp.arange(3.0)
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(Square()(x)))(x), 2 * x)


def test_predict_returning_the_wrong_count_is_named():
    class Forgetful(df.Layer):
        s: jax.Array | None = df.state(default=None)

        def predict(self, x):
            return x

    with pytest.raises(
        df.ForwardError,
        match=r"Forgetful\.predict \(layer ''\) returned a single array; expected 2: 1 output\(s\), "
        r"then the new values of the 1 state field\(s\) \['s'\]",
    ):
        Forgetful(s=jnp.zeros(()))(jnp.ones(2))


def test_forward_with_backward_must_return_memory():
    class NoMemory(SplitWithMemory):
        def forward(self, x):
            return self.predict(x)

    with pytest.raises(
        df.ForwardError, match=r"returned 2 values; expected 3: 2 output\(s\), then a memory value"
    ):
        call_layer(NoMemory(scale=1.0, num_outputs=2), (jnp.ones(2),), training=True)


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            lambda dx, da: (dx,),
            r"returned 1 gradients; expected 2, one per value \(dLdin, dLdalpha\)",
        ),
        (
            lambda dx, da: (dx, jnp.sum(da)),
            r"returned the gradient of learnable 'alpha' \(2 of 2\) with shape \(\)",
        ),
        (
            lambda dx, da: (dx.astype(jnp.float16), da),
            r"returned the gradient of input 'in' \(1 of 2\) with shape \(2, 3, 3, 4\) and dtype float16",
        ),
    ],
    ids=["count", "shape", "dtype"],
)
def test_backward_checks_name_the_layer_and_parameter(bad, message, key):
    class Wrong(PReLU):
        def backward(self, x, y, dy, memory):
            return bad(*super().backward(x, y, dy, memory))

    layer = init(Wrong(name="oops"))
    with pytest.raises(df.BackwardError, match=r"Wrong\.backward \(layer 'oops'\) " + message):
        jax.grad(lambda layer, x: jnp.sum(layer(x)))(layer, image(key))


def test_backward_with_wrong_signature_is_named():
    class OddBackward(Accumulator):
        def backward(self, x, y, dy):
            return dy

    layer = OddBackward(total=jnp.zeros(2))
    with pytest.raises(
        df.LayerError, match=r"OddBackward\.backward takes 3 arguments after self; expected 4"
    ):
        jax.grad(lambda layer: jnp.sum(layer(jnp.ones((1, 2)))[0]))(layer)


# --------------------------------------------------------------------------------------------
# formats


def test_non_formattable_layer_gets_plain_arrays_and_outputs_take_the_format(key):
    seen = []

    class Probe(df.Layer):
        def predict(self, x):
            seen.append(x)
            return x * 2

    (y,), _ = call_layer(Probe(), (df.dlarray(image(key), "BSSC"),))
    assert not isinstance(seen[0], df.FormattedArray)
    assert isinstance(y, df.FormattedArray) and y.format == "BSSC"


def test_rank_change_without_formattable_says_to_set_it(key):
    class Flatten(df.Layer):
        def predict(self, x):
            return x.reshape(x.shape[0], -1)

    with pytest.raises(
        df.LayerError,
        match=r"has 2 dimensions but its input format 'BSSC' has 4.*set `formattable = True`",
    ):
        call_layer(Flatten(name="flat"), (df.dlarray(image(key), "BSSC"),))


def test_formattable_layer_changes_format_and_differentiates(key, x64):
    layer = init(Projection(), key=key)
    x = df.dlarray(image(key, dtype=jnp.float64), "BSSC")
    (y,), _ = call_layer(layer, (x,))
    assert y.format == "BC" and y.shape == (2, 3)
    g = jax.grad(lambda layer: jnp.sum(df.stripdims(call_layer(layer, (x,))[0][0]) ** 2))(layer)
    assert g.weights.shape == layer.weights.shape


def test_formattable_layer_must_return_formatted_outputs(key):
    class Forgot(Projection):
        def predict(self, x):
            return df.stripdims(super().predict(x))

    with pytest.raises(
        df.LayerError,
        match=r"Forgot \(layer ''\) is formattable but its output 'out' is a plain array",
    ):
        call_layer(init(Forgot(), key=key), (df.dlarray(image(key), "BSSC"),))


# --------------------------------------------------------------------------------------------
# acceleration


class Branchy(df.Layer):
    def predict(self, x):
        if jnp.sum(x) > 0:  # Python control flow on a value
            return x * 2
        return -x


def test_python_control_flow_under_jit_names_the_layer_and_fixes(key):
    with pytest.raises(
        df.AccelerationError,
        match=r"Branchy\.predict \(layer 'b'\) uses Python control flow.*jnp\.where.*jax\.lax\.cond.*acceleratable = False",
    ) as caught:
        jax.jit(lambda x: Branchy(name="b")(x))(jnp.ones(2))
    # the user's line is named; JAX's own exception is not chained on
    assert re.search(r"\(at test_layer\.py:\d+, in predict\)", str(caught.value))
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_python_control_flow_works_eagerly_and_under_eager_grad():
    x = jnp.array([1.0, 2.0])
    np.testing.assert_allclose(Branchy()(x), 2 * x)
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(Branchy()(x)))(x), [2.0, 2.0])


# --------------------------------------------------------------------------------------------
# nested networks


class Siamese(df.Layer):
    """A layer holding a network as a learnable and applying it twice (weight sharing)."""

    encoder: df.Network | None = df.learnable(default=None)

    def predict(self, a, b):
        return df.stripdims(self.encoder.predict(a)) - df.stripdims(self.encoder.predict(b))


class Dense(df.Layer):
    formattable = True
    w: jax.Array | None = df.learnable(default=None)
    size: int = 2

    def initialize(self, layout, *, key):
        if self.w is None:
            return self.replace(w=jax.random.normal(key, (layout.size("C"), self.size)))
        return self

    def predict(self, x):
        return df.dlarray(df.stripdims(x) @ self.w, "BC")


def test_nested_network_shares_weights_between_uses(key, x64):
    encoder = df.Network([Dense(name="fc")]).initialize(df.Layout((None, 3), "BC"), key=key)
    layer = Siamese(encoder=encoder)
    a = jax.random.normal(jax.random.fold_in(key, 1), (4, 3), jnp.float64)
    b = jax.random.normal(jax.random.fold_in(key, 2), (4, 3), jnp.float64)
    w = encoder.learnables["fc/w"].astype(jnp.float64)
    layer = layer.replace(encoder=encoder.replace(learnables={"fc/w": w}))
    g = jax.grad(lambda layer: jnp.sum(jnp.sin(layer(a, b))))(layer)
    expected = jax.grad(lambda w: jnp.sum(jnp.sin(a @ w - b @ w)))(w)
    np.testing.assert_allclose(g.encoder.learnables["fc/w"], expected, rtol=1e-12)


# --------------------------------------------------------------------------------------------
# learn-rate and L2 factors on layers


def test_factors_on_a_layer_default_to_one_and_return_new_layers():
    layer = PReLU(alpha=jnp.ones(2))
    assert (
        df.get_learn_rate_factor(layer, "alpha") == 1.0 and df.get_l2_factor(layer, "alpha") == 1.0
    )
    slow = df.set_learn_rate_factor(layer, "alpha", 0.1)
    assert (
        df.get_learn_rate_factor(slow, "alpha") == 0.1
        and df.get_learn_rate_factor(layer, "alpha") == 1.0
    )
    assert df.get_l2_factor(df.set_l2_factor(layer, "alpha", 0), "alpha") == 0.0


def test_declared_factor_defaults():
    class Biased(df.Layer):
        bias: jax.Array | None = df.learnable(default=None, l2_factor=0.0, learn_rate_factor=2.0)

        def predict(self, x):
            return x + self.bias

    assert df.get_l2_factor(Biased(), "bias") == 0.0
    assert df.get_learn_rate_factor(Biased(), "bias") == 2.0


def test_factor_errors_name_the_parameter():
    with pytest.raises(
        df.LayerError, match=r"PReLU \(layer ''\) has no learnable parameter 'beta'.*\['alpha'\]"
    ):
        df.set_learn_rate_factor(PReLU(), "beta", 1.0)
    with pytest.raises(df.LayerError, match=r"must be a non-negative real number; got -1"):
        df.set_l2_factor(PReLU(), "alpha", -1)


def test_replace_revalidates_configuration_like_the_constructor():
    with pytest.raises(df.LayerError, match=r"stride"):
        df.layers.Conv2D(3, 4).replace(stride=-2)
    layer = df.layers.Conv2D(3, 4).replace(stride=2)
    assert layer.stride == (2, 2)  # normalized as in the constructor


def test_builtin_biases_have_matlabs_l2_factor_of_zero():
    for layer in (df.layers.Conv2D(3, 4), df.layers.FullyConnected(2), df.layers.LSTM(3)):
        assert df.get_l2_factor(layer, "bias") == 0.0
        assert (
            df.get_l2_factor(
                layer, "weights" if "weights" in layer.learnable_names else "input_weights"
            )
            == 1.0
        )


TRANSFORMS = {
    "checkpoint": lambda f: jax.grad(jax.checkpoint(f)),
    "checkpoint(nothing_saveable)": lambda f: jax.grad(
        jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable)
    ),
    "vmap(grad)": lambda f: jax.vmap(jax.grad(f), in_axes=(None, 0)),
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_custom_backward_composes_with_transformations(name, key, x64):
    layer = init(PReLU()).replace(alpha=jnp.full((1, 1, 1, 4), 0.3, jnp.float64))
    x = image(key, dtype=jnp.float64)
    xs = jnp.stack([x, -x]) if name.startswith("vmap") else x
    transform = TRANSFORMS[name]
    got = transform(lambda layer, x: jnp.sum(layer(x) ** 2))(layer, xs)
    expected = transform(lambda layer, x: jnp.sum(prelu_reference(layer.alpha, x) ** 2))(layer, xs)
    assert_tree_allclose(got.alpha, expected.alpha, rtol=1e-12)


@pytest.mark.skipif(os.environ.get("JAX_CUSTOM_VJP3") == "1", reason="already the strict run")
def test_layer_backward_tests_pass_with_the_stricter_custom_vjp():
    """JAX_CUSTOM_VJP3=1: custom backwards (incl. under jax.checkpoint) still work."""
    from helpers import ROOT, run_python

    result = run_python(
        "import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-k', "
        "'(backward or memory or state or formattable or nested or transformations) "
        "and not stricter', "
        f"'{ROOT / 'tests' / 'test_layer.py'}']))",
        env={"JAX_CUSTOM_VJP3": "1"},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_backward_needing_memory_from_forward_says_so_under_predict():
    layer = SplitWithMemory(scale=1.5, num_outputs=2, name="split")
    with pytest.raises(
        df.BackwardError,
        match=r"SplitWithMemory\.backward \(layer 'split'\) failed with memory=None.*handle memory is None.*net\.forward",
    ):
        jax.grad(lambda x: jnp.sum(layer(x)[0]))(jnp.ones(3))
