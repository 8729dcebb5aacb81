"""Fuzzed files of every kind end in a loaded model or a named error: never a raw exception, a
crash, a hang or an unbounded allocation.

Seeded variants of a ``df.save`` file, a ``trainnet`` checkpoint, a ``df.export`` file and an ONNX
model, each checksum recomputed (so the payload's own checks, not the checksum, must catch them):
payload fields deleted, retyped or replaced by hostile values (paths, ``/dev/zero``, PRNG names,
huge numbers, arrays of the wrong shape), payload bytes flipped or cut, and for ONNX protobuf
bytes flipped, tensor dims, types, external-data fields and node sizes crafted. Checkpoints are
of both kinds ``trainnet`` resumes: a checkpoint folder of this release (its orbax progress JSON
fuzzed like a payload or flipped, one of orbax's array or metadata files flipped or cut, each
with the folder's manifest of checksums recomputed; or the manifest itself crafted: names of
files outside the folder, hostile sizes, flipped bytes), resumed by ``trainnet`` (arrays and
all); and a single-file checkpoint of an earlier release (``tests/data/before_move``). They are loaded
in subprocesses (``tests/fuzz_worker.py``) under a memory limit (``RLIMIT_AS``) with a time limit
per file.

Not fuzzed: the StableHLO bytecode inside an exported file with its checksum recomputed. JAX's
deserializer is not hardened against crafted bytecode (it can crash or hang the process); the
documented trust boundary (docs/persistence.md) is that exported files are loaded only from
trusted sources. The bytecode's fields around it (every other field, its type) are fuzzed.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import fuzz_worker
import jax
import numpy as np
import pytest

import difffn as df
from difffn._persistence import container

WORKER = Path(__file__).with_name("fuzz_worker.py")
BEFORE = Path(__file__).parent / "data" / "before_move" / "checkpoints"
MEMORY = 3 << 30  # bytes of address space per worker: JAX's own needs, far below a runaway
SECONDS = 20  # per file

HOSTILE = [
    None,
    True,
    -1,
    0,
    2**62,
    -(2**63),
    1e308,
    float("nan"),
    "",
    "../../../etc/passwd",
    "/dev/zero",
    "os.system",
    "net_history__0000000000000000.difffnlog",
    "net_history__0000000000000000.jsonl",
    "BSSSSSSSSC",
    [],
    {},
    [1, 2, 3],
    [[-5, 2**40]],
    {"a": 1},
    b"\x00" * 8,
    np.zeros((0,), np.float32),
    np.zeros((3, 3), np.int8),
    np.zeros((2,), np.uint32),
    np.zeros((4,), np.uint32),
]


def _paths(tree, prefix=()):
    yield prefix
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for n, value in enumerate(tree[:6]):
            yield from _paths(value, (*prefix, n))


def _mutate_payload(payload, rng: random.Random, *, keep=()):
    payload = copy.deepcopy(payload)
    paths = [p for p in _paths(payload) if p and not (set(p) & set(keep))]
    for _ in range(rng.choice((1, 1, 2, 3))):
        path = rng.choice(paths)
        parent = payload
        for key in path[:-1]:
            parent = parent[key]
        last = path[-1]
        action = rng.random()
        if action < 0.2 and isinstance(parent, dict):
            parent.pop(last, None)
        elif action < 0.3:
            parent[last] = [parent[last]]
        else:
            parent[last] = rng.choice(HOSTILE)
        paths = [p for p in _paths(payload) if p and not (set(p) & set(keep))]
    return payload


def _write_raw(path: Path, kind: str, data: bytes) -> None:
    """A container holding ``data`` as its payload bytes, with the checksum recomputed."""
    header = container._HEADER.pack(
        container.MAGIC,
        container.VERSION,
        kind.encode().ljust(16, b"\0"),
        len(data),
        hashlib.sha256(data).digest(),
    )
    path.write_bytes(header + data)


def _flip(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    action = rng.random()
    if action < 0.2:
        return bytes(data[: rng.randrange(len(data))])
    for _ in range(rng.choice((1, 2, 8))):
        at = rng.randrange(len(data))
        data[at] = rng.choice(
            (0x00, 0xFF, 0xDB, 0xDD, 0xC6, 0xC7, data[at] ^ (1 << rng.randrange(8)))
        )
    return bytes(data)


def _container_variants(base: Path, kind: str, out: Path, count: int, seed: int, *, raw=True):
    payload = container.read(base, kind)
    keep = ("exported",) if kind == "exported" else ()
    codec = container.msgpack_codec()
    rng = random.Random(seed)
    files = []
    for n in range(count):
        path = out / f"{kind}_{n}.difffn"
        if raw and n % 3 == 2:
            _write_raw(path, kind, _flip(codec.msgpack_serialize(payload), rng))
        else:
            mutated = _mutate_payload(payload, rng, keep=keep)
            try:
                container.write(path, kind, mutated)
            except Exception:  # noqa: BLE001 - msgpack cannot hold this mutation: another
                mutated = _mutate_payload(payload, rng, keep=keep)
                container.write(path, kind, {"format": mutated.get("format"), "x": 1})
        files.append(path)
    return files


def _onnx_variants(base: Path, out: Path, count: int, seed: int):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(base))
    data = model.SerializeToString()
    rng = random.Random(seed)
    (out / "w.bin").write_bytes(b"\x01" * 64)
    files = []
    for n in range(count):
        path = out / f"onnx_{n}.onnx"
        action = n % 6
        if action == 0:
            path.write_bytes(_flip(data, rng))
            files.append(path)
            continue
        m = copy.deepcopy(model)
        inits = list(m.graph.initializer)
        tensor = rng.choice(inits)
        if action == 1:  # dims that do not fit the data, or are huge / negative
            del tensor.dims[:]
            tensor.dims.extend(rng.choice(([2**40, 2**40], [-3, 4], [7], [1] * 9, [0])))
        elif action == 2:  # another element type for the same bytes
            tensor.data_type = rng.choice((0, 2, 3, 7, 8, 9, 10, 11, 16, 25, 99))
        elif action == 3:  # external data, crafted
            tensor.ClearField("raw_data")
            del tensor.float_data[:]
            tensor.data_location = TensorProto.EXTERNAL
            location = rng.choice(("w.bin", "../w.bin", "/dev/zero", "missing.bin", "", "w.bin"))
            entries = {"location": location}
            if rng.random() < 0.7:
                entries["offset"] = str(rng.choice((0, 8, -4, 2**62, "x")))
            if rng.random() < 0.7:
                entries["length"] = str(rng.choice((0, 16, 64, 2**40, -1)))
            for key, value in entries.items():
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
        elif action == 4:  # a node that asks for a huge or inconsistent tensor
            op = rng.choice(("ConstantOfShape", "Expand", "Range", "Tile"))
            big = rng.choice(([2**20, 2**20, 2**10], [-1, 3], [2**62], [3, 0, 2**31]))
            m.graph.initializer.append(numpy_helper.from_array(np.array(big, np.int64), "big"))
            m.graph.initializer.append(numpy_helper.from_array(np.ones(1, np.float32), "one"))
            if op == "ConstantOfShape":
                node = helper.make_node(op, ["big"], ["huge"])
            elif op == "Range":
                for name, value in (("r0", 0.0), ("r1", float(big[0])), ("r2", 1e-9)):
                    m.graph.initializer.append(
                        numpy_helper.from_array(np.array(value, np.float32), name)
                    )
                node = helper.make_node(op, ["r0", "r1", "r2"], ["huge"])
            else:
                node = helper.make_node(op, ["one", "big"], ["huge"])
            m.graph.node.insert(0, node)
            first = m.graph.node[1]
            first.input[0] = "huge" if rng.random() < 0.5 else first.input[0]
        else:  # attributes out of range, mis-typed inputs
            node = rng.choice(list(m.graph.node))
            if node.attribute and rng.random() < 0.5:
                attribute = rng.choice(list(node.attribute))
                attribute.i = rng.choice((-(2**40), 2**40, 0))
                attribute.type = onnx.AttributeProto.INT
            else:
                cast = numpy_helper.from_array(np.ones(tuple(tensor.dims), np.int64), tensor.name)
                tensor.CopyFrom(cast)
        path.write_bytes(m.SerializeToString())
        files.append(path)
    return files


def _plain(value):
    """JSON for what the hostile values hold that JSON has no type for."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    raise TypeError(type(value).__name__)


