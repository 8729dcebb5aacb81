"""check_layer: the whole check of the SReLU layer on MATLAB's layout, against one training step.

The layer is example 09's SReLU (custom backward) on ``df.Layout((128, 24, 24, 20), "BSSC")``,
the layout of MATLAB's checkLayer example. Reported: the first call (it compiles what it needs),
then warm calls, timed in interleaved rounds against the baseline: one jitted forward + backward
of the same layer (``jax.value_and_grad`` through the custom backward, float32). Target (issue 4):
the warm check takes under 10 s on a 2-core machine.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

import difffn as df
from difffn._layer._layer import call_layer

from ._examples import load
from ._timing import compare, fmt_time, table

SHAPE = (128, 24, 24, 20)
QUICK_SHAPE = (16, 12, 12, 8)


def run(*, quick: bool = False) -> None:
    example = load("09_check_layer")
    shape = QUICK_SHAPE if quick else SHAPE
    layout = df.Layout(shape, "BSSC")
    layer = example.SReLULayer(name="srelu").initialize(layout, key=jax.random.key(0))

    start = time.perf_counter()
    report = df.check_layer(layer, layout)
    first = time.perf_counter() - start
    assert report.ok, str(report)

    x = df.dlarray(jax.random.normal(jax.random.key(1), shape, jnp.float32), "BSSC")
    names = layer.learnable_names

    @jax.jit
    def step(learnables, x):
        def loss(learnables, x):
            outs, _ = call_layer(layer.replace(**learnables), (x,), training=True)
            return jnp.sum(df.stripdims(outs[0]) ** 2)

        return jax.value_and_grad(loss, argnums=(0, 1))(learnables, x)

    learnables = {n: getattr(layer, n) for n in names}
    timings = compare(
        {
            "check_layer (warm)": lambda: df.check_layer(layer, layout).failed,
            "forward+backward (jit)": lambda: step(learnables, x),
        },
        rounds=3 if quick else 5,
        min_round_s=0.0,
    )
    check, baseline = timings["check_layer (warm)"], timings["forward+backward (jit)"]
    rows = [
        ["check_layer (first call)", fmt_time(first), "", ""],
        [
            "check_layer (warm)",
            fmt_time(check.median_s),
            f"{check.ratio_to(baseline):8.0f}x",
            f"{check.noise * 100:4.1f}%",
        ],
        [
            "forward+backward (jit)",
            fmt_time(baseline.median_s),
            "    1x",
            f"{baseline.noise * 100:4.1f}%",
        ],
    ]
    print(f"\nSReLU layer with a custom backward, Layout({shape}, 'BSSC'); {len(report)} tests")
    print(table(rows, ["case", "time", "vs fwd+bwd", "noise"]))
    gradients = [r for r in report.results if r.name.startswith("gradients_are_correct")]
    others = sorted((r for r in report.results if r not in gradients), key=lambda r: -r.duration)
    print("first call, by test:")
    label = f"{len(gradients)} gradient tests together"
    print(f"  {label:<40} {fmt_time(sum(r.duration for r in gradients))}")
    for result in others[:3]:
        print(f"  {result.name:<40} {fmt_time(result.duration)}")
    target = "" if quick else f"  (target < 10 s: {'met' if check.median_s < 10 else 'MISSED'})"
    print(f"warm check_layer: {check.median_s:.2f} s{target}")
