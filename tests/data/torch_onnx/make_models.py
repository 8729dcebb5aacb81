"""Make the PyTorch-exported ONNX files that tests/test_onnx_torch.py reads (torch is not a
test dependency: the files, their reference outputs and torch's gradients are committed).

Run with a separate environment that has torch, torchvision, transformers, onnx and onnxscript:

    /work/torchvenv/bin/python tests/data/torch_onnx/make_models.py

Every model is a tiny configuration with random weights (seeded), exported by
``torch.onnx.export`` with the TorchScript exporter (``dynamo=False``, opset 13 or 17, dynamic
batch and sequence axes) and, where it works, the dynamo exporter (opset 18, ``dynamic_shapes``).
Next to each ``NAME.onnx`` is ``NAME.npz``: inputs and torch's outputs at several batch sizes
(``x_b{n}``/``y_b{n}`` per input and output index) and, for floating-point inputs, torch's
gradient of ``sum(output * cotangent)`` with respect to the first input in float64
(``grad_x{i}``/``grad_cot``/``grad_out``, at batch 2). ``VERSIONS.txt`` records the versions,
``models.json`` the files each model got: GPT-2 of transformers 5.24 has no TorchScript file
(that exporter has no ``aten::diff`` at opset 17, which transformers' masking uses).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
BATCHES = (1, 2, 3, 5)
warnings.filterwarnings("ignore")


# -- models ---------------------------------------------------------------------------------------


def vit():
    from torchvision.models import VisionTransformer

    return VisionTransformer(
        image_size=16, patch_size=8, num_layers=2, num_heads=3, hidden_dim=24, mlp_dim=48,
        num_classes=5,
    )  # fmt: skip


class GPT2(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=2, use_cache=False,
            attn_implementation="eager",
        )  # fmt: skip
        self.model = GPT2LMHeadModel(config)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False, return_dict=False)[0]


class BERT(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(
            vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=16, attn_implementation="eager",
        )  # fmt: skip
        self.model = BertModel(config, add_pooling_layer=True)

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
        return out[0], out[1]


class RNNClassifier(nn.Module):
    """A (bi)LSTM/GRU over ``(batch, time, features)`` and a linear layer on the last step."""

    def __init__(self, kind, bidirectional, states=False, layers=1):
        super().__init__()
        cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.kind, self.states = kind, states
        self.rnn = cls(4, 6, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.fc = nn.Linear(6 * (2 if bidirectional else 1), 3)

    def forward(self, x, *state):
        if self.states:
            state = state if self.kind == "lstm" else state[0]
            y, _ = self.rnn(x, state)
        else:
            y, _ = self.rnn(x)
        return self.fc(y[:, -1])


class SeqLabeler(nn.Module):
    """A time-major LSTM (PyTorch's default layout) giving every step's output."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(4, 5)

    def forward(self, x):
        return self.rnn(x)[0]


class Conv1dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 6, 3, padding=1)
        self.pool = nn.MaxPool1d(2)
        self.avg = nn.AvgPool1d(2)
        self.fc = nn.Linear(6 * 2, 4)

    def forward(self, x):
        x = self.avg(self.pool(torch.relu(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


class UNet(nn.Module):
    """Two levels: ConvTranspose, bilinear and nearest upsampling, skip concatenations."""

    def __init__(self):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())

        self.e1, self.e2, self.e3 = block(3, 4), block(4, 8), block(8, 8)
        self.up1 = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.d2 = block(16, 8)
        self.d1 = block(12, 4)
        self.out = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        s1 = self.e1(x)
        s2 = self.e2(F.max_pool2d(s1, 2))
        b = self.e3(F.max_pool2d(s2, 2))
        u2 = self.d2(torch.cat([self.up1(b), s2], 1))
        u1 = F.interpolate(u2, scale_factor=2, mode="bilinear", align_corners=False)
        d1 = self.d1(torch.cat([u1, s1], 1))
        nearest = F.interpolate(F.avg_pool2d(d1, 2), scale_factor=2, mode="nearest")
        return self.out(d1 + nearest)


def calibrate(model, shape):
    """Batch-norm statistics from a few batches of data (not the default 0 and 1)."""
    model.train()
    with torch.no_grad():
        for _ in range(5):
            model(torch.randn(*shape) * 2 + 0.5)
    model.eval()
    return model


# -- export ---------------------------------------------------------------------------------------


def make_inputs(spec, batch, gen):
    out = []
    for kind, shape in spec:
        shape = tuple(batch if s == "B" else s for s in shape)
        if kind == "ids":
            out.append(torch.randint(0, 50, shape, generator=gen))
        elif kind == "mask":
            mask = torch.ones(shape, dtype=torch.int64)
            mask[:, -2:] = torch.randint(0, 2, (shape[0], 2), generator=gen)
            out.append(mask)
        else:
            out.append(torch.randn(*shape, generator=gen))
    return out


def export(name, model, spec, in_names, out_names, dyn, *, exporters, opset=17):
    model.eval()
    gen = torch.Generator().manual_seed(1)
    example = make_inputs(spec, 2, gen)
    written = []
    for exporter in exporters:
        fname = f"{name}_{exporter}.onnx"
        path = HERE / fname
        try:
            if exporter == "dynamo":
                shapes = {n: {a: torch.export.Dim.AUTO for a in axes} for n, axes in dyn.items()
                          if n in in_names}  # fmt: skip
                torch.onnx.export(
                    model, tuple(example), str(path), dynamo=True, opset_version=18,
                    input_names=in_names, output_names=out_names,
                    dynamic_shapes=tuple(shapes.get(n) for n in in_names), external_data=False,
                )  # fmt: skip
            else:
                torch.onnx.export(
                    model, tuple(example), str(path), dynamo=False, opset_version=opset,
                    input_names=in_names, output_names=out_names,
                    dynamic_axes={n: {a: f"{n}_{a}" for a in axes} for n, axes in dyn.items()},
                )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - recorded, the other exporter may work
            print(f"{fname}: export failed: {type(error).__name__}: {str(error)[:300]}")
            path.unlink(missing_ok=True)
            continue
        size = path.stat().st_size
        assert size < 1_000_000, (fname, size)
        written.append(fname)
        print(f"{fname}: {size / 1024:.0f} KiB")
    if not written:
        return []
    arrays = {}
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for batch in BATCHES:
            xs = make_inputs(spec, batch, gen)
            ys = model(*xs)
            ys = ys if isinstance(ys, tuple) else (ys,)
            for i, x in enumerate(xs):
                arrays[f"x{i}_b{batch}"] = x.numpy()
            for i, y in enumerate(ys):
                arrays[f"y{i}_b{batch}"] = y.numpy()
    if spec[0][0] == "float":  # torch's gradient in float64, w.r.t. the first input
        m64 = model.double()
        xs = [x.double() if x.is_floating_point() else x for x in make_inputs(spec, 2, gen)]
        xs[0].requires_grad_(True)
        y = m64(*xs)
        y = y[0] if isinstance(y, tuple) else y
        cot = torch.randn(y.shape, generator=gen, dtype=torch.float64)
        (grad,) = torch.autograd.grad((y * cot).sum(), xs[0])
        for i, x in enumerate(xs):
            arrays[f"grad_x{i}"] = x.detach().numpy()
        arrays["grad_cot"] = cot.numpy()
        arrays["grad_out"] = grad.numpy()
        model.float()
    np.savez_compressed(HERE / f"{name}.npz", **arrays)
    return written


def main():
    torch.manual_seed(0)
    made = {}
    both = ("torchscript", "dynamo")
    made["vit"] = export(
        "vit", vit(), [("float", ("B", 3, 16, 16))], ["image"], ["logits"],
        {"image": [0], "logits": [0]}, exporters=both)  # fmt: skip
    made["gpt2"] = export(
        "gpt2", GPT2(), [("ids", ("B", 10))], ["input_ids"], ["logits"],
        {"input_ids": [0, 1], "logits": [0, 1]}, exporters=both)  # fmt: skip
    made["bert"] = export(
        "bert", BERT(), [("ids", ("B", 8)), ("mask", ("B", 8))],
        ["input_ids", "attention_mask"], ["hidden", "pooled"],
        {"input_ids": [0, 1], "attention_mask": [0, 1], "hidden": [0, 1], "pooled": [0]},
        exporters=both)  # fmt: skip
    for kind in ("lstm", "gru"):
        for bi in (False, True):
            tag = f"{'bi' if bi else ''}{kind}"
            made[tag] = export(
                tag, RNNClassifier(kind, bi), [("float", ("B", 7, 4))], ["x"], ["y"],
                {"x": [0, 1], "y": [0]}, exporters=both)  # fmt: skip
        d = 2
        spec = [("float", ("B", 7, 4)), ("float", (d, "B", 6))]
        names = ["x", "h0"]
        if kind == "lstm":
            spec.append(("float", (d, "B", 6)))
            names.append("c0")
        made[f"bi{kind}_states"] = export(
            f"bi{kind}_states", RNNClassifier(kind, True, states=True), spec, names, ["y"],
            {"x": [0, 1], "h0": [1], "c0": [1], "y": [0]}, exporters=("torchscript",))  # fmt: skip
    made["lstm2"] = export(
        "lstm2", RNNClassifier("lstm", False, layers=2), [("float", ("B", 7, 4))], ["x"], ["y"],
        {"x": [0, 1], "y": [0]}, exporters=("torchscript",), opset=13)  # fmt: skip
    made["seqlstm"] = export(
        "seqlstm", SeqLabeler(), [("float", (6, "B", 4))], ["x"], ["y"],
        {"x": [0, 1], "y": [0, 1]}, exporters=("torchscript",))  # fmt: skip
    made["conv1d"] = export(
        "conv1d", Conv1dNet(), [("float", ("B", 3, 8))], ["x"], ["y"],
        {"x": [0], "y": [0]}, exporters=both, opset=13)  # fmt: skip
    made["unet"] = export(
        "unet", calibrate(UNet(), (4, 3, 16, 16)), [("float", ("B", 3, 16, 16))], ["x"], ["y"],
        {"x": [0], "y": [0]}, exporters=both)  # fmt: skip
    import onnx
    import torchvision
    import transformers

    versions = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
    }
    try:
        import onnxscript

        versions["onnxscript"] = onnxscript.__version__
    except ImportError:
        pass
    (HERE / "VERSIONS.txt").write_text("".join(f"{k}=={v}\n" for k, v in versions.items()))
    (HERE / "models.json").write_text(json.dumps(made, indent=1) + "\n")
    print(json.dumps(made))


if __name__ == "__main__":
    main()
