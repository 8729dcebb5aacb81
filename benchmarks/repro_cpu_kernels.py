"""Minimal JAX programs for the XLA:CPU kernels that dominate the two models' training steps.

For an upstream (openxla/xla) report: each kernel is one ``jax.jit`` function of fixed shapes,
timed against the same operation in PyTorch when torch is installed (oneDNN/MKL kernels), with
its arithmetic rate. Run: ``python -m benchmarks.repro_cpu_kernels`` (``XLA_FLAGS`` applies,
e.g. ``--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION``).

1. The filter gradient of a 3x3 "SAME" convolution, NHWC, batch 64, 32x32, 16 -> 16 channels
   (the ResNet's first stage; the earlier profiles put half the ResNet step in convolution
   filter gradients).
2. A dense layer's forward and both gradients at the transformer's sizes: (32*128, 128) x
   (128, 512) (the earlier profiles put ~61 % of the transformer step in matmul fusions).
3. Attention's scores, forward and both gradients: batch 32 x 4 heads of (128, 32) x (32, 128)
   (the transformer's ``[32x4x128x128]`` dot fusions, 10.5 % of its step in the quiet profile
   of 2026-11-27, at about a fifth of the dense layer's arithmetic rate).

4. The same filter gradient in the body of a ``lax.fori_loop`` (4 iterations, each feeding the
   next): XLA:CPU's ``ConvCanonicalization`` rewrites only top-level convolutions into its
   kernels' layout, so in a loop the gradient (``dim_labels=f01b_i01o->01bf``) is compiled as a
   naive loop nest (an ``..._elemental_kernel_module``). Printed: its time per iteration against
   item 1's, and the layouts of the loop's convolutions.

5. Attention's batched products on one core and on all: ``dS K`` (YNNPACK) and ``dS^T Q``
   (XLA's own ``dot``, the left operand contracted on its sequence axis), batch 32 x 4 heads
   of (128, 128) x (128, 32), beside a dense (4096, 128) x (128, 512) product, each timed in a
   child process pinned to one core (``os.sched_setaffinity`` before XLA starts its threads)
   and in one with every core. On this 2-core machine (2026-11-28) the batched products took
   the same time either way, while the dense one ran 1.7x faster on two cores (Linux only).

On the quiet 2-core machine (2026-11-27 16:37 UTC, jax 0.10.2, torch 2.14.1) the first ran at
23.6 GFLOP/s in XLA against 235.3 in PyTorch (10.0x slower), the second at 170.7 against
222.7, the third at 52.0 against 128.9; ``docs/performance.md`` has the table.
"""

from __future__ import annotations

import importlib.util
import os
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

REPEATS = 20


def _time(fn, *args) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def conv_filter_gradient(n=64, size=32, c_in=16, c_out=16, k=3):
    """XLA's time of the filter gradient, its FLOPs, and the arrays (NHWC, HWIO)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((n, size, size, c_in), np.float32))
    w = jnp.asarray(rng.standard_normal((k, k, c_in, c_out), np.float32))
    dy = jnp.asarray(rng.standard_normal((n, size, size, c_out), np.float32))

    @jax.jit
    def filter_gradient(x, w, dy):  # x an argument: a constant would be pre-transposed by XLA
        def conv(w):
            return jax.lax.conv_general_dilated(
                x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )

        return jax.vjp(conv, w)[1](dy)[0]

    flops = 2 * n * size * size * c_in * c_out * k * k
    return _time(filter_gradient, x, w, dy), flops, (x, w, dy)


def dense_step(rows=32 * 128, width=128, hidden=512):
    """XLA's time of a dense layer's forward and both gradients, and its FLOPs."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((rows, width), np.float32))
    w = jnp.asarray(rng.standard_normal((width, hidden), np.float32))

    @jax.jit
    def step(x, w):
        y, back = jax.vjp(lambda x, w: x @ w, x, w)
        return y, back(jnp.ones_like(y))

    return _time(step, x, w), 3 * 2 * rows * width * hidden, (x, w)


