r"""Loss functions with MATLAB's definitions: ``crossentropy``, ``mse``, ``l1loss``, ``huber``, ...

Every loss takes the predictions ``Y`` and the targets ``T`` and returns a scalar. ``Y`` is
usually a network output (a ``df.FormattedArray``): its ``B`` label gives the number of
observations ``N`` and its ``C`` label the class axis. A plain ``Y`` is read as batch first and
channels last. ``T`` is a plain array laid out like ``Y`` (or formatted; it is then permuted to
``Y``'s format); classification losses also take integer class labels (``0 .. C-1``) shaped like
``Y`` without its ``C`` axis.

Normalization (MATLAB's ``NormalizationFactor``): ``"batch-size"`` (the default) divides the
summed loss by ``N``; ``"all-elements"`` by the number of elements of ``Y``; ``"none"`` returns
the sum.

Padded sequences: every loss takes ``mask=``, a boolean ``(batch, time)`` array (True at the
steps that hold data; ``_mask`` lays it onto ``Y``'s ``B`` and ``T`` axes), or ``(batch,)``
(one flag per observation). Masked-out elements add nothing, and each real time step counts as
one observation: ``"batch-size"`` divides by the number of real steps, so the loss is the mean
over real steps of the per-step loss (MATLAB's ``Mask`` with ``NormalizationFactor=
"mask-included"``, and ``trainnet``'s rule for padded sequences); ``"all-elements"`` divides by
the real steps' elements. Note the two squared-error losses:

* ``mse`` is MATLAB's half mean squared error, $\frac{1}{2N}\sum (Y - T)^2$;
* ``l2loss`` has no half, $\frac{1}{N}\sum (Y - T)^2$.

``trainnet`` and ``testnet`` accept these functions, their names (``"crossentropy"``,
``"crossentropy-logits"``, ``"index-crossentropy"``, ``"binary-crossentropy"``, ``"mse"``,
``"l1loss"``/``"mae"``, ``"l2loss"``, ``"huber"``; ``_`` and ``-`` are interchangeable), any
callable ``loss(Y1, ..., Yn, T1, ..., Tm)``, or a ``df.DifferentiableFunction``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from .._core import (
    Data,
    FormattedArray,
    OptionsError,
    as_mask,
    dims,
    fits,
    permute,
    spread,
    stripdims,
    value_axes,
)

_NORMALIZATIONS = ("batch-size", "all-elements", "none")


def _layout(y) -> tuple[str, int | None, int | None]:
    """(format, batch axis, channel axis) of a prediction; plain arrays are batch-first, C-last."""
    fmt = dims(y)
    ndim = jnp.ndim(stripdims(y))
    if fmt:
        return (
            fmt,
            (fmt.index("B") if "B" in fmt else None),
            (fmt.index("C") if "C" in fmt else None),
        )
    return "", (0 if ndim >= 1 else None), (ndim - 1 if ndim >= 2 else None)


def _targets(who: str, y, t):
    """``T`` as a plain array in ``Y``'s axis order."""
    if isinstance(t, FormattedArray):
        fmt = dims(y)
        if fmt and t.format != fmt:
            if sorted(t.format) != sorted(fmt):
                raise OptionsError(
                    f"{who}: the targets have format {t.format!r} but the predictions have "
                    f"{fmt!r}. Fix: give the targets the predictions' labels."
                )
            t = permute(t, fmt)
        t = t.data
    return jnp.asarray(t)


def _observations(y) -> int:
    _, b, _ = _layout(y)
    return 1 if b is None else stripdims(y).shape[b]


