"""Custom backwards: each example's hand-written gradient step against the memory-bandwidth limit.

Target (issue 16 item 2): a layer's or function's jitted gradient step (the VJP for the input and
every parameter, as a training step needs it) within 3x the memory-bandwidth limit, measured in
the same run as a jitted, donated (in-place) copy that reads and writes as many bytes as the
step's necessary traffic: it reads x and dL/dY and writes dL/dX (the parameters and their
gradients are a few hundred bytes). Autodiff of the same forward is timed alongside, as the
reference a custom backward should not lose to.

Besides the time, each row shows what XLA compiled: the kernels of the program's entry
computation (fusions, reductions, copies: each one a pass over its operands) and XLA's own
estimate of the bytes they access (``cost_analysis()["bytes accessed"]``) in units of the
necessary traffic.

The subjects are the custom backwards difffn ships, loaded from the example scripts users copy:
the ELU layer (00), the SReLU DifferentiableFunction (01) and layer (02), the PReLU layer (03),
the SReLU function of the custom loop (08), the checked SReLU layer (09) and the per-channel
leaky ReLU of the ONNX example (16).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import jax
import jax.numpy as jnp

from ._examples import load
from ._timing import compare, fmt_time, table

SHAPE = (64, 28, 28, 32)  # the size: 6.4 MB per array, in this machine's 32 MiB L3 cache
# Past any CPU cache (103 MB per array). There the step's new dL/dX buffer is memory touched for
# the first time on every call (measured with getrusage: one minor page fault per 4 KiB page of
# a jitted function's 103 MB output, none for the donated copy), which bounds every step that
# returns a new array; the "vs dL/dX alone" column compares with the cheapest such step.
MEMORY_SHAPE = (128, 56, 56, 64)
QUICK_SHAPE = (8, 14, 14, 16)
TARGET = 3.0
NAMES = (
    "00 ELU layer",
    "01 SReLU function",
    "02 SReLU layer",
    "03 PReLU layer",
    "08 SReLU function",
    "09 SReLU layer",
    "16 leaky ReLU layer",
)

# Entry-computation instructions that move no data (views, bookkeeping).
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}
_OPCODE = re.compile(r"^\s*(?:ROOT )?%\S+ = .+? ([a-z][\w-]*)\(", re.M)


def kernels(compiled) -> int:
    """Instructions of the entry computation that read or write arrays (fusions, reduces, ...)."""
    text = compiled.as_text()
    entry = text[text.index("\nENTRY") :]
    return sum(op not in _FREE for op in _OPCODE.findall(entry))


def _channel_params(shape, dtype, **ranges) -> dict[str, jax.Array]:
    """Per-channel parameters of shape (1, 1, 1, C), spread over ``ranges[name] = (low, high)``."""
    channels = shape[-1]
    return {
        name: jnp.linspace(low, high, channels, dtype=dtype).reshape(1, 1, 1, channels)
        for name, (low, high) in ranges.items()
    }


def subjects(shape, dtype=jnp.float32) -> dict[str, tuple[object, Callable, Callable]]:
    """name -> (parameters, custom, autodiff); ``custom(parameters, x)`` runs the hand-written
    backward under differentiation, ``autodiff(parameters, x)`` the same forward without it."""
    srelu = _channel_params(
        shape, dtype, tl=(-0.8, -0.2), al=(0.05, 0.3), tr=(0.2, 0.8), ar=(0.05, 0.3)
    )
    srelu_tuple = tuple(srelu.values())
    srelu_layer = {
        "left_threshold": srelu["tl"],
        "left_slope": srelu["al"],
        "right_threshold": srelu["tr"],
        "right_slope": srelu["ar"],
    }
    alpha = _channel_params(shape, dtype, alpha=(0.1, 0.9))["alpha"]

    def layer_pair(layer):
        return layer, (lambda lyr, x: lyr(x)), (lambda lyr, x: lyr.predict(x))

    e00, e01, e02 = load("00_elu_digits"), load("01_srelu_function"), load("02_srelu_layer")
    e03, e08, e09 = load("03_prelu_layer"), load("08_custom_loop_srelu"), load("09_check_layer")
    e16 = load("16_onnx_finetune")
    made = {
        "00 ELU layer": layer_pair(e00.ELULayer(alpha=alpha, name="elu")),
        "01 SReLU function": (
            srelu_tuple,
            lambda p, x: e01.SReLUFunction("BSSC")(x, *p),
            lambda p, x: e01.srelu_plain(x, *p),
        ),
        "02 SReLU layer": layer_pair(e02.SReLULayer(**srelu_layer, name="srelu")),
        "03 PReLU layer": layer_pair(e03.PReLULayer(alpha=alpha, name="prelu")),
        "08 SReLU function": (
            srelu_tuple,
            lambda p, x: e08.srelu(x, *p),
            lambda p, x: e01.srelu_plain(x, *p),
        ),
        "09 SReLU layer": layer_pair(e09.SReLULayer(**srelu_layer, name="srelu")),
        "16 leaky ReLU layer": layer_pair(e16.ChannelLeakyReLU(slope=alpha, name="leaky")),
    }
    assert tuple(made) == NAMES
    return made


def gradient_step(f: Callable) -> Callable:
    """The jitted VJP of ``f(parameters, x)`` for the parameters and the input."""
    return jax.jit(lambda p, x, dy: jax.vjp(f, p, x)[1](dy))


def donated_copy(nbytes: int, dtype=jnp.float32):
    """A thunk copying a buffer of ``nbytes / 2`` bytes in place (read + write = ``nbytes``)."""
    # `-b`, not `b + 0`: XLA simplifies `b + 0` to `b`, and with donation that moves nothing.
    copy = jax.jit(lambda b: -b, donate_argnums=0)
    buffer = [jnp.zeros(nbytes // 2 // jnp.dtype(dtype).itemsize, dtype)]

    def run():
        buffer[0] = copy(buffer[0])
        return buffer[0]

    run.compiled = lambda: copy.lower(buffer[0]).compile()
    return run


def _thunk(jitted, *args):
    """A zero-argument call of ``jitted(*args)``, with ``.compiled()`` giving its program."""

    def run():
        return jitted(*args)

    run.compiled = lambda: jitted.lower(*args).compile()
    return run


def run(*, quick: bool = False) -> None:
    for shape in (QUICK_SHAPE,) if quick else (SHAPE, MEMORY_SHAPE):
        _run(shape, rounds=5 if quick else 15)


def _run(shape, *, rounds: int) -> None:
    key = jax.random.key(0)
    x = jax.random.normal(key, shape, jnp.float32)
    dy = jax.random.normal(jax.random.fold_in(key, 1), shape, jnp.float32)
    necessary = 3 * x.size * x.dtype.itemsize  # read x and dL/dY, write dL/dX

    cases = {"limit: donated copy": donated_copy(necessary)}
    # Two floors under every formulation: the same copy into a new buffer (as dL/dX is), and
    # PReLU's dL/dX alone, the elementwise kernel that every gradient step here contains.
    source = jnp.zeros(necessary // 2 // x.dtype.itemsize, x.dtype)
    cases["floor: copy into a new buffer"] = _thunk(jax.jit(lambda b: -b), source)
    prelu_dx = jax.jit(lambda x, dy: jnp.where(x > 0, dy, 0.25 * dy))
    cases["floor: dL/dX alone (PReLU's)"] = _thunk(prelu_dx, x, dy)
    layers = subjects(shape)
    for name, (params, custom, autodiff) in layers.items():
        for kind, f in (("custom", custom), ("autodiff", autodiff)):
            cases[f"{name}: {kind}"] = _thunk(gradient_step(f), params, x, dy)
    timings = compare(cases, rounds=rounds)

    limit = timings["limit: donated copy"]
    floor = timings["floor: dL/dX alone (PReLU's)"]
    rows = []
    for name, t in timings.items():
        compiled = cases[name].compiled()
        accessed = compiled.cost_analysis().get("bytes accessed", float("nan"))
        rows.append(
            [
                name,
                fmt_time(t.median_s),
                f"{necessary / t.median_s / 1e9:6.1f}",
                f"{t.ratio_to(limit):5.2f}x",
                f"{t.ratio_to(floor):5.2f}x",
                f"{t.noise * 100:5.1f}%",
                str(kernels(compiled)),
                f"{accessed / necessary:4.1f}",
            ]
        )
    print(
        f"\ngradient step (dL/dX and every parameter gradient), {shape} float32; "
        f"necessary traffic {necessary / 1e6:.1f} MB"
    )
    header = [
        "case",
        "time",
        "GB/s",
        "vs limit",
        "vs dL/dX alone",
        "noise",
        "kernels",
        "XLA bytes / necessary",
    ]
    print(table(rows, header))
    print(f"targets: custom backward <= {TARGET:.1f}x the limit")
    for name in layers:
        r = timings[f"{name}: custom"].ratio_to(limit)
        a = timings[f"{name}: autodiff"].ratio_to(limit)
        verdict = "met" if r <= TARGET else "NOT met"
        print(f"  {name:<20} {r:5.2f}x  (autodiff {a:5.2f}x)  {verdict}")
