"""Tests of difffn/_format.py: FormattedArray, Layout and the format functions."""

from __future__ import annotations

import operator
import re

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TraceCounter, assert_tree_allclose
from hypothesis import given, settings

import difffn as df
from difffn._core._labels import _validate_format


def _x(shape=(2, 4, 3, 5), fmt="BSSC", *, key=None, low=0.5, high=2.0):
    key = jax.random.key(1) if key is None else key
    return df.dlarray(jax.random.uniform(key, shape, minval=low, maxval=high), fmt)


# dlarray and the FormattedArray basics


def test_dlarray_labels_axes_in_storage_order():
    data = jnp.arange(24.0).reshape(2, 3, 4)
    x = df.dlarray(data, "BTC")
    assert isinstance(x, df.FormattedArray)
    assert x.format == "BTC"
    assert x.data is data
    assert (x.shape, x.dtype, x.ndim, x.size) == ((2, 3, 4), jnp.float32, 3, 24)


def test_dlarray_without_format():
    assert type(df.dlarray(np.ones(3))) is type(jnp.ones(3))
    x = _x()
    assert df.dlarray(x) is x


def test_dlarray_relabels_without_moving_data():
    x = _x()
    y = df.dlarray(x, "BSSU")
    assert y.format == "BSSU"
    assert y.data is x.data


def test_constructor_validates_like_dlarray():
    x = df.FormattedArray(np.zeros((2, 3)), "BC")
    assert (x.format, type(x.data)) == ("BC", type(jnp.zeros(1)))
    assert df.FormattedArray(x, "CB").data is x.data
    with pytest.raises(df.FormatError, match="has 3 labels but the array has 2 dimensions"):
        df.FormattedArray(np.zeros((2, 3)), "BSC")


@pytest.mark.parametrize(
    ("shape", "fmt"),
    [
        ((), ""),
        ((3,), "C"),
        ((4, 4, 2), "SSC"),
        ((1, 2, 3, 4, 5), "SSSCB"),
        ((1, 1, 1), "UUU"),
        ((2, 3, 4), "TCB"),
        ((2, 3, 4, 5), "SUSU"),
    ],
)
def test_valid_formats(shape, fmt):
    assert df.dlarray(jnp.zeros(shape), fmt).format == fmt
    assert _validate_format(fmt, len(shape)) == fmt


@pytest.mark.parametrize(
    ("fmt", "shape", "match"),
    [
        ("BXSC", (1, 2, 3, 4), r"invalid label\(s\) 'X'; valid labels are S \(spatial\)"),
        ("bssc", (1, 2, 3, 4), r"Labels are upper case: use 'BSSC'"),
        ("SSCC", (1, 2, 3, 4), r"'SSCC' has label 'C' 2 times; C, B and T may appear at most once"),
        ("BSBC", (1, 2, 3, 4), r"'BSBC' has label 'B' 2 times"),
        ("TCT", (1, 2, 3), r"'TCT' has label 'T' 2 times.*label the extra axes 'S' or 'U'"),
        ("BSC", (1, 2, 3, 4), r"'BSC' has 3 labels but the array has 4 dimensions"),
        (
            "BSSCU",
            (1, 2, 3, 4),
            r"has 5 labels but the array has 4 dimensions \(shape \(1, 2, 3, 4\)\)",
        ),
        (4, (1, 2, 3, 4), r"fmt must be a format string .* got int 4"),
        (["B", "C"], (1, 2), r"fmt must be a format string .* got list"),
    ],
)
def test_bad_formats(fmt, shape, match):
    with pytest.raises(df.FormatError, match=match):
        df.dlarray(jnp.zeros(shape), fmt)


def test_validate_format_names_the_caller():
    with pytest.raises(df.FormatError, match=r"^MyLayer: output format 'SZ' has invalid label"):
        _validate_format("SZ", what="MyLayer: output format")
    assert _validate_format("SSSS") == "SSSS"  # without ndim, only the labels are checked


def test_format_error_is_a_value_error():
    assert issubclass(df.FormatError, ValueError)
    assert issubclass(df.FormatError, df.Error)


def test_not_hashable():
    with pytest.raises(TypeError, match="unhashable"):
        hash(_x())


def test_repr_is_short():
    x = df.dlarray(jnp.ones((2, 3)), "BC")
    assert repr(x).splitlines()[0] == "FormattedArray('BC', float32[2,3])"
    big = repr(df.dlarray(jnp.zeros((2, 8, 8, 1)), "BSSC"))
    assert big.startswith("FormattedArray('BSSC', float32[2,8,8,1])")
    assert len(big.splitlines()) < 20


