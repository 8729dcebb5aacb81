"""The precision of matrix products on this CPU: float32 against bfloat16 with float32 sums.

Issue 29 names "the precision of matrix products (keeping float32 results)" among the levers
against PyTorch's CPU speed. XLA:CPU ignores ``jax.default_matmul_precision`` (a float32
product is computed in float32 whatever it says), so the only way to a faster product is to
hand XLA bfloat16 operands. On a CPU with AMX or AVX512-BF16 (``/proc/cpuinfo``), a product of
bfloat16 operands that asks for a float32 result (``preferred_element_type``) runs on those
units; one that returns bfloat16 does not. This prints, in one run, with the float32 product
as the baseline:

1. products at the benchmark transformer's sizes and one large one: float32; bfloat16 operands
   with float32 sums ("bf16 x1": the operands rounded, about 3 significant digits); the
   three-product split ("bf16 x3": each operand as a bfloat16 high and low part, the three
   largest cross products summed in float32, close to float32's accuracy); bfloat16 operands
   and result ("bf16 out"); each with its
   largest error against NumPy's float64 product, relative to the largest entry;
2. the transformer's dense, GELU, dense block, forward and backward: in float32, in bfloat16
   as XLA compiles it (bfloat16 products), and in bfloat16 with float32-summing products (a
   ``jax.custom_vjp`` whose backward does the same);
3. ``trainnet``'s transformer step with ``precision="float32"`` and ``"bfloat16"`` (the
   learnables stay float32, the network computes in bfloat16).

Timings are medians of interleaved rounds (``_timing.compare``, shuffled within each round;
``trainnet``'s two precisions alternate); nothing here changes difffn.
``python -m benchmarks matmul_precision [--quick]``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import bench_models
from ._timing import compare

F32, BF16 = jnp.float32, jnp.bfloat16
SIZES = {False: [(4096, 128, 128), (4096, 128, 512), (4096, 512, 128), (4096, 512, 512)]}
SIZES[True] = [(64, 16, 32), (64, 32, 16)]
ROUNDS = {False: 9, True: 3}  # compare needs three rounds for its quartiles


def _product(a: jax.Array, b: jax.Array) -> jax.Array:
    return jax.lax.dot(a, b, preferred_element_type=F32)


def bf16_x1(a: jax.Array, b: jax.Array) -> jax.Array:
    """Operands rounded to bfloat16, sums and result in float32."""
    return _product(a.astype(BF16), b.astype(BF16))


def _split(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    high = x.astype(BF16)
    return high, (x - high.astype(F32)).astype(BF16)


def bf16_x3(a: jax.Array, b: jax.Array) -> jax.Array:
    """Three bfloat16 products of the operands' high and low parts, summed in float32."""
    (ah, al), (bh, bl) = _split(a), _split(b)
    return _product(ah, bh) + (_product(ah, bl) + _product(al, bh))


PRODUCTS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "float32": lambda a, b: a @ b,
    "bf16 x1": bf16_x1,
    "bf16 out": lambda a, b: a.astype(BF16) @ b.astype(BF16),  # bfloat16 result: no AMX
    "bf16 x3": bf16_x3,
}