def _reseal(checkpoint: Path) -> None:
    """Write the checkpoint folder's manifest again as the writer does (the size and SHA-256 of
    every file, sealed by the SHA-256 of that listing): the content's own checks must catch a
    change."""
    listing = {}
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        name = path.relative_to(checkpoint).as_posix()
        if name != MANIFEST:
            data = path.read_bytes()
            listing[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _write_manifest(checkpoint, {"format": "difffn.checkpoint-manifest", "files": listing})


def _write_manifest(checkpoint: Path, body) -> None:
    if isinstance(body, dict):  # sealed over whatever its files are, so the seal passes
        files = body.get("files")
        text = json.dumps(files, sort_keys=True, default=_plain)
        body = {**body, "seal": hashlib.sha256(text.encode()).hexdigest()}
    (checkpoint / MANIFEST).write_text(json.dumps(body, default=_plain))


MANIFEST = "difffn_manifest.json"
PROGRESS = "progress/metadata"  # orbax's JsonSave of the progress item
OUTSIDE = ["../../../etc/passwd", "/etc/passwd", "/dev/zero", "..", "progress", "../x", "a/../b"]


def _folder_variants(base: Path, out: Path, count: int, seed: int) -> list[Path]:
    """Copies of the checkpoint folder ``base``, one file changed in each, the manifest
    recomputed unless the manifest itself is what is fuzzed: by ``n % 5``, 0 and 1: the progress
    JSON's fields (deleted, retyped, hostile values); 2: the progress JSON's bytes (flipped,
    cut); 3: one of orbax's array or metadata files (flipped, cut); 4: the manifest, its fields
    (a listed name a path outside the folder, sizes and checksums hostile; sealed again) or its
    bytes (flipped, not sealed again)."""
    progress = json.loads((base / PROGRESS).read_text())
    rng = random.Random(seed)
    files = []
    for n in range(count):
        target = out / f"folder_{n}" / base.name
        shutil.copytree(base, target)
        action = n % 5
        if action in (0, 1):
            mutated = _mutate_payload(progress, rng)
            (target / PROGRESS).write_text(json.dumps(mutated, default=_plain))
        elif action == 2:
            (target / PROGRESS).write_bytes(_flip((target / PROGRESS).read_bytes(), rng))
        elif action == 3:
            others = sorted(
                p for p in target.rglob("*") if p.is_file() and p.name not in (MANIFEST, "metadata")
            )
            chosen = rng.choice(others)
            chosen.write_bytes(_flip(chosen.read_bytes(), rng))
        if action != 4:
            _reseal(target)
        elif rng.random() < 0.3:
            (target / MANIFEST).write_bytes(_flip((target / MANIFEST).read_bytes(), rng))
        else:
            manifest = json.loads((target / MANIFEST).read_text())
            if rng.random() < 0.5:  # a file outside the folder listed, the rest intact
                name = rng.choice(OUTSIDE)
                manifest["files"][name] = {"size": rng.choice((0, 4, 2**40)), "sha256": "0" * 64}
            else:
                manifest = _mutate_payload(manifest, rng)
            _write_manifest(target, manifest)
        files.append(target)
    return files


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    folder = tmp_path_factory.mktemp("originals")
    net = fuzz_worker.network().initialize(key=jax.random.key(0))
    df.save(folder / "net.difffn", net)
    df.export(net, df.Layout((None, 4), "BC"), folder / "net.export.difffn")
    df.export_onnx(net, df.Layout((None, 4), "BC"), folder / "net.onnx")
    df.trainnet(
        *fuzz_worker.data(),
        fuzz_worker.network(),
        "crossentropy",
        fuzz_worker.options(folder),
        key=jax.random.key(1),
    )
    (checkpoint,) = (p for p in folder.iterdir() if p.name.startswith("net_checkpoint__"))
    return {
        "network": folder / "net.difffn",
        "checkpoint": checkpoint,  # a folder (orbax, with its manifest)
        "log": next(folder.glob("net_history__*.jsonl")),
        "checkpoint-file": next(BEFORE.glob("net_checkpoint__*.difffn")),  # an earlier release's
        "old-log": next(BEFORE.glob("net_history__*.difffnlog")),
        "exported": folder / "net.export.difffn",
        "onnx": folder / "net.onnx",
    }


def _start(kind: str, files: list[Path]) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), kind, str(SECONDS), str(MEMORY), *map(str, files)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(process: subprocess.Popen, files: list[Path]) -> tuple[dict, list[Path]]:
    """Outcomes by file, and the files left when a worker died (after its culprit)."""
    try:
        stdout, stderr = process.communicate(timeout=SECONDS * 2 + 20 * len(files))
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    outcomes, started = {}, None
    for line in stdout.splitlines():
        record = json.loads(line)
        if record["outcome"] == "start":
            started = record["file"]
        else:
            outcomes[record["file"]] = (record["outcome"], record["detail"])
            started = None
    if started is None:
        return outcomes, []
    outcomes[started] = ("crash", f"exit {process.returncode}: {stderr[-300:]}")
    rest = files[[str(f) for f in files].index(started) + 1 :]
    return outcomes, rest