def test_astype_keeps_format(x64):
    y = _x().astype(jnp.float64)
    assert (y.format, y.dtype) == ("BSSC", jnp.float64)


# dims, finddim, stripdims


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (df.dlarray(jnp.zeros((2, 3)), "BC"), "BC"),
        (df.Layout((None, 3), "BC"), "BC"),
        (jnp.zeros((2, 3)), ""),
        (np.zeros(3), ""),
        (1.5, ""),
    ],
)
def test_dims(value, expected):
    assert df.dims(value) == expected


@pytest.mark.parametrize(
    ("fmt", "label", "expected"),
    [
        ("BSSC", "S", (1, 2)),
        ("BSSC", "C", (3,)),
        ("BSSC", "B", (0,)),
        ("BSSC", "T", ()),
        ("SUSU", "U", (1, 3)),
        ("CBT", "T", (2,)),
    ],
)
def test_finddim(fmt, label, expected):
    shape = tuple(range(2, 2 + len(fmt)))
    assert df.finddim(fmt, label) == expected
    assert df.finddim(df.dlarray(jnp.zeros(shape), fmt), label) == expected
    assert df.finddim(df.Layout(shape, fmt), label) == expected
    assert df.Layout(shape, fmt).finddim(label) == expected


def test_finddim_of_plain_array_is_empty():
    assert df.finddim(jnp.zeros((2, 3)), "B") == ()


@pytest.mark.parametrize("label", ["X", "SS", "", "s", 1, None])
def test_finddim_rejects_bad_labels(label):
    with pytest.raises(df.FormatError, match=r"label must be one of 'S', 'C', 'B', 'T', 'U'"):
        df.finddim("BSSC", label)


def test_finddim_validates_a_format_string():
    with pytest.raises(df.FormatError, match=r"finddim: format 'BBC' has label 'B' 2 times"):
        df.finddim("BBC", "B")


def test_stripdims():
    x = _x()
    plain = jnp.zeros(3)
    assert df.stripdims(x) is x.data
    assert df.stripdims(plain) is plain
    tree = {"x": x, "rest": (plain, None, 2.0, df.dlarray(plain, "C"))}
    out = df.stripdims(tree)
    assert jax.tree.structure(out) == jax.tree.structure(
        stripped := {"x": x.data, "rest": (plain, None, 2.0, plain)}
    )
    assert_tree_allclose(out, stripped)
    assert not any(isinstance(leaf, df.FormattedArray) for leaf in jax.tree.leaves(out))


# permute


def test_permute_transposes_explicitly():
    x = _x((2, 4, 3, 5), "BSSC")
    y = df.permute(x, "SSCB")
    assert (y.format, y.shape) == ("SSCB", (4, 3, 5, 2))
    np.testing.assert_array_equal(y.data, jnp.transpose(x.data, (1, 2, 3, 0)))


def test_permute_keeps_relative_order_of_repeated_labels():
    x = _x((2, 4, 3, 5), "SCSS")
    y = df.permute(x, "SSSC")
    assert y.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(y.data, jnp.transpose(x.data, (0, 2, 3, 1)))


def test_permute_to_same_format_is_identity():
    x = _x()
    assert df.permute(x, "BSSC") is x


@pytest.mark.parametrize(
    "fmt",
    ["BSC", "BSSCU", "BSSU", "BSCC", "SSSC", 3],
)
def test_permute_rejects_non_permutations(fmt):
    match = rf"permute: fmt {re.escape(repr(fmt))} is not a reordering of x's format 'BSSC'"
    with pytest.raises(df.FormatError, match=match):
        df.permute(_x(), fmt)


def test_permute_needs_a_formatted_array():
    with pytest.raises(df.FormatError, match=r"permute: x must be a FormattedArray.*df\.dlarray"):
        df.permute(jnp.zeros((2, 3)), "CB")


@st.composite
def _format_and_permutation(draw):
    unique = draw(st.lists(st.sampled_from("CBT"), unique=True, max_size=3))
    repeated = draw(st.lists(st.sampled_from("SU"), max_size=3))
    fmt = "".join(draw(st.permutations(unique + repeated)))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=len(fmt), max_size=len(fmt))))
    return fmt, shape, "".join(draw(st.permutations(fmt)))


