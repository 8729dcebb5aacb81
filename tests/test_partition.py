"""Parameter sharding over the mesh (``TrainingOptions(parameter_sharding=..., mesh_shape=...)``
and ``df.learnable(sharding=P(...))``), in a subprocess with 4 host devices, against replicated
training; the fsdp spec rule in-process."""

from __future__ import annotations

import json

import pytest
from helpers import run_python
from jax.sharding import PartitionSpec as P

import difffn as df
from difffn._devices._partition import bytes_sent_per_step, fsdp_spec

CODE = r"""
import json, re, jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
import difffn as df
from difffn._training import _step
from difffn._devices._partition import bytes_per_device

# The compiled step's HLO of a run (its first step), to count the collectives' bytes.
compiled, current = {}, [None]
step_of = _step.Steps.step


def recording_step(self, spec):
    fn = step_of(self, spec)

    def step(*args):
        if current[0] is not None and current[0] not in compiled:
            compiled[current[0]] = fn.lower(*args).compile().as_text()
        return fn(*args)

    return step


_step.Steps.step = recording_step
COLLECTIVE = re.compile(
    r"= (.+?) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)\("
)
ITEM = {"f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "f64": 8, "pred": 1}


def collectives(text):
    # {collective: [bytes of each whole (unsplit) non-scalar array it moves], "scalars": n}
    found = {"scalars": 0}
    for line in text.splitlines():
        match = COLLECTIVE.search(line)
        if not match:
            continue
        shape, op = match.groups()
        for dtype, dims in re.findall(r"([a-z]+[0-9]*)\[([0-9,]*)\]", shape):
            if not dims:
                found["scalars"] += 1
                continue
            size = int(np.prod([int(d) for d in dims.split(",")])) * ITEM[dtype]
            if op == "reduce-scatter":  # its result is one device's part of the whole
                size *= 4
            found.setdefault(op, []).append(size)
    return found

assert len(jax.devices()) == 4, jax.devices()
rng = np.random.default_rng(0)
T = rng.integers(0, 4, size=64).astype(np.int32)
X = (rng.normal(size=(4, 8))[T] * 2 + rng.normal(size=(64, 8))).astype(np.float32)


class ModelParallel(df.Layer):
    # a layer naming its own layout: the columns of its weights split over "model"
    size: int = 4
    weights: jax.Array | None = df.learnable(default=None, sharding=P(None, "model"))

    def initialize(self, layout, *, key):
        c = layout.size("C")
        return self.replace(weights=jax.random.normal(key, (c, self.size)) / np.sqrt(c))

    def predict(self, x):
        return x @ self.weights


def network(own=False):
    L = df.layers
    last = ModelParallel(4, name="mp") if own else L.FullyConnected(4, name="fc2")
    return df.Network([L.FeatureInput(8), L.FullyConnected(16, name="fc1"), L.ReLU(), last,
                       L.Softmax()])


def train(own=False, **extra):
    settings = dict(max_epochs=2, mini_batch_size=16, verbose=False,
                    execution_environment="multi-device")
    options = df.TrainingOptions("adam", **{**settings, **extra})
    return df.trainnet(X, T, network(own), "crossentropy", options, key=jax.random.key(3))[0]


def diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a.learnables), jax.tree.leaves(b.learnables)))


def held(net):
    per_device = bytes_per_device(list(net.learnables.values()))
    total = sum(np.asarray(v).nbytes for v in net.learnables.values())
    return sorted(per_device.values()), total


current[0] = "replicated"
replicated = train()
current[0] = "fsdp"
fsdp = train(parameter_sharding="fsdp")
current[0] = None
own_replicated = train(own=True, mesh_shape={"data": 2, "model": 2})
own = train(own=True, mesh_shape={"data": 2, "model": 2}, parameter_sharding="fsdp")
result = {
    "fsdp_diff": diff(replicated, fsdp),
    "own_diff": diff(own_replicated, own),
    "replicated_bytes": held(replicated),
    "fsdp_bytes": held(fsdp),
    "fsdp_specs": {k: str(v.sharding.spec) for k, v in fsdp.learnables.items()},
    "own_spec": str(own.learnables["mp/weights"].sharding.spec),
    "collectives": {mode: collectives(text) for mode, text in compiled.items()},
}
errors = {}
for name, mesh, spec in [("axis", {"data": 4}, P(None, "tensor")),
                         ("divide", {"data": 1, "model": 4}, P("model", None)),
                         ("mesh", {"data": 3}, None)]:
    class Bad(ModelParallel):
        weights: jax.Array | None = df.learnable(default=None, sharding=spec)
    net = df.Network([df.layers.FeatureInput(6), Bad(4, name="bad"), df.layers.Softmax()])
    options = df.TrainingOptions(verbose=False, mini_batch_size=16, mesh_shape=mesh,
                                 execution_environment="multi-device")
    try:
        df.trainnet(X[:, :6], T, net, "crossentropy", options, key=jax.random.key(0))
    except df.OptionsError as error:
        errors[name] = str(error)
result["errors"] = errors
print("RESULT" + json.dumps(result))
"""