def attention_scores(batch=32 * 4, steps=128, head=32):
    """XLA's time of ``q @ k^T`` per head, forward and both gradients, and its FLOPs."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((batch, steps, head), np.float32))
    k = jnp.asarray(rng.standard_normal((batch, steps, head), np.float32))

    @jax.jit
    def step(q, k):
        s, back = jax.vjp(lambda q, k: jnp.einsum("btd,bsd->bts", q, k), q, k)
        return s, back(jnp.ones_like(s))

    return _time(step, q, k), 3 * 2 * batch * steps * steps * head, (q, k)


def _torch_times(conv_arrays, dense_arrays, attention_arrays):
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    x, w, dy = (torch.from_numpy(np.array(a)) for a in conv_arrays)
    x, dy = x.permute(0, 3, 1, 2), dy.permute(0, 3, 1, 2)  # NHWC views: channels-last memory
    weight_shape = tuple(w.permute(3, 2, 0, 1).shape)

    def conv_grad():
        return torch.nn.grad.conv2d_weight(x, weight_shape, dy, padding=1)

    dx, dw = (torch.from_numpy(np.array(a)) for a in dense_arrays)

    def dense():
        xs, ws = dx.clone().requires_grad_(), dw.clone().requires_grad_()
        y = xs @ ws
        y.backward(torch.ones_like(y))
        return y

    aq, ak = (torch.from_numpy(np.array(a)) for a in attention_arrays)

    def scores():
        qs, ks = aq.clone().requires_grad_(), ak.clone().requires_grad_()
        s = torch.bmm(qs, ks.transpose(1, 2))
        s.backward(torch.ones_like(s))
        return s

    out = []
    for fn in (conv_grad, dense, scores):
        fn()
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        out.append(statistics.median(times))
    return out


def conv_filter_gradient_in_a_loop(x, w, dy, iterations=4):
    """XLA's time per iteration of item 1's filter gradient inside a ``lax.fori_loop``, and the
    ``dim_labels`` of the convolutions in the compiled program."""

    @jax.jit
    def loop(x, w, dy):
        def body(_, w):
            def conv(w):
                return jax.lax.conv_general_dilated(
                    x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
                )

            return w - 1e-6 * jax.vjp(conv, w)[1](dy)[0]

        return jax.lax.fori_loop(0, iterations, body, w)

    text = loop.lower(x, w, dy).compile().as_text()
    labels = sorted(set(re.findall(r"convolution\(.*dim_labels=([\w>-]+)", text)))
    return _time(loop, x, w, dy) / iterations, labels


def batched_products(pin: bool) -> dict[str, float]:
    """Item 5 in this process: seconds of each product (``pin``: this process and the threads
    XLA starts later on its first core only; call before anything runs on the CPU backend)."""
    if pin:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    rng = np.random.default_rng(0)
    ds = jnp.asarray(rng.standard_normal((32, 4, 128, 128), np.float32))
    k = jnp.asarray(rng.standard_normal((32, 4, 128, 32), np.float32))
    x = jnp.asarray(rng.standard_normal((4096, 128), np.float32))
    w = jnp.asarray(rng.standard_normal((128, 512), np.float32))
    products = {
        "dS K (batched)": (jax.jit(lambda a, b: jnp.einsum("bnts,bnsd->bntd", a, b)), ds, k),
        "dS^T Q (batched)": (jax.jit(lambda a, b: jnp.einsum("bnts,bntd->bnsd", a, b)), ds, k),
        "dense x W": (jax.jit(lambda a, b: a @ b), x, w),
    }
    return {name: _time(fn, *args) for name, (fn, *args) in products.items()}


def _products_in_a_child(pin: bool) -> dict[str, float]:
    import json
    import subprocess

    code = (
        "import json; from benchmarks import repro_cpu_kernels as r; "
        f"print(json.dumps(r.batched_products({pin})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    conv_s, conv_flops, conv_arrays = conv_filter_gradient()
    dense_s, dense_flops, dense_arrays = dense_step()
    scores_s, scores_flops, scores_arrays = attention_scores()
    print(f"jax {jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, "
          f"{os.cpu_count()} cores, median of {REPEATS}")  # fmt: skip
    rows = [
        ("conv 3x3 filter gradient", conv_s, conv_flops),
        ("dense fwd+bwd", dense_s, dense_flops),
        ("attention scores fwd+bwd", scores_s, scores_flops),
    ]
    torch_s = [None, None, None]
    if importlib.util.find_spec("torch") is not None:
        torch_s = _torch_times(conv_arrays, dense_arrays, scores_arrays)
    for (name, seconds, flops), other in zip(rows, torch_s):
        line = f"{name:26s} XLA {seconds * 1e3:8.2f} ms ({flops / seconds / 1e9:6.1f} GFLOP/s)"
        if other is not None:
            line += f"   torch {other * 1e3:8.2f} ms ({flops / other / 1e9:6.1f} GFLOP/s)"
        print(line)
    looped_s, labels = conv_filter_gradient_in_a_loop(*conv_arrays)
    print(
        f"{'the same, in a fori_loop':26s} XLA {looped_s * 1e3:8.2f} ms per iteration "
        f"({looped_s / conv_s:.1f}x item 1; its convolutions' layouts: {', '.join(labels)})"
    )
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        print("one core against all: needs Linux and at least two cores here")
        return 0
    one, every = _products_in_a_child(True), _products_in_a_child(False)
    cores = len(os.sched_getaffinity(0))
    for name in one:
        print(
            f"{name:26s} XLA {one[name] * 1e3:8.2f} ms on one core, {every[name] * 1e3:8.2f} ms "
            f"on {cores} ({one[name] / every[name]:.2f}x from the other cores)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