@jax.custom_vjp
def summing_in_float32(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` of low-precision operands, summed in float32, rounded to their dtype; the
    backward's two products alike (JAX's own transpose would multiply a float32 cotangent by a
    bfloat16 operand, which XLA:CPU computes in float32)."""
    return _product(x, w).astype(x.dtype)


def _summing_fwd(x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return summing_in_float32(x, w), (x, w)


def _summing_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, w = res
    g = g.astype(x.dtype)
    return _product(g, w.T).astype(x.dtype), _product(x.T, g).astype(w.dtype)


summing_in_float32.defvjp(_summing_fwd, _summing_bwd)


def dense_block(
    dtype: Any, product: Callable[[jax.Array, jax.Array], jax.Array]
) -> Callable[..., tuple[jax.Array, jax.Array, jax.Array]]:
    """The gradient of the transformer's dense, GELU, dense block, computed in ``dtype``."""

    def loss(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        h = jax.nn.gelu(product(x.astype(dtype), w1.astype(dtype)), approximate=False)
        return jnp.sum(product(h, w2.astype(dtype)).astype(F32) ** 2)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def products(quick: bool) -> list[dict[str, Any]]:
    """Per size: each product's time (ms) and largest error relative to the largest entry."""
    rows = []
    for m, k, n in SIZES[quick]:
        ka, kb = jax.random.split(jax.random.key(0))
        a, b = jax.random.normal(ka, (m, k)), jax.random.normal(kb, (k, n))
        exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
        jitted = {name: jax.jit(fn) for name, fn in PRODUCTS.items()}
        errors = {
            name: float(np.max(np.abs(np.asarray(fn(a, b), np.float64) - exact)))
            / float(np.max(np.abs(exact)))
            for name, fn in jitted.items()
        }
        times = compare(
            {name: (lambda fn=fn, a=a, b=b: fn(a, b)) for name, fn in jitted.items()},
            rounds=ROUNDS[quick],
        )
        ms = {name: t.median_s * 1e3 for name, t in times.items()}
        rows.append({"size": (m, k, n), "ms": ms, "error": errors})
    return rows


def block(quick: bool) -> dict[str, float]:
    """The dense block's forward and backward (ms), three ways."""
    rows, width = (64, 16) if quick else (4096, 128)
    keys = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(keys[0], (rows, width))
    w1 = jax.random.normal(keys[1], (width, 4 * width)) * 0.05
    w2 = jax.random.normal(keys[2], (4 * width, width)) * 0.05
    runs = {
        "float32": dense_block(F32, lambda p, q: p @ q),
        "bfloat16 (XLA's products)": dense_block(BF16, lambda p, q: p @ q),
        "bfloat16, products summing in float32": dense_block(BF16, summing_in_float32),
    }
    times = compare(
        {name: (lambda g=g: g(x, w1, w2)) for name, g in runs.items()}, rounds=ROUNDS[quick]
    )
    return {name: t.median_s * 1e3 for name, t in times.items()}


def trainnet_step(quick: bool) -> dict[str, float]:
    """``trainnet``'s transformer step (ms) in the two precisions: the median over rounds of a
    three-epoch run less a one-epoch run, over the steps between them; the two precisions
    alternate within each round."""
    import difffn as df

    model = bench_models.MODELS["transformer"]
    sizes = model.QUICK if quick else model.FULL
    batches = 3
    X, T = model.data(sizes, batches)
    net = model.difffn_network(sizes)
    options = {
        p: bench_models.difffn_options(sizes, None).replace(precision=p)
        for p in ("float32", "bfloat16")
    }

    def run(precision: str, epochs: int) -> float:
        start = time.perf_counter()
        chosen = options[precision].replace(max_epochs=epochs)
        trained, _ = df.trainnet(X, T, net, "crossentropy", chosen)
        jax.block_until_ready(jax.tree.leaves(trained))
        return time.perf_counter() - start

    steps: dict[str, list[float]] = {p: [] for p in options}
    for p in options:
        run(p, 1)  # compile
    for _ in range(ROUNDS[quick]):
        for p in options:
            short, long = run(p, 1), run(p, 3)
            steps[p].append((long - short) / (2 * batches) * 1e3)
    return {p: statistics.median(v) for p, v in steps.items()}


def run(*, quick: bool = False) -> None:
    print("products: ms (x float32's time), largest error relative to the largest entry")
    for row in products(quick):
        base = row["ms"]["float32"]
        cells = ", ".join(
            f"{name} {ms:.2f} ms ({ms / base:.2f}x, error {row['error'][name]:.1e})"
            for name, ms in row["ms"].items()
        )
        print(f"  {row['size']}: {cells}")
    times = block(quick)
    base = times["float32"]
    print("dense-GELU-dense block, forward and backward:")
    for name, ms in times.items():
        print(f"  {name}: {ms:.2f} ms ({ms / base:.2f}x float32's time)")
    steps = trainnet_step(quick)
    print(
        f"trainnet transformer step: float32 {steps['float32']:.1f} ms, bfloat16 "
        f"{steps['bfloat16']:.1f} ms ({steps['bfloat16'] / steps['float32']:.2f}x)"
    )


if __name__ == "__main__":
    run()