def _normalize(who: str, total, y, normalization: str, mask=None):
    """``total`` normalized; with a ``mask`` (from `_mask_of`), over the real steps."""
    if normalization not in _NORMALIZATIONS:
        raise OptionsError(
            f"{who}: normalization must be one of {list(_NORMALIZATIONS)}; got {normalization!r}."
        )
    if normalization == "none":
        return total
    if mask is None:
        n = _observations(y) if normalization == "batch-size" else max(stripdims(y).size, 1)
        return total / n
    real = jnp.sum(mask)
    if normalization == "all-elements":
        real = real * (stripdims(y).size // mask.size)
    return total / jnp.maximum(real, 1).astype(total.dtype)


def _mask_of(who: str, y, mask):
    """The padding mask laid onto ``y`` (broadcastable against it), or None."""
    if mask is None:
        return None
    mask = as_mask(mask, who=f"{who}: mask", error=OptionsError)
    if not fits(mask, y):
        shape = jnp.shape(stripdims(y))
        sizes = tuple(shape[a] for a in value_axes(y) if a is not None)
        raise OptionsError(
            f"{who}: mask has shape {tuple(mask.shape)} but the predictions (shape {shape}, "
            f"format {dims(y) or 'plain: batch, time, ...'!r}) have (batch, time) sizes {sizes}. "
            "Fix: one flag per observation and time step, (batch, time), or per observation."
        )
    return spread(mask, y)


def _sum(values, mask):
    """The sum of ``values``, of the real steps only when there is a mask."""
    return jnp.sum(values if mask is None else jnp.where(mask, values, 0))


def _same_shape(who: str, y, t):
    if y.shape != t.shape:
        raise OptionsError(
            f"{who}: predictions of shape {y.shape} and targets of shape {t.shape} differ. Fix: "
            "pass targets of the predictions' shape (one-hot for classification)."
        )


def _safe_log(p):
    """``log(max(p, eps))``: MATLAB bounds probabilities away from zero before the log."""
    return jnp.log(jnp.maximum(p, jnp.finfo(p.dtype).eps))


def _float(y):
    data = jnp.asarray(stripdims(y))
    return data if jnp.issubdtype(data.dtype, jnp.floating) else data.astype(jnp.float32)


def check_labels(who: str, labels, num_classes: int, *, what: str = "the targets") -> None:
    """Integer class labels must lie in ``0 .. num_classes - 1`` (checked on the host).

    Out of range, ``take_along_axis`` would read ``-1`` as the last class and a label equal to
    the number of classes (MATLAB's 1-based labels) as NaN, silently. Traced labels (inside
    ``jit``) are not checked here: ``trainnet`` and ``testnet`` check their data once, on the
    host, before anything runs.
    """
    if isinstance(labels, Tracer):
        return
    values = np.asarray(jax.device_get(stripdims(labels)))
    if values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if 0 <= low and high < num_classes:
        return
    valid = f"0..{num_classes - 1}"
    if low >= 1 and high == num_classes:
        raise OptionsError(
            f"{who}: {what} are class labels {low}..{high}, but the {num_classes} classes are "
            f"numbered {valid}: these look like MATLAB's 1-based class indices. Fix: subtract "
            "one (T - 1)."
        )
    bad = low if low < 0 else high
    meaning = " (a negative label would silently pick a class from the end)" if low < 0 else ""
    raise OptionsError(
        f"{who}: {what} hold the class label {bad}, outside {valid} for the {num_classes} "
        f"classes of the predictions{meaning}. Fix: labels must count the classes from 0; check "
        "the label encoding, or the number of network outputs."
    )


def check_class_targets(who: str, Y, T, *, what: str = "T") -> None:
    """When ``T`` holds integer class labels for the predictions ``Y``, check their range."""
    _, _, c = _layout(Y)
    shape = jnp.shape(stripdims(Y))
    t = stripdims(T)
    dtype = getattr(t, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
        return
    classes = 2 if c is None or shape[c] == 1 else shape[c]
    if c is None or jnp.shape(t) != shape or shape[c] == 1:
        check_labels(who, t, classes, what=what)


def _log_probabilities(who: str, y, from_logits: bool):
    """``log Y`` (bounded below, as MATLAB's), or for logits the log-softmax over ``C``."""
    data = _float(y)
    if not from_logits:
        return _safe_log(data)
    _, _, c = _layout(y)
    if c is None:
        raise OptionsError(
            f"{who}: from_logits=True needs predictions with a channel (class) axis to take the "
            f"softmax over; got shape {data.shape}. Fix: label the class axis 'C'."
        )
    return jax.nn.log_softmax(data, axis=c)


def _pick_class_log_probability(who: str, y, labels, from_logits: bool = False):
    """``log Y`` at the integer label of each observation, shaped like ``labels``."""
    _, _, c = _layout(y)
    data = _float(y)
    if c is None:
        raise OptionsError(
            f"{who}: integer targets need predictions with a channel (class) axis; got shape "
            f"{data.shape}."
        )
    expected = data.shape[:c] + data.shape[c + 1 :]
    if labels.shape != expected:
        raise OptionsError(
            f"{who}: integer targets must have the predictions' shape without the class axis, "
            f"{expected}; got {labels.shape}. Fix: pass class indices 0..{data.shape[c] - 1} "
            "per observation, or one-hot targets of the predictions' shape."
        )
    check_labels(who, labels, data.shape[c])
    index = jnp.expand_dims(labels.astype(jnp.int32), c)
    return jnp.take_along_axis(_log_probabilities(who, y, from_logits), index, axis=c)


def crossentropy(
    Y: Data,
    T: Data,
    *,
    normalization: str = "batch-size",
    mask: jax.Array | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Categorical cross-entropy $-\frac{1}{N}\sum T \log Y$ (MATLAB ``crossentropy``).

    ``Y`` holds probabilities (e.g. a softmax output); ``T`` is one-hot (``Y``'s shape) or
    integer class labels (``Y``'s shape without the ``C`` axis). Probabilities are bounded
    below by the float ``eps`` before the log, as MATLAB does.

    Args:
      Y: predictions (formatted, or plain with batch first and classes last).
      T: targets: one-hot or integer labels.
      normalization: ``"batch-size"`` (MATLAB's default: divide by ``N`` only), or ``"none"``.
      mask: padded sequences' mask (see the module notes): the mean over the real steps.
      from_logits: ``True``: ``Y`` holds logits (a network without a final ``Softmax``); the
        loss takes the softmax over ``C`` itself, in one numerically stable log-softmax. As a
        ``trainnet`` loss name: ``"crossentropy-logits"``.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> Y = df.dlarray(jnp.array([[0.5, 0.5], [0.25, 0.75]]), "BC")
      >>> float(df.losses.crossentropy(Y, jnp.array([0, 1])))  # -(log .5 + log .75) / 2
      0.4904...
      >>> Y = df.dlarray(jnp.array([[[0.5, 0.5], [0.9, 0.1]]]), "BTC")   # 1 sequence, 2 steps
      >>> float(df.losses.crossentropy(Y, jnp.array([[0, 1]]), mask=jnp.array([[True, False]])))
      0.6931...
    """
    who = "crossentropy"
    if normalization not in ("batch-size", "none"):
        raise OptionsError(
            f"{who}: normalization must be 'batch-size' or 'none'; got {normalization!r}."
        )
    t = _targets(who, Y, T)
    m = _mask_of(who, Y, mask)
    if jnp.issubdtype(t.dtype, jnp.integer) and t.shape != jnp.shape(stripdims(Y)):
        total = -_sum(_pick_class_log_probability(who, Y, t, from_logits), m)
    else:  # one-hot (integer one-hot too: it has the predictions' shape)
        y = _float(Y)
        _same_shape(who, y, t)
        total = -_sum(t.astype(y.dtype) * _log_probabilities(who, Y, from_logits), m)
    return _normalize(who, total, Y, normalization, m)


def crossentropy_logits(
    Y: Data, T: Data, *, normalization: str = "batch-size", mask: jax.Array | None = None
) -> jax.Array:
    r"""Cross-entropy of logits, ``crossentropy(Y, T, from_logits=True)`` (trainnet's
    ``"crossentropy-logits"``).

    For a network that ends without ``Softmax``: the softmax over ``C`` is part of the loss,
    $-\frac{1}{N}\sum T \log \mathrm{softmax}(Y)$, computed as one log-softmax.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> logits = df.dlarray(jnp.array([[0.0, 0.0], [0.0, 1.0986123]]), "BC")  # log 3
      >>> float(df.losses.crossentropy_logits(logits, jnp.array([0, 1])))  # -(log .5 + log .75)/2
      0.4904...
    """
    return crossentropy(Y, T, normalization=normalization, mask=mask, from_logits=True)


def index_crossentropy(
    Y: Data,
    T: Data,
    *,
    normalization: str = "batch-size",
    mask: jax.Array | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Cross-entropy with integer class labels (MATLAB ``indexcrossentropy``; labels from 0).

    Args:
      Y: probabilities with a ``C`` axis.
      T: integer labels, shaped like ``Y`` without its ``C`` axis.
      normalization: ``"batch-size"`` (default) or ``"none"``.
      mask: padded sequences' mask (see the module notes).
      from_logits: ``True``: ``Y`` holds logits (see `crossentropy`).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> Y = jnp.array([[0.5, 0.5], [0.25, 0.75]])
      >>> float(df.losses.index_crossentropy(Y, jnp.array([0, 1])))
      0.4904...
    """
    who = "index_crossentropy"
    t = _targets(who, Y, T)
    if not jnp.issubdtype(t.dtype, jnp.integer):
        raise OptionsError(
            f"{who}: the targets must be integer class indices; got dtype {t.dtype}. Fix: use "
            "crossentropy for one-hot targets, or pass labels.astype(int)."
        )
    if t.shape == jnp.shape(stripdims(Y)):
        raise OptionsError(
            f"{who}: the integer targets have the predictions' shape {t.shape}: one-hot, not "
            "class indices (which have the predictions' shape without the class axis). Fix: "
            "use crossentropy for one-hot targets, or pass T.argmax(axis=class_axis)."
        )
    return crossentropy(Y, t, normalization=normalization, mask=mask, from_logits=from_logits)


def binary_crossentropy(
    Y: Data, T: Data, *, normalization: str = "batch-size", mask: jax.Array | None = None
) -> jax.Array:
    r"""Binary cross-entropy $-\frac{1}{N}\sum T\log Y + (1-T)\log(1-Y)$.

    For independent (multi-label) probabilities, e.g. a sigmoid output; ``T`` holds 0/1 values
    of ``Y``'s shape.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> float(df.losses.binary_crossentropy(jnp.array([[0.8], [0.4]]), jnp.array([[1.0], [0.0]])))
      0.3669...
    """
    who = "binary_crossentropy"
    y = _float(Y)
    t = _targets(who, Y, T).astype(y.dtype)
    _same_shape(who, y, t)
    m = _mask_of(who, Y, mask)
    total = -_sum(t * _safe_log(y) + (1 - t) * _safe_log(1 - y), m)
    return _normalize(who, total, Y, normalization, m)


def mse(Y: Data, T: Data, *, mask: jax.Array | None = None) -> jax.Array:
    r"""MATLAB's half mean squared error $\frac{1}{2N}\sum (Y - T)^2$ (``N`` observations).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> float(df.losses.mse(jnp.array([[1.0, 2.0], [3.0, 4.0]]), jnp.zeros((2, 2))))  # 30/4
      7.5
    """
    who = "mse"
    y = _float(Y)
    t = _targets(who, Y, T).astype(y.dtype)
    _same_shape(who, y, t)
    m = _mask_of(who, Y, mask)
    return _normalize(who, _sum(jnp.square(y - t), m), Y, "batch-size", m) / 2


def l1loss(
    Y: Data, T: Data, *, normalization: str = "batch-size", mask: jax.Array | None = None
) -> jax.Array:
    r"""Absolute error $\frac{1}{N}\sum |Y - T|$ (MATLAB ``l1loss``; trainnet ``"mae"``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> float(df.losses.l1loss(jnp.array([[1.0, -2.0], [3.0, 4.0]]), jnp.zeros((2, 2))))
      5.0
    """
    who = "l1loss"
    y = _float(Y)
    t = _targets(who, Y, T).astype(y.dtype)
    _same_shape(who, y, t)
    m = _mask_of(who, Y, mask)
    return _normalize(who, _sum(jnp.abs(y - t), m), Y, normalization, m)


def l2loss(
    Y: Data, T: Data, *, normalization: str = "batch-size", mask: jax.Array | None = None
) -> jax.Array:
    r"""Squared error $\frac{1}{N}\sum (Y - T)^2$ (MATLAB ``l2loss``; no half, unlike mse).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> float(df.losses.l2loss(jnp.array([[1.0, 2.0], [3.0, 4.0]]), jnp.zeros((2, 2))))
      15.0
    """
    who = "l2loss"
    y = _float(Y)
    t = _targets(who, Y, T).astype(y.dtype)
    _same_shape(who, y, t)
    m = _mask_of(who, Y, mask)
    return _normalize(who, _sum(jnp.square(y - t), m), Y, normalization, m)


def huber(
    Y: Data,
    T: Data,
    *,
    transition_point: float = 1.0,
    normalization: str = "batch-size",
    mask: jax.Array | None = None,
) -> jax.Array:
    r"""Huber loss (MATLAB ``huber``), summed over elements and normalized.

    Per element, with $z = Y - T$: $\frac{1}{2}z^2$ where $|z| \le \delta$,
    else $\delta(|z| - \frac{1}{2}\delta)$; $\delta$ is ``transition_point``.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> float(df.losses.huber(jnp.array([[0.5, 3.0]]), jnp.zeros((1, 2))))  # 0.125 + 2.5
      2.625
    """
    who = "huber"
    if not transition_point > 0:
        raise OptionsError(f"{who}: transition_point must be positive; got {transition_point!r}.")
    y = _float(Y)
    t = _targets(who, Y, T).astype(y.dtype)
    _same_shape(who, y, t)
    z = jnp.abs(y - t)
    d = transition_point
    per_element = jnp.where(z <= d, 0.5 * jnp.square(z), d * (z - 0.5 * d))
    m = _mask_of(who, Y, mask)
    return _normalize(who, _sum(per_element, m), Y, normalization, m)


LOSSES = {
    "crossentropy": crossentropy,
    "crossentropy-logits": crossentropy_logits,
    "index-crossentropy": index_crossentropy,
    "binary-crossentropy": binary_crossentropy,
    "mse": mse,
    "mean-squared-error": mse,
    "l1loss": l1loss,
    "mae": l1loss,
    "mean-absolute-error": l1loss,
    "l2loss": l2loss,
    "huber": huber,
}


CLASS_LOSSES = (
    crossentropy,
    index_crossentropy,
    crossentropy_logits,
)  # losses whose integer targets are labels


def canonical(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def get_loss(loss, *, who: str = "trainnet"):
    """A loss callable from a name, a callable or a ``DifferentiableFunction``."""
    if isinstance(loss, str):
        fn = LOSSES.get(canonical(loss))
        if fn is None:
            raise OptionsError(
                f"{who}: unknown loss {loss!r}; the built-in losses are "
                f"{sorted(LOSSES)}. Fix: use one of those names, or pass a callable loss(Y, T) "
                "returning a scalar."
            )
        return fn
    if isinstance(loss, type):
        raise OptionsError(
            f"{who}: loss is the class {loss.__name__}, not a loss. Fix: pass an instance, "
            f"{loss.__name__}() (with its configuration), or a function loss(Y, T)."
        )
    if callable(loss):
        return loss
    raise OptionsError(
        f"{who}: loss must be a name ({sorted(LOSSES)}), a callable loss(Y, T) or a "
        f"df.DifferentiableFunction; got {type(loss).__name__}. Fix: pass e.g. 'mse' or "
        "'crossentropy', or a function loss(Y, T)."
    )


def loss_name(loss) -> str:
    if isinstance(loss, str):
        return canonical(loss)
    return getattr(loss, "__name__", type(loss).__name__)
