"""The two models of ``bench_models`` in PyTorch (eager, channels-last, ``torch.compile``).

PyTorch is what a MATLAB user moving to Python would most likely pick instead, so the benchmark
times it beside difffn when it is installed; it is no dependency of difffn, of its tests or of
the benchmarks (``pip install torch`` in the benchmark's environment adds the columns; a
separate virtual environment keeps it out of difffn's own).

The models copy difffn's initial learnables and batch-normalization statistics (the
``{layer: {name: array}}`` tables of ``bench_models.parameters``) and compute what the
hand-written JAX loop computes: convolutions with JAX's ``"SAME"`` padding (the extra row and
column at the end, as MATLAB's ``"same"``), batch normalization in training mode with
momentum-0.1 running statistics, MATLAB's crossentropy of softmax probabilities, SGD with
momentum 0.9 and learn rate 0.01 (``torch.optim.SGD`` keeps ``v = 0.9 v + g``, optax's
``trace``). Mini-batches are sliced in order from the whole data set held as one tensor.

This module imports neither JAX nor difffn, so a worker process that runs PyTorch alone
(``python -m benchmarks._torch --worker MODEL VARIANT FILE``, its data and parameters in an
``.npz`` file written by ``bench_models``) reports PyTorch's own peak memory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time

import numpy as np

from ._memory import peak_rss_mib

VARIANTS = {
    "resnet": ("torch eager", "torch eager channels-last", "torch.compile"),
    "transformer": ("torch eager", "torch.compile"),
}
LEARN_RATE, MOMENTUM = 0.01, 0.9
HOW_TO_ADD = (
    "PyTorch columns: not run (torch is not installed in this environment). To add them: "
    "python -m venv ENV && ENV/bin/pip install torch jax flax optax equinox, then "
    "PYTHONPATH=. ENV/bin/python -m benchmarks models"
)


def available() -> bool:
    return importlib.util.find_spec("torch") is not None


def _torch():
    import torch

    torch.set_num_threads(os.cpu_count() or 1)  # every core, as XLA:CPU uses them
    return torch


# -- the models -----------------------------------------------------------------------------------


def _resnet(sizes: dict, params: dict, state: dict, channels_last: bool):
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional

    def tensor(a):
        return torch.tensor(np.asarray(a, np.float32))

    class SameConv(nn.Module):
        """A convolution with JAX's "SAME" padding (extra padding at the end)."""

        def __init__(self, p, stride):
            super().__init__()
            w = np.transpose(np.asarray(p["weights"]), (3, 2, 0, 1))  # HWIO -> OIHW
            self.k, self.stride = w.shape[-1], stride
            self.conv = nn.Conv2d(w.shape[1], w.shape[0], self.k, stride)
            with torch.no_grad():
                self.conv.weight.copy_(tensor(w))
                self.conv.bias.copy_(tensor(p["bias"]).reshape(-1))

        def forward(self, x):
            n = int(x.shape[-1])  # a constant in torch.onnx.export's trace: a static Pad
            total = max((math.ceil(n / self.stride) - 1) * self.stride + self.k - n, 0)
            low = total // 2
            if low == total - low:
                return F.conv2d(x, self.conv.weight, self.conv.bias, self.stride, low)
            return self.conv(F.pad(x, (low, total - low, low, total - low)))

    def bn(p, s):
        c = np.asarray(p["scale"]).size
        layer = nn.BatchNorm2d(c, eps=1e-5, momentum=0.1)
        with torch.no_grad():
            layer.weight.copy_(tensor(p["scale"]).reshape(-1))
            layer.bias.copy_(tensor(p["offset"]).reshape(-1))
            layer.running_mean.copy_(tensor(s["trained_mean"]).reshape(-1))
            layer.running_var.copy_(tensor(s["trained_variance"]).reshape(-1))
        return layer

    def conv_bn(name, bn_name, stride=1):
        return nn.Sequential(SameConv(params[name], stride), bn(params[bn_name], state[bn_name]))

    class Block(nn.Module):
        def __init__(self, s, stride, projected):
            super().__init__()
            self.a = conv_bn(f"{s}_conv1", f"{s}_bn1", stride)
            self.b = conv_bn(f"{s}_conv2", f"{s}_bn2")
            self.proj = conv_bn(f"{s}_proj", f"{s}_proj_bn", stride) if projected else None

        def forward(self, x):
            y = self.b(F.relu(self.a(x)))
            return F.relu(y + (self.proj(x) if self.proj is not None else x))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = conv_bn("stem_conv", "stem_bn")
            blocks, previous = [], sizes["channels"][0]
            for i, c in enumerate(sizes["channels"]):
                stride = 1 if i == 0 else 2
                blocks.append(Block(f"s{i}", stride, stride != 1 or c != previous))
                previous = c
            self.blocks = nn.Sequential(*blocks)
            w = np.asarray(params["fc"]["weights"])
            self.fc = nn.Linear(w.shape[0], w.shape[1])
            with torch.no_grad():
                self.fc.weight.copy_(tensor(w.T))
                self.fc.bias.copy_(tensor(params["fc"]["bias"]).reshape(-1))

        def forward(self, x):
            x = self.blocks(F.relu(self.stem(x)))
            return F.softmax(self.fc(x.mean(dim=(2, 3))), dim=-1)

    model = ResNet()
    return model.to(memory_format=torch.channels_last) if channels_last else model


