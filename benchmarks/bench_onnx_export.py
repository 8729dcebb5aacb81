"""Exported models in ONNX Runtime: difffn's ``df.export_onnx`` against ``torch.onnx.export``.

The ResNet of ``bench_models`` (batch 64, 32x32x3 images, trained batch-normalization statistics
replaced by random ones so that folding them matters) is exported by ``df.export_onnx`` with and
without the inference rewrites (``optimize``) and, when torch is installed, the same network with
the same parameters (``benchmarks._torch``) by ``torch.onnx.export`` in evaluation mode. ONNX
Runtime (its default graph optimizations, as many threads as cores) runs each file in
interleaved rounds; the table has the median time per batch, the fastest, the spread (the
rounds' interquartile range over the median) and the largest difference from ``net.predict``.
``net.predict`` itself and PyTorch eager inference are timed beside them.

Target (issue 29): difffn's file within 10 % of torch's.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time

import jax
import numpy as np

from . import _model_resnet, _torch, bench_models
from ._timing import table

ROUNDS = {False: 15, True: 3}


def _network(sizes):
    """The benchmark's ResNet with random batch-normalization statistics."""
    net = _model_resnet.difffn_network(sizes)
    rng = np.random.default_rng(1)
    for layer in net.layers:
        if type(layer).__name__ == "BatchNorm":
            c = np.asarray(layer.trained_mean).size
            net = net.replace_layer(
                layer.name,
                layer.replace(
                    trained_mean=np.asarray(rng.normal(0, 0.5, c), np.float32),
                    trained_variance=np.asarray(rng.uniform(0.5, 2.0, c), np.float32),
                ),
            )
    return net


def _torch_export(sizes, net, x, folder):
    """``(torch eager predict, ONNX file)`` of the same network, or ``(None, None)``."""
    if not _torch.available():
        return None, None
    import torch

    params, state = jax.tree.map(np.asarray, bench_models.parameters(net))
    model = _torch._resnet(dataclasses.asdict(sizes), params, state, channels_last=False).eval()
    path = os.path.join(folder, "torch.onnx")
    sample = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    torch.onnx.export(model, (sample,), path, input_names=["input"], dynamo=False)

    def predict():
        with torch.no_grad():
            return model(sample).numpy()

    return predict, path


def run(*, quick: bool = False) -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime as ort
    except ImportError:
        print("not run: onnx and onnxruntime are not installed (pip install difffn[onnx])")
        return

    import difffn as df

    sizes = _model_resnet.QUICK if quick else _model_resnet.FULL
    net = _network(sizes)
    x = np.random.default_rng(0).standard_normal((sizes.batch, sizes.image, sizes.image, 3))
    x = x.astype(np.float32)
    expected = np.asarray(net.predict(x).data)
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as folder:
        candidates = {}
        for name, optimize in (("df.export_onnx", True), ("df.export_onnx(optimize=False)", False)):
            path = df.export_onnx(net, os.path.join(folder, f"{optimize}.onnx"), optimize=optimize)
            session = ort.InferenceSession(str(path), options)
            candidates[f"ONNX Runtime: {name}"] = lambda s=session: s.run(None, {"input": x})[0]
        torch_predict, torch_path = _torch_export(sizes, net, x, folder)
        if torch_path is not None:
            session = ort.InferenceSession(torch_path, options)
            nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
            candidates["ONNX Runtime: torch.onnx.export"] = lambda: session.run(
                None, {"input": nchw}
            )[0]
            candidates["torch eager (no_grad)"] = torch_predict
        else:
            print(_torch.HOW_TO_ADD)
        candidates["difffn net.predict"] = lambda: np.asarray(net.predict(x).data)
        errors = {name: float(np.max(np.abs(f() - expected))) for name, f in candidates.items()}
        times = {name: [] for name in candidates}
        for _ in range(ROUNDS[quick]):
            for name, f in candidates.items():
                start = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - start)
    reference = statistics.median(
        times.get("ONNX Runtime: torch.onnx.export", times[next(iter(times))])
    )
    rows = []
    for name, t in times.items():
        median = statistics.median(t)
        q = statistics.quantiles(t, n=4) if len(t) > 1 else [median] * 3
        rows.append([
            name,
            f"{median * 1e3:7.2f} ms",
            f"{min(t) * 1e3:7.2f} ms",
            f"{(q[2] - q[0]) / median * 100:4.0f}%",
            f"{median / reference:5.2f}x",
            f"{errors[name]:.1e}",
        ])  # fmt: skip
    print(f"\nResNet {sizes}: inference of one batch, {ROUNDS[quick]} interleaved rounds")
    header = ["runs", "median", "fastest", "spread", "vs torch's file", "max |diff| vs predict"]
    print(table(rows, header))


if __name__ == "__main__":
    run()