@settings(max_examples=40, deadline=None)
@given(_format_and_permutation())
def test_permute_round_trips(case):
    fmt, shape, new = case
    x = df.dlarray(jnp.arange(float(np.prod(shape))).reshape(shape), fmt)
    y = df.permute(x, new)
    assert y.format == new
    for label in set(fmt):
        assert [y.shape[a] for a in df.finddim(y, label)] == [
            x.shape[a] for a in df.finddim(x, label)
        ]
    back = df.permute(y, fmt)
    assert back.format == fmt
    np.testing.assert_array_equal(back.data, x.data)


# Elementwise operators

_BINARY = [
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.floordiv,
    operator.mod,
    operator.pow,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
    operator.eq,
    operator.ne,
]
_BITWISE = [operator.and_, operator.or_, operator.xor]


@pytest.mark.parametrize("op", _BINARY, ids=lambda op: op.__name__)
@pytest.mark.parametrize(
    "other",
    ["formatted", "scalar", "jax", "numpy", "numpy_scalar"],
)
@pytest.mark.parametrize("reflected", [False, True], ids=["x_op_y", "y_op_x"])
def test_binary_operators_keep_format(op, other, reflected, key):
    kx, ky, kz = jax.random.split(key, 3)
    x = _x(key=kx)
    y = {
        "formatted": _x(key=ky),
        "scalar": 1.5,
        "jax": jax.random.uniform(kz, x.shape, minval=0.5, maxval=2.0),
        "numpy": np.full(x.shape, 1.25, np.float32),
        "numpy_scalar": np.float32(1.25),
    }[other]
    out = op(y, x) if reflected else op(x, y)
    assert isinstance(out, df.FormattedArray)
    assert out.format == "BSSC"
    plain = df.stripdims(y)
    expected = op(plain, x.data) if reflected else op(x.data, plain)
    np.testing.assert_allclose(out.data, expected, rtol=1e-6)


@pytest.mark.parametrize("op", _BITWISE, ids=lambda op: op.__name__)
def test_bitwise_operators_on_masks(op):
    x = _x()
    a, b = x > 1.0, x < 1.5
    for out in (op(a, b), op(a, b.data), op(b.data, a), op(a, True)):
        assert out.format == "BSSC"
        assert out.dtype == jnp.bool_
    np.testing.assert_array_equal(op(a, b).data, op(a.data, b.data))


@pytest.mark.parametrize(
    ("op", "ref"),
    [(operator.neg, jnp.negative), (operator.pos, jnp.positive), (abs, jnp.abs)],
)
def test_unary_operators_keep_format(op, ref):
    x = _x(low=-1.0, high=1.0)
    out = op(x)
    assert out.format == "BSSC"
    np.testing.assert_array_equal(out.data, ref(x.data))


def test_invert_of_mask():
    mask = _x() > 1.0
    assert (~mask).format == "BSSC"
    np.testing.assert_array_equal((~mask).data, ~mask.data)


def test_same_format_broadcasts_size_one_axes():
    x = _x((2, 4, 3, 5), "BSSC")
    scale = df.dlarray(jnp.arange(5.0).reshape(1, 1, 1, 5), "BSSC")
    for out in (x * scale, scale * x):
        assert (out.format, out.shape) == ("BSSC", (2, 4, 3, 5))
        np.testing.assert_allclose(out.data, x.data * scale.data)


@pytest.mark.parametrize("make", [jnp.arange, np.arange], ids=["jax", "numpy"])
def test_lower_rank_plain_operand_aligns_right(make):
    # The suite runs with jax_numpy_rank_promotion="raise": the explicit reshape avoids it.
    x = _x((2, 4, 3, 5), "BSSC")
    per_channel = make(5.0).astype(np.float32)
    per_row = make(15.0).astype(np.float32).reshape(3, 5)
    for out, expected in [
        (x * per_channel, x.data * per_channel.reshape(1, 1, 1, 5)),
        (per_channel * x, x.data * per_channel.reshape(1, 1, 1, 5)),
        (x - per_row, x.data - per_row.reshape(1, 1, 3, 5)),
        (per_channel < x, per_channel.reshape(1, 1, 1, 5) < x.data),
    ]:
        assert (out.format, out.shape) == ("BSSC", x.shape)
        np.testing.assert_allclose(out.data, expected)


def test_traced_plain_operand_on_the_left_keeps_format():
    x = _x((2, 4, 3, 5), "BSSC")
    w = jnp.arange(5.0)
    out = jax.jit(lambda w, x: w * x)(w, x)
    assert out.format == "BSSC"
    np.testing.assert_allclose(out.data, x.data * w.reshape(1, 1, 1, 5))


