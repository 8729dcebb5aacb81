"""The XLA compile options difffn chooses: for set-up programs, and for its CPU kernels.

**Programs that run once** (the initializers, trainnet's key split, the optimizer's ``init``).
XLA's optimizations pay for themselves over the many runs of a training step, not over the one
run of a set-up program, whose cost is all compile time. ``compile_once`` / ``run_once`` compile
with XLA's backend optimizations off and XLA:CPU's classic kernel emitters instead of its MLIR
fusion emitters, which compile several times faster (``docs/performance.md``, "What changed
after that": the benchmark transformer's initializers, their draws merged, 0.24 s instead of
0.75 s; a three-way key split 0.04 s instead of 0.10 s).

**Training programs** (``kernel_options``, given to ``jax.jit`` by trainnet's step and its
other compiled programs; not to a network's compiled ``predict``, which may run inside a user's
own ``jax.jit``, and JAX takes compile options only on a top-level one). jaxlib 0.10's XLA:CPU
hands convolutions, matrix products and reductions to YNNPACK by default. Its convolutions are
the slower choice for training: without them (XLA's own convolution kernels, YNNPACK for the
products and reductions) the benchmark ResNet's hand-written step takes 96-103 ms instead of
123-130 ms, the same losses to float32 rounding, the transformer's step is unchanged, and a
MATLAB-style digits CNN gains 3 % (``docs/performance.md``, "XLA:CPU options"). Each YNNPACK
kernel also builds its plan on the program's first run. A user's own
``--xla_cpu_experimental_ynn_fusion_type`` in ``XLA_FLAGS`` is left to rule; so is a jaxlib
that does not know the option (checked once, on a one-line program).

A backend that refuses an option (a jaxlib that does not know it) compiles with fewer, then with
its defaults; other backends take the ``xla_cpu_*`` options and ignore them. JAX's persistent
compilation cache stores these programs like any other (the options are part of its key).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax

# jax types compiler options as str | bool; XLA reads the level as an int
_ONCE: tuple[dict[str, Any], ...] = (
    {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False},
    {"xla_backend_optimization_level": 0},
)
_YNN = "xla_cpu_experimental_ynn_fusion_type"
_KERNELS = {_YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"}


def compile_once(lowered: Any) -> Any:
    """``lowered`` (``jax.jit(f).lower(...)``) compiled for one run."""
    for options in _ONCE:
        try:
            return lowered.compile(options)
        except Exception:  # noqa: BLE001 - a jaxlib that does not know the option
            continue
    return lowered.compile()


def run_once(fn: Callable[..., Any], *args: Any, **jit_options: Any) -> Any:
    """``jax.jit(fn, **jit_options)(*args)``, compiled for one run (``compile_once``)."""
    return compile_once(jax.jit(fn, **jit_options).lower(*args))(*args)


@functools.cache
def kernel_options() -> dict[str, Any]:
    """The compile options of trainnet's compiled programs (see above)."""
    if _YNN in os.environ.get("XLA_FLAGS", ""):
        return {}
    try:
        jax.jit(lambda: 0, compiler_options=_KERNELS).lower().compile()
    except Exception:  # noqa: BLE001 - a jaxlib without the option: XLA's defaults
        return {}
    return dict(_KERNELS)