def _run_all(batches: dict[str, list[Path]]) -> dict[str, tuple[str, str]]:
    outcomes: dict[str, tuple[str, str]] = {}
    pending = dict(batches)
    while pending:
        running = {kind: (_start(kind, files), files) for kind, files in pending.items()}
        pending = {}
        for kind, (process, files) in running.items():
            found, rest = _finish(process, files)
            outcomes.update(found)
            if rest:
                pending[kind] = rest
    return outcomes


@pytest.mark.slow
def test_fuzzed_files_load_or_end_in_a_named_error(originals, tmp_path):
    batches = {
        "network": _container_variants(originals["network"], "network", tmp_path, 60, seed=1),
        "exported": _container_variants(
            originals["exported"], "exported", tmp_path, 40, seed=3, raw=False
        ),
        "onnx": _onnx_variants(originals["onnx"], tmp_path, 72, seed=4),
    }
    # checkpoints are found in their folder with the history log beside them: a folder of
    # this release's, and a single file of an earlier release's
    batches["checkpoint"] = _folder_variants(originals["checkpoint"], tmp_path, 45, seed=2)
    for variant in batches["checkpoint"]:
        os.link(originals["log"], variant.parent / originals["log"].name)
    files = _container_variants(originals["checkpoint-file"], "checkpoint", tmp_path, 30, seed=5)
    batches["checkpoint-file"] = []
    for n, variant in enumerate(files):
        one = tmp_path / f"file_{n}"
        one.mkdir()
        target = one / originals["checkpoint-file"].name
        variant.rename(target)
        (one / originals["old-log"].name).write_bytes(originals["old-log"].read_bytes())
        batches["checkpoint-file"].append(target)
    kinds = {str(f): kind for kind, files in batches.items() for f in files}
    first = {kind: batches[kind] for kind in ("network", "exported", "checkpoint-file")}
    outcomes = _run_all(first)
    outcomes.update(_run_all({kind: batches[kind] for kind in ("onnx", "checkpoint")}))
    assert set(outcomes) == set(kinds)
    bad = {f: o for f, o in outcomes.items() if o[0] not in ("ok", "named")}
    assert not bad, "files that did not end in a loaded model or a named error:\n" + "\n".join(
        f"{kinds[f]} {Path(f).name}: {o[0]}: {o[1]}" for f, o in sorted(bad.items())
    )
    counts = {k: [o[0] for f, o in outcomes.items() if kinds[f] == k] for k in batches}
    print({k: {o: v.count(o) for o in set(v)} for k, v in counts.items()})
    for kind in batches:  # the mutations reach the checks: most variants are refused
        refused = [f for f, o in outcomes.items() if kinds[f] == kind and o[0] == "named"]
        assert len(refused) > len(batches[kind]) // 2, kind