def test_plain_operand_with_more_dimensions_is_an_error():
    x = df.dlarray(jnp.ones((3,)), "C")
    with pytest.raises(
        df.FormatError,
        match=r"'\+' of a FormattedArray 'C' .*shape \(2, 3\) "
        r"would have rank 2, which the format no longer",
    ):
        x + jnp.ones((2, 3))
    with pytest.raises(df.FormatError, match=r"'\*' of a FormattedArray 'C'"):
        np.ones((2, 3)) * x


@pytest.mark.parametrize(
    "op", [operator.add, operator.mul, operator.lt, operator.eq], ids=lambda op: op.__name__
)
def test_mixing_formats_is_an_error(op):
    x = _x((2, 4, 4, 2), "BSSC")
    y = df.dlarray(x.data, "SSCB")
    with pytest.raises(
        df.FormatError, match=r"formats 'BSSC' and 'SSCB'.*df\.permute.*df\.stripdims"
    ):
        op(x, y)
    with pytest.raises(df.FormatError, match=r"formats 'SSCB' and 'BSSC'"):
        op(y, x)


@pytest.mark.parametrize("other", [[1.0, 2.0], (1.0,), "a", object()], ids=type)
def test_non_array_operands_are_rejected(other):
    with pytest.raises(TypeError, match="unsupported operand"):
        _x() + other
    with pytest.raises(TypeError, match="not supported between instances of 'FormattedArray'"):
        _x() < other  # noqa: B015
    if isinstance(other, (list, tuple)):
        with pytest.raises(TypeError, match="unsupported operand type.*for ==.*jnp.asarray"):
            _x() == other  # noqa: B015


def test_matmul_is_not_elementwise():
    with pytest.raises(TypeError, match="unsupported operand"):
        _x() @ _x()


# Indexing and the Python protocols


@pytest.mark.parametrize(
    ("key", "fmt", "shape"),
    [
        (0, "SSC", (4, 3, 5)),
        ((slice(None), 0), "BSC", (2, 3, 5)),
        ((Ellipsis, 0), "BSS", (2, 4, 3)),
        ((0, Ellipsis, slice(1, None)), "SSC", (4, 3, 4)),
        (slice(1, 2), "BSSC", (1, 4, 3, 5)),
        ((0, 1, 2, 3), "", ()),
        (Ellipsis, "BSSC", (2, 4, 3, 5)),
        ((np.int64(1), slice(None, None, 2)), "SSC", (2, 3, 5)),
        (jnp.int32(1), "SSC", (4, 3, 5)),
    ],
)
def test_basic_indexing_drops_labels_of_int_axes(key, fmt, shape):
    x = _x()
    y = x[key]
    assert (y.format, y.shape) == (fmt, shape)
    np.testing.assert_array_equal(y.data, x.data[key])


def test_traced_integer_index():
    x = _x()
    y = jax.jit(lambda x, i: x[i])(x, 1)
    assert y.format == "SSC"
    np.testing.assert_array_equal(y.data, x.data[1])


@pytest.mark.parametrize(
    ("key", "match"),
    [
        (None, r"None \(np\.newaxis\) would add an axis without a label"),
        ((0, None), r"None \(np\.newaxis\)"),
        (True, r"basic indexing only .* got bool True"),
        (jnp.array([0, 1]), r"got ArrayImpl of shape \(2,\) and dtype int32; boolean and array"),
        ([0, 1], r"basic indexing only .* got list"),
        (np.ones((2, 4, 3, 5), bool), r"basic indexing only"),
    ],
    ids=["none", "tuple-none", "bool", "int-array", "list", "mask"],
)
def test_advanced_indexing_is_an_error(key, match):
    with pytest.raises(df.FormatError, match=match + r".*[Ii]ndex df\.stripdims\(x\) instead"):
        _x()[key]


def test_too_many_indices():
    with pytest.raises(IndexError, match="at most 4 indices"):
        _x()[0, 0, 0, 0, 0]


def test_len_iter_bool_float():
    x = _x((2, 3), "BC")
    assert len(x) == 2
    rows = list(x)
    assert [r.format for r in rows] == ["C", "C"]
    scalar = x[1, 2]
    assert float(scalar) == pytest.approx(float(x.data[1, 2]))
    assert int(df.dlarray(jnp.array(3), "")) == 3
    assert bool(scalar > 0)
    with pytest.raises(TypeError, match="0-d FormattedArray"):
        len(scalar)
    with pytest.raises(TypeError, match="0-d FormattedArray"):
        iter(scalar)