def _transformer(sizes: dict, params: dict):
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional
    heads, width = sizes["heads"], sizes["width"]

    def linear(w, b):
        w = np.asarray(w)
        layer = nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            layer.weight.copy_(torch.tensor(np.ascontiguousarray(w.T), dtype=torch.float32))
            layer.bias.copy_(torch.tensor(np.asarray(b, np.float32).reshape(-1)))
        return layer

    def layernorm(p):
        layer = nn.LayerNorm(width, eps=1e-5)
        with torch.no_grad():
            layer.weight.copy_(torch.tensor(np.asarray(p["scale"], np.float32).reshape(-1)))
            layer.bias.copy_(torch.tensor(np.asarray(p["offset"], np.float32).reshape(-1)))
        return layer

    class Attention(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.q, self.k, self.v, self.o = (
                linear(p[f"{n}_weights"], p[f"{n}_bias"])
                for n in ("query", "key", "value", "output")
            )

        def forward(self, x):
            b, t, _ = x.shape

            def split(y):  # heads: contiguous channel groups, as difffn's SelfAttention
                return y.view(b, t, heads, -1).transpose(1, 2)

            a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
            return self.o(a.transpose(1, 2).reshape(b, t, width))

    class Block(nn.Module):
        def __init__(self, i):
            super().__init__()
            b = f"l{i}"
            self.attn = Attention(params[f"{b}_attn"])
            self.ln1, self.ln2 = layernorm(params[f"{b}_ln1"]), layernorm(params[f"{b}_ln2"])
            fc1, fc2 = params[f"{b}_fc1"], params[f"{b}_fc2"]
            self.fc1 = linear(fc1["weights"], fc1["bias"])
            self.fc2 = linear(fc2["weights"], fc2["bias"])

        def forward(self, x):
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(*(Block(i) for i in range(sizes["layers"])))
            self.fc = linear(params["fc"]["weights"], params["fc"]["bias"])

        def forward(self, x):
            return F.softmax(self.fc(self.blocks(x).mean(dim=1)), dim=-1)

    return Transformer()


# -- training -----------------------------------------------------------------------------------


def trainer(model_name: str, variant: str, sizes: dict, params, state, X, T):
    """``train(epochs) -> (None, losses)`` from the same initial parameters on every call."""
    torch = _torch()
    channels_last = variant == "torch eager channels-last"
    if model_name == "resnet":
        model = _resnet(sizes, params, state, channels_last)
        X = np.ascontiguousarray(np.transpose(X, (0, 3, 1, 2)))  # NHWC -> NCHW
    else:
        model = _transformer(sizes, params)
    Xt = torch.from_numpy(np.asarray(X, np.float32))
    if channels_last:
        Xt = Xt.contiguous(memory_format=torch.channels_last)
    Tt = torch.from_numpy(np.asarray(T, np.int64))
    eps = float(np.finfo(np.float32).eps)

    def loss_of(x, t):  # MATLAB's crossentropy of probabilities, as the JAX loops'
        picked = torch.gather(model(x), 1, t[:, None])
        return -torch.sum(torch.log(torch.clamp(picked, min=eps))) / x.shape[0]

    forward = torch.compile(loss_of) if variant == "torch.compile" else loss_of
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    batch = sizes["batch"]

    def train(epochs):
        model.load_state_dict(initial)
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARN_RATE, momentum=MOMENTUM)
        losses = []
        for _ in range(epochs):
            for b in range(len(Xt) // batch):
                loss = forward(Xt[b * batch : (b + 1) * batch], Tt[b * batch : (b + 1) * batch])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(loss.detach())
        return None, np.array([float(v) for v in losses])

    return train


def load(path):
    """``(sizes, params, state, X, T)`` from the ``.npz`` file of :func:`save`."""
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    sizes = json.loads(str(arrays.pop("sizes")))
    X, T = arrays.pop("X"), arrays.pop("T")
    tables = ({}, {})
    for key, value in arrays.items():
        kind, layer, name = key.split("/")
        tables[kind == "state"].setdefault(layer, {})[name] = value
    return sizes, tables[0], tables[1], X, T


def save(path, sizes: dict, params, state, X, T) -> None:
    """Write what a PyTorch worker needs: sizes, learnables, state, data."""
    arrays = {"sizes": np.asarray(json.dumps(sizes)), "X": np.asarray(X), "T": np.asarray(T)}
    for kind, table in (("params", params), ("state", state)):
        for layer, values in table.items():
            for name, value in values.items():
                arrays[f"{kind}/{layer}/{name}"] = np.asarray(value)
    np.savez(path, **arrays)


def _worker(model_name, variant, path):
    """One PyTorch variant cold in this fresh process: time to the first step, losses, memory."""
    sizes, params, state, X, T = load(path)
    _torch()
    batch = sizes["batch"]
    start = time.perf_counter()  # cold: build the model and optimizer (compile), one step
    _, losses = trainer(model_name, variant, sizes, params, state, X[:batch], T[:batch])(1)
    result = {"first_step_s": time.perf_counter() - start, "first_loss": float(losses[0])}
    _, losses = trainer(model_name, variant, sizes, params, state, X, T)(1)
    result["losses"] = [float(v) for v in losses[:2]]
    result["maxrss_mib"] = peak_rss_mib()
    print(json.dumps(result))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._torch")
    parser.add_argument("--worker", nargs=3, metavar=("MODEL", "VARIANT", "NPZ"), required=True)
    _worker(*parser.parse_args(argv).worker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
