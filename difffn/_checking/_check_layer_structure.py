"""``check_layer``'s tests of what the layer's methods take and return (no derivatives).

Each test is a function of the `LayerSubject`; it
returns or raises an outcome (``None`` means Passed). The tests, in the order of ``_check_list``:
initialization, signatures, predict/forward running and agreeing, dtypes, GPU, observations being
independent, state, ``reset_state``, ``initialize`` idempotence, formats."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._core import FormattedArray, LayerError, stripdims, type_name
from ._check_common import (
    cast_floating,
    describe_value,
    index_text,
    is_array,
    is_floating,
    non_finite,
    positional_parameters,
    shape_text,
)
from ._check_layer_subject import LayerSubject, NetworkBase, has_backward, has_method
from ._check_report import describe_exception, failed, incomplete, passed, skipped

MAX_SINGLE_OBSERVATIONS = 4
MULTI_OBSERVATION_RTOL = 1e-9
GPU_RTOL = {"float32": 1e-4, "float64": 1e-10}


def initialize_runs(s: LayerSubject):
    layer, cls = s.layer, s.cls
    if layer.initialized:
        return skipped("the layer was given initialized")
    try:
        new = layer.initialize(*s.layouts, key=s.key)
    except Exception as error:
        s.usable = False
        raise failed(
            f"{cls.__name__}.initialize raised for layouts {list(s.layouts)}:\n"
            f"{describe_exception(error)}"
        ) from None
    if not isinstance(new, cls):
        s.usable = False
        return failed(
            f"{cls.__name__}.initialize returned a {type_name(new)}; expected the initialized "
            f"layer (a {cls.__name__}). Fix: `return self.replace(...)` (layers are immutable)."
        )
    empty = [n for n in s.names["learnables"] + s.names["states"] if getattr(new, n) is None]
    s.layer = new
    if empty:
        s.usable = False
        return failed(
            f"after initialize, parameter(s) {empty} of {cls.__name__} are still None. "
            "Fix: give each learnable and state parameter a value in initialize (or a default)."
        )
    return None


def method_signatures_are_well_formed(s: LayerSubject):
    cls, layer = s.cls, s.layer
    n_in = layer.num_inputs
    problems = []
    if has_method(layer, "forward"):
        _, required, variadic = positional_parameters(cls.forward)
        names = [p.name for p in required]
        if "key" in names:
            problems.append(
                "forward takes `key` as a required positional argument; it must be an "
                "optional keyword: `def forward(self, *X, key=None)`."
            )
        elif len(required) != n_in and not (variadic and len(required) <= n_in):
            problems.append(
                f"forward takes {len(required)} input(s) {names}; the layer has {n_in} "
                f"({list(layer.input_names)}), like predict."
            )
    if has_backward(layer):
        try:
            s.takes_state()
        except LayerError as error:
            problems.append(str(error))
    if has_method(layer, "initialize"):
        params, required, variadic = positional_parameters(cls.initialize)
        keywords = {p.name for p in params} | (
            {"key"} if any(p.kind is p.VAR_KEYWORD for p in params) else set()
        )
        if "key" not in keywords:
            problems.append(
                "initialize does not take `key`; it must be `def initialize(self, "
                "*layouts, key)` (randomness is an explicit key)."
            )
        count = len([p for p in required if p.name != "key"])
        if count > n_in or (count < n_in and not variadic):
            problems.append(f"initialize takes {count} layout(s); expected {n_in}, one per input.")
    if has_method(layer, "reset_state"):
        _, required, _ = positional_parameters(cls.reset_state)
        if required:
            problems.append(
                f"reset_state takes arguments {[p.name for p in required]}; it must be "
                "`def reset_state(self)` returning the layer with reset state."
            )
    if problems:
        return failed(f"{cls.__name__}: " + "\n".join(problems))
    return None


def predict_runs(s: LayerSubject):
    s.predicted = None
    outs, state, _ = s.run(s.layer, s.xs, training=False)
    s.check_returned("predict", outs)
    s.predicted = (outs, state)


def forward_runs(s: LayerSubject):
    s.forwarded = None
    outs, state, memory = s.run(s.layer, s.xs, training=True)
    s.check_returned("forward", outs)
    s.forwarded = (outs, state, memory)
    if not has_method(s.layer, "forward"):
        return passed("the layer defines no forward; predict runs at training time")
    return None


def forward_and_predict_agree_in_size(s: LayerSubject):
    s.require("predicted", "forwarded")
    problems = []
    for name, p, f in zip(s.names["outputs"], s.predicted[0], s.forwarded[0], strict=True):
        if tuple(p.shape) != tuple(f.shape):
            problems.append(
                f"output {name!r}: predict gives shape {shape_text(p.shape)}, forward "
                f"{shape_text(f.shape)}"
            )
        elif getattr(p, "format", "") != getattr(f, "format", ""):
            problems.append(
                f"output {name!r}: predict gives format {p.format!r}, forward {f.format!r}"
            )
    if problems:
        return failed(
            "forward and predict disagree in size:\n  "
            + "\n  ".join(problems)
            + "\nFix: forward (training time) must return outputs of the same sizes as "
            "predict; they may differ only in values (e.g. dropout)."
        )
    return None


def keeps_dtype(s: LayerSubject, method: str, dtype: str):
    s.require("predicted" if method == "predict" else "forwarded")
    training = method == "forward"
    with jax.enable_x64(True):
        layer = cast_floating(s.layer, dtype)
        xs = cast_floating(s.xs, dtype)
        outs, state, _ = s.run(layer, xs, training, abstract=True)
        problems = []
        for name, y in zip(s.names["outputs"], outs, strict=True):
            got = stripdims(y).dtype
            if jnp.issubdtype(got, jnp.inexact) and got != np.dtype(dtype):
                problems.append(f"output {name!r} is {got}")  # integer outputs are by design
        for name, value in zip(s.names["states"], state, strict=True):
            old = getattr(layer, name)
            if not (is_array(value) and is_array(old)):
                continue  # e.g. a nested network's state table
            expected = np.dtype(dtype) if is_floating(old) else old.dtype
            if stripdims(value).dtype != expected:
                problems.append(f"state {name!r} is {stripdims(value).dtype}")
    if problems:
        return failed(
            f"with {dtype} inputs and parameters, {method} returned: "
            + "; ".join(problems)
            + f"; expected {dtype}. Fix: do not create constants or casts with a fixed "
            "dtype (np.float64 values, .astype(jnp.float32)); use the input's dtype, e.g. "
            "jnp.asarray(c, x.dtype) or y.astype(x.dtype)."
        )
    return None


def gpu_devices():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def runs_on_gpu(s: LayerSubject):
    gpus = gpu_devices()
    if not gpus:
        return skipped("no GPU")
    s.require("predicted")
    gpu, cpu = gpus[0], jax.devices("cpu")[0]
    problems = []
    with jax.enable_x64(True):
        for dtype in ("float32", "float64"):
            layer, xs = cast_floating(s.layer, dtype), cast_floating(s.xs, dtype)
            for training in (False, True):
                method = "forward" if training else "predict"
                on_cpu = s.run(jax.device_put(layer, cpu), jax.device_put(xs, cpu), training)
                on_gpu = s.run(jax.device_put(layer, gpu), jax.device_put(xs, gpu), training)
                for name, a, b in zip(s.names["outputs"], on_cpu[0], on_gpu[0], strict=True):
                    a, b = np.asarray(stripdims(a)), stripdims(b)
                    if b.dtype != np.dtype(dtype):
                        problems.append(f"{method} output {name!r} is {b.dtype} ({dtype})")
                        continue
                    if gpu not in b.devices():
                        problems.append(f"{method} output {name!r} is not on the GPU")
                        continue
                    b = np.asarray(b)
                    scale = max(float(np.max(np.abs(a), initial=0.0)), 1e-30)
                    error = float(np.max(np.abs(a - b), initial=0.0)) / scale
                    if not error <= GPU_RTOL[dtype]:
                        problems.append(
                            f"{method} output {name!r} ({dtype}) differs from the CPU by "
                            f"{error:.3g} (relative)"
                        )
    if problems:
        return failed("on the GPU: " + "; ".join(problems))
    return None


def multiple_observations_are_consistent(s: LayerSubject):
    s.require("predicted")
    batch_axes = [f.find("B") for f in s.formats]
    if all(a < 0 for a in batch_axes):
        return skipped(
            "no layout has a B (batch) label; the batch axis comes from the B label (e.g. "
            "df.Layout((None, 24, 24, 20), 'BSSC'))"
        )
    sizes = {shape[a] for shape, a in zip(s.shapes, batch_axes, strict=True) if a >= 0}
    batch = max(2, min(sizes))
    with jax.enable_x64(True):
        layer = cast_floating(s.layer, "float64")
        xs = []
        for i, (shape, axis) in enumerate(zip(s.shapes, batch_axes, strict=True)):
            shape = list(shape)
            if axis >= 0:
                shape[axis] = batch
            xs.append(np.asarray(s.data.normal(30 + i, shape, jnp.float64)))
        together, _, _ = s.run(layer, [jnp.asarray(x) for x in xs], False)
        nan = _non_finite_outputs(s, together, f"in a batch of {batch}")
        if nan:
            return nan
        problems = []
        for i in range(min(batch, MAX_SINGLE_OBSERVATIONS)):
            single = [
                jnp.asarray(np.take(x, [i], axis=a) if a >= 0 else x)
                for x, a in zip(xs, batch_axes, strict=True)
            ]
            alone, _, _ = s.run(layer, single, False)
            nan = _non_finite_outputs(s, alone, f"for observation {i} alone")
            if nan:
                return nan
            for name, y_all, y_one in zip(s.names["outputs"], together, alone, strict=True):
                fmt = s.output_format(y_all)
                axis = fmt.find("B") if fmt and len(fmt) == y_all.ndim else -1
                if axis < 0:
                    return skipped(f"output {name!r} has no B (batch) axis to compare")
                y_all, y_one = np.asarray(stripdims(y_all)), np.asarray(stripdims(y_one))
                if y_all.shape[axis] != batch:
                    problems.append(
                        f"output {name!r} has {y_all.shape[axis]} observations for a batch "
                        f"of {batch}"
                    )
                    break
                expected = np.take(y_all, [i], axis=axis)
                if expected.shape != y_one.shape:
                    problems.append(
                        f"output {name!r} of observation {i} alone has shape "
                        f"{shape_text(y_one.shape)}; in the batch, {shape_text(expected.shape)}"
                    )
                    continue
                scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-300)
                gap = np.abs(expected - y_one)
                error = float(np.max(gap, initial=0.0))
                if not error <= MULTI_OBSERVATION_RTOL * scale:
                    where = index_text(int(np.argmax(gap)), gap.shape, fmt)
                    problems.append(
                        f"output {name!r}: observation {i} predicted alone differs from the "
                        f"same observation in a batch of {batch} by {error:.3g} at {where} "
                        f"(relative {error / scale:.3g})"
                    )
    if problems:
        return failed(
            "predict is not consistent across observations:\n  "
            + "\n  ".join(problems)
            + "\nFix: each observation's output must depend only on that observation: "
            "do not mix values across the B axis (e.g. reduce over all axes, or reshape "
            "with a hard-coded batch size) in predict."
        )
    return None


def _non_finite_outputs(s: LayerSubject, outs, when: str):
    """Incomplete, saying where, when predict produced NaN or Inf: the comparison means nothing
    there, and a NaN is not a sign of mixing observations."""
    for name, y in zip(s.names["outputs"], outs, strict=True):
        where = non_finite(stripdims(y), s.output_format(y))
        if where:
            return incomplete(
                f"predict produced non-finite values for the example data (standard normal "
                f"values): output {name!r} has {where} {when}, so whether observations are "
                "independent could not be judged. If the layer's domain is narrower than the "
                "reals (log, sqrt, a division), that is expected for random data; otherwise "
                "make predict numerically stable."
            )
    return None


def returns_valid_state(s: LayerSubject, method: str):
    states = s.names["states"]
    if not states:
        return skipped("the layer has no state parameters")
    s.require("predicted" if method == "predict" else "forwarded")
    new_state = (s.predicted if method == "predict" else s.forwarded)[1]
    problems = []
    for name, value in zip(states, new_state, strict=True):
        old = getattr(s.layer, name)
        if isinstance(old, NetworkBase):
            continue  # a nested network's state table: the network validates it
        problems += _state_problems(name, old, value)
    if problems:
        return failed(
            f"{method} returned invalid state: "
            + "; ".join(problems)
            + ". Fix: return the new value of every state field after the outputs, with the "
            "shape and dtype of the field (an axis of size 1 may grow to the batch size)."
        )
    return None


def reset_state_runs(s: LayerSubject):
    cls = s.cls
    if not s.names["states"]:
        return skipped("the layer has no state parameters")
    new = s.layer.reset_state()
    if not isinstance(new, cls):
        return failed(
            f"reset_state returned a {type_name(new)}; expected a {cls.__name__}. Fix: "
            "`return self.replace(state_field=...)`."
        )
    problems = []
    for name in s.names["states"]:
        old, value = getattr(s.layer, name), getattr(new, name)
        if is_array(old) and (not is_array(value) or tuple(value.shape) != tuple(old.shape)):
            problems.append(f"state {name!r} became {describe_value(value)}")
        elif old is not None and not is_array(old) and not isinstance(old, NetworkBase):
            problems += _state_problems(name, old, value, grow=False)
    for name, kind in cls._field_kinds.items():
        if kind in ("property", "base") and name != "name":
            if _tree_change(getattr(s.layer, name), getattr(new, name)) is not None:
                problems.append(f"property {name!r} changed")
    if problems:
        return failed(
            "reset_state: "
            + "; ".join(problems)
            + ". Fix: reset_state may only reset state fields, keeping their shapes."
        )
    return None


def initialize_keeps_set_parameters(s: LayerSubject):
    cls = s.cls
    if not has_method(s.layer, "initialize"):
        return skipped("the layer defines no initialize")
    again = s.layer.initialize(*s.layouts, key=s.data.key(4))
    if not isinstance(again, cls):
        return failed(f"initialize returned a {type_name(again)}; expected a {cls.__name__}.")
    problems = []
    for kind, names in (("learnable", s.names["learnables"]), ("state", s.names["states"])):
        for name in names:
            change = _tree_change(getattr(s.layer, name), getattr(again, name))
            if change is not None:
                problems.append(f"{kind} {name!r} ({change})")
    if problems:
        first = problems[0].split("'")[1]
        return failed(
            "initialize changed parameters that were already set: "
            + "; ".join(problems)
            + ". initialize must fill only parameters that are still None, so that running "
            f"it twice changes nothing. Fix: guard each one, e.g. `if self.{first} is None:`."
        )
    return None


def formattable_is_formatted(s: LayerSubject, method: str):
    if not s.layer.formattable:
        return skipped("the layer is not formattable (formattable = False)")
    s.require("predicted" if method == "predict" else "forwarded")
    outs = (s.predicted if method == "predict" else s.forwarded)[0]
    problems = []
    for name, y in zip(s.names["outputs"], outs, strict=True):
        if not isinstance(y, FormattedArray):
            problems.append(f"output {name!r} is a plain array")
        elif "C" not in y.format:
            problems.append(f"output {name!r} has format {y.format!r}, without a C label")
    if problems:
        return failed(
            f"{method} of a formattable layer: "
            + "; ".join(problems)
            + ". Fix: return df.dlarray(y, fmt) with a format that has a C (channel) label."
        )
    return None


def _state_problems(name: str, old, new, *, grow: bool = True) -> list[str]:
    """What is wrong with ``new`` as the value of state field ``name`` (which holds ``old``).

    A field may hold one array or a pytree of arrays (a dict of batch statistics): the two are
    compared leaf by leaf, each leaf named by its pytree path. ``grow``: an axis of size 1 may
    grow (see `_state_shape_ok`).
    """
    if old is None or is_array(old):  # one array (or not set yet): the value is one array
        if not is_array(new):
            return [f"state {name!r} is {describe_value(new)}"]
        pairs = [((), new, old)]
    else:
        old_leaves, old_tree = _state_leaves(old)
        new_leaves, new_tree = _state_leaves(new)
        if old_tree != new_tree:
            return [
                f"state {name!r} has the structure {new_tree}; the layer's is {old_tree} (a "
                "state held as a pytree keeps its structure)"
            ]
        pairs = [(p, leaf, b) for (p, leaf), (_, b) in zip(new_leaves, old_leaves, strict=True)]
    problems = []
    for path, leaf, before in pairs:
        what = f"state {name!r}{jax.tree_util.keystr(path)}"
        if not is_array(leaf):
            problems.append(f"{what} is {describe_value(leaf)}")
            continue
        if before is None or not is_array(before):
            continue
        shape = stripdims(leaf).shape
        if not (_state_shape_ok(before.shape, shape) if grow else shape == before.shape):
            problems.append(
                f"{what} has shape {shape_text(shape)}; the layer's is {shape_text(before.shape)}"
            )
        elif stripdims(leaf).dtype != before.dtype:
            problems.append(
                f"{what} has dtype {stripdims(leaf).dtype}; the layer's is {before.dtype}"
            )
    return problems


def _state_leaves(value):
    return jax.tree_util.tree_flatten_with_path(
        value, is_leaf=lambda v: v is None or isinstance(v, FormattedArray)
    )


def _state_shape_ok(old, new) -> bool:
    """A new state keeps the field's shape, except that an axis of size 1 may grow (a state
    kept per observation, like an LSTM's hidden state, starts with one row)."""
    old, new = tuple(old), tuple(new)
    return len(old) == len(new) and all(a == b or a == 1 for a, b in zip(old, new, strict=True))


def _tree_change(before, after) -> str | None:
    """A description of how ``after`` differs from ``before`` (None if identical)."""
    leaves_b, tree_b = jax.tree.flatten(before)
    leaves_a, tree_a = jax.tree.flatten(after)
    if tree_b != tree_a or len(leaves_a) != len(leaves_b):
        return "its structure changed"
    for b, a in zip(leaves_b, leaves_a, strict=True):
        if not isinstance(b, (jax.Array, np.ndarray, np.generic, int, float, complex)):
            try:
                same = b is a or bool(b == a)
            except Exception:  # noqa: BLE001 - objects without a usable ==
                same = False
            if not same:
                return "its value changed"
            continue
        b, a = np.asarray(b), np.asarray(a)
        if b.shape != a.shape:
            return f"shape {shape_text(b.shape)} became {shape_text(a.shape)}"
        if b.dtype != a.dtype:
            return f"dtype {b.dtype} became {a.dtype}"
        if not np.array_equal(b, a, equal_nan=b.dtype.kind in "fc"):
            gap = np.abs(a.astype(np.float64) - b.astype(np.float64))
            where = index_text(int(np.argmax(gap)), gap.shape)
            return f"largest change {float(np.max(gap)):.3g} at {where}"
    return None