# Interop with jax.numpy and numpy (no __jax_array__; see the module docstring)


def test_numpy_conversion():
    x = _x()
    np.testing.assert_array_equal(np.asarray(x), np.asarray(x.data))
    assert np.asarray(x, dtype=np.float64).dtype == np.float64


def test_jax_numpy_functions_take_the_stripped_array():
    x = _x()
    assert not hasattr(x, "__jax_array__")
    with pytest.raises(TypeError, match="FormattedArray"):
        jnp.exp(x)
    np.testing.assert_allclose(jnp.exp(df.stripdims(x)), jnp.exp(x.data))
    with pytest.raises(TypeError, match="FormattedArray"):
        np.exp(x)


def test_traced_numpy_conversion_says_how_to_fix():
    with pytest.raises(df.FormatError, match=r"traced FormattedArray 'BSSC'.*df\.stripdims"):
        jax.jit(np.asarray)(_x())


def test_jnp_asarray_gives_the_plain_array_jitted_or_not():
    x = _x()
    for convert in (jnp.asarray, jax.jit(jnp.asarray)):
        y = convert(x)
        assert isinstance(y, jax.Array) and not isinstance(y, df.FormattedArray)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x.data))


# Pytree and transformations


def test_pytree_has_one_leaf_and_static_format():
    x = _x()
    leaves, treedef = jax.tree.flatten(x)
    assert len(leaves) == 1 and leaves[0] is x.data
    assert treedef != jax.tree.structure(df.dlarray(x, "BSSU"))
    ((path, _),) = jax.tree_util.tree_flatten_with_path(x)[0]
    assert jax.tree_util.keystr(path) == ".data"
    y = jax.tree.map(lambda a: a * 2, x)
    assert y.format == "BSSC"


def test_unflatten_accepts_placeholders():
    treedef = jax.tree.structure(_x())
    for placeholder in (object(), None, jnp.zeros(3)):
        y = jax.tree.unflatten(treedef, [placeholder])
        assert y.format == "BSSC"
        assert "FormattedArray('BSSC'" in repr(y)


def test_jit_caches_on_format():
    counter = TraceCounter()
    f = jax.jit(counter(lambda x: x * 2))
    data = jnp.ones((2, 3))
    assert f(df.dlarray(data, "BC")).format == "BC"
    f(df.dlarray(data + 1, "BC"))
    assert counter.count == 1
    assert f(df.dlarray(data, "CB")).format == "CB"
    assert counter.count == 2


def test_grad_returns_formatted_gradients():
    x = _x()
    g = jax.grad(lambda x: jnp.sum(df.stripdims(x * x)))(x)
    assert isinstance(g, df.FormattedArray)
    assert g.format == "BSSC"
    np.testing.assert_allclose(g.data, 2 * x.data, rtol=1e-6)


def test_vmap_over_plain_arrays_that_are_formatted_inside():
    data = _x((3, 4, 4, 2)).data

    def per_example(image):
        y = df.dlarray(image, "SSC") * jnp.arange(2.0)
        return df.stripdims(df.permute(y, "CSS"))

    out = jax.vmap(per_example)(data)
    expected = data * jnp.arange(2.0).reshape(1, 1, 1, 2)
    np.testing.assert_allclose(out, jnp.transpose(expected, (0, 3, 1, 2)))


def test_vmap_with_unmapped_formatted_argument():
    scale = df.dlarray(jnp.arange(1.0, 3.0), "C")
    out = jax.vmap(lambda v, s: df.stripdims(df.dlarray(v, "C") * s), in_axes=(0, None))(
        jnp.ones((4, 2)), scale
    )
    np.testing.assert_allclose(out, jnp.tile(jnp.arange(1.0, 3.0), (4, 1)))


@pytest.mark.parametrize(
    "use",
    [
        lambda x: x + 1,
        lambda x: -x,
        lambda x: x[0],
        lambda x: df.finddim(x, "S"),
        lambda x: df.permute(x, "SSCB"),
        lambda x: df.dims(x),
        lambda x: x.astype(jnp.float16),
    ],
    ids=["add", "neg", "index", "finddim", "permute", "dims", "astype"],
)
def test_vmap_over_a_formatted_array_says_how_to_fix(use):
    with pytest.raises(
        df.FormatError,
        match=r"FormattedArray 'BSSC' holds an array of rank 3 "
        r"\(shape \(4, 3, 5\)\).*jax\.vmap.*df\.stripdims\(x\).*df\.dlarray",
    ):
        jax.vmap(use)(_x())


