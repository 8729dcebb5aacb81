"""Compiling a program that runs once: set-up programs (initializers, key splits, optimizer state).

XLA's optimizations pay for themselves over the many runs of a training step, not over the one
run of a set-up program: for those, compile time is all of the cost. ``compile_once`` compiles
with XLA's backend optimizations off and XLA:CPU's classic kernel emitters instead of its MLIR
fusion emitters, which compile several times faster (measured in ``docs/performance.md``,
"Where the cold first step goes": the benchmark transformer's initializers 0.24 s instead of
0.89 s; a three-way key split 0.04 s instead of 0.10 s). A backend that refuses an option
compiles with fewer, then with its defaults. JAX's persistent compilation cache stores the
result like any other program, and JAX keeps it in memory for the next call of the same
program.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

# jax types compiler options as str | bool; XLA reads the level as an int
_OPTIONS: tuple[dict[str, Any], ...] = (
    {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False},
    {"xla_backend_optimization_level": 0},
)


def compile_once(lowered: Any) -> Any:
    """``lowered`` (``jax.jit(f).lower(...)``) compiled for one run."""
    for options in _OPTIONS:
        try:
            return lowered.compile(options)
        except Exception:  # noqa: BLE001 - a backend without the option (a GPU has no CPU emitters)
            continue
    return lowered.compile()


def run_once(fn: Callable[..., Any], *args: Any, **jit_options: Any) -> Any:
    """``jax.jit(fn, **jit_options)(*args)``, compiled for one run (``compile_once``)."""
    return compile_once(jax.jit(fn, **jit_options).lower(*args))(*args)