@pytest.fixture(scope="module")
def result():
    completed = run_python(CODE, devices=4, timeout=400)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    line = next(x for x in completed.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


@pytest.mark.multidevice
def test_fsdp_holds_a_quarter_of_every_learnable_per_device(result):
    per_device, total = result["fsdp_bytes"]
    assert per_device == [total // 4] * 4  # every learnable here has a dimension 4 divides
    replicated, total_r = result["replicated_bytes"]
    assert replicated == [total_r] * 4 and total_r == total


@pytest.mark.multidevice
def test_fsdp_splits_the_largest_divisible_axis(result):
    specs = result["fsdp_specs"]
    assert specs["fc1/weights"] == str(fsdp_spec((8, 16), 4))  # (inputs, outputs)
    assert all("data" in s for s in specs.values()), specs


@pytest.mark.multidevice
def test_sharded_training_equals_replicated_training(result):
    assert result["fsdp_diff"] < 1e-5
    assert result["own_diff"] < 1e-5


@pytest.mark.multidevice
def test_a_layer_names_its_own_partition_spec(result):
    assert result["own_spec"] == str(P(None, "model"))


@pytest.mark.multidevice
def test_bad_specs_and_meshes_are_named_errors(result):
    errors = result["errors"]
    assert "names the mesh axis 'tensor'" in errors["axis"] and "Fix" in errors["axis"]
    assert "does not divide" in errors["divide"] and "'bad/weights'" in errors["divide"]
    assert "mesh_shape" in errors["mesh"] and "4 devices" in errors["mesh"]


@pytest.mark.multidevice
def test_the_bytes_formula_matches_the_compiled_steps_collectives(result):
    # B: the float32 learnables; N = 4 data-parallel devices. The compiled step's collectives,
    # each array counted whole, priced by the ring costs, are the formula of docs/scaling.md.
    _, learnable_bytes = result["replicated_bytes"]
    ring = {"all-reduce": 2 * 3 / 4, "all-gather": 3 / 4, "reduce-scatter": 3 / 4}
    for mode in ("replicated", "fsdp"):
        found = result["collectives"][mode]
        assert found.pop("scalars") <= 2, found  # the loss (and a metric): a few bytes
        assert set(found) <= set(ring), found  # no all-to-all or permutes: pure data parallel
        sent = {op: ring[op] * sum(sizes) for op, sizes in found.items()}
        expected = bytes_sent_per_step(
            learnable_bytes, 4, mode, reduce_scatter="reduce-scatter" in found
        )
        assert sent == pytest.approx(expected), (mode, found)
    # replicated: exactly the gradients, once; fsdp: the parameters gathered once (kept for the
    # backward) and the gradients reduced once
    assert sum(result["collectives"]["replicated"]["all-reduce"]) == learnable_bytes
    assert sum(result["collectives"]["fsdp"]["all-gather"]) == learnable_bytes


@pytest.mark.parametrize(
    ("shape", "parts", "spec"),
    [((6, 8), 4, P(None, "data")), ((3,), 4, P()), ((12, 8), 4, P("data")), ((5, 5), 1, P())],
)
def test_fsdp_spec(shape, parts, spec):
    assert fsdp_spec(shape, parts) == spec


def test_learnable_sharding_must_be_a_partition_spec():
    with pytest.raises(df.LayerError, match=r"takes a jax.sharding.PartitionSpec; got tuple"):
        df.learnable(sharding=(None, "model"))