def test_the_suggested_vmap_fix_works():
    x = _x()
    out = jax.vmap(lambda v: df.stripdims(df.dlarray(v, "SSC") * 2))(df.stripdims(x))
    np.testing.assert_allclose(out, x.data * 2)


# Layout


def test_layout_properties():
    layout = df.Layout((None, 24, 24, 20), "BSSC")
    assert (layout.shape, layout.format, layout.ndim) == ((None, 24, 24, 20), "BSSC", 4)
    assert repr(layout) == "Layout((None, 24, 24, 20), 'BSSC')"
    assert (layout.size("B"), layout.size("C"), layout.size("S"), layout.size("U")) == (
        None,
        20,
        (24, 24),
        (),
    )


def test_layout_is_immutable_and_hashable():
    a, b = df.Layout([None, 3], "BC"), df.Layout((None, 3), "BC")
    assert a == b and hash(a) == hash(b)
    assert a != df.Layout((None, 3), "TC")
    assert len({a, b, df.Layout((2, 3), "BC")}) == 2
    with pytest.raises(AttributeError, match="immutable"):
        a.format = "CB"  # type: ignore[misc]


def test_layout_is_a_jit_static_argument():
    counter = TraceCounter()
    f = jax.jit(counter(lambda layout: jnp.zeros(layout.size("C"))), static_argnums=0)
    assert f(df.Layout((None, 3), "BC")).shape == (3,)
    f(df.Layout((None, 3), "BC"))
    assert counter.count == 1


@pytest.mark.parametrize("size", [-1, 2.0, "3", True, jnp.array(2)], ids=repr)
def test_layout_rejects_bad_sizes(size):
    with pytest.raises(
        df.FormatError, match=r"Layout shape\[1\] must be a non-negative int or None"
    ):
        df.Layout((2, size), "BC")


def test_layout_accepts_numpy_ints():
    assert df.Layout((np.int64(2), 3), "BC").shape == (2, 3)


@pytest.mark.parametrize(
    ("shape", "fmt", "match"),
    [
        ((None, 3), "BSC", r"Layout fmt 'BSC' has 3 labels but the array has 2 dimensions"),
        ((None, 3), "BB", r"Layout fmt 'BB' has label 'B' 2 times"),
        (3, "C", r"Layout shape must be a sequence of sizes"),
        ("BC", "BC", r"Layout shape must be a sequence of sizes"),
    ],
)
def test_layout_rejects_bad_formats(shape, fmt, match):
    with pytest.raises(df.FormatError, match=match):
        df.Layout(shape, fmt)


@pytest.mark.parametrize("label", ["T", "B"])
def test_layout_size_of_missing_label(label):
    with pytest.raises(
        df.FormatError, match=rf"Layout 'SSC' has no '{label}' axis.*labels present: 'C', 'S'"
    ):
        df.Layout((8, 8, 3), "SSC").size(label)


def test_layout_size_rejects_bad_label():
    with pytest.raises(df.FormatError, match=r"Layout\.size: label must be one of"):
        df.Layout((8, 3), "SC").size("X")


def test_layout_of():
    x = _x()
    assert df.Layout.of(x) == df.Layout((2, 4, 3, 5), "BSSC")
    assert df.Layout.of(jax.ShapeDtypeStruct((7, 3), jnp.float32), "TC") == df.Layout((7, 3), "TC")
    assert df.Layout.of(x, "BSSU").format == "BSSU"
    with pytest.raises(df.FormatError, match=r"Layout\.of needs a FormattedArray or a fmt"):
        df.Layout.of(jnp.zeros(3))


def test_layout_with_size():
    layout = df.Layout((None, 24, 24, 20), "BSSC")
    assert layout.with_size("B", 128) == df.Layout((128, 24, 24, 20), "BSSC")
    assert layout.with_size("C", None).size("C") is None
    assert layout.size("B") is None  # unchanged


@pytest.mark.parametrize(
    ("label", "n", "match"),
    [
        ("S", 3, r"with_size\('S', \.\.\.\) needs a label that appears exactly once.*2 times"),
        ("T", 3, r"appears 0 times"),
        ("B", -2, r"with_size\('B', n\): n must be a non-negative int or None"),
        ("Q", 2, r"Layout\.with_size: label must be one of"),
    ],
)
def test_layout_with_size_errors(label, n, match):
    with pytest.raises(df.FormatError, match=match):
        df.Layout((None, 24, 24, 20), "BSSC").with_size(label, n)
