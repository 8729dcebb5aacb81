"""Loads fuzzed files in a subprocess of tests/test_fuzz_files.py, one after another.

``python tests/fuzz_worker.py KIND SECONDS BYTES FILE...`` limits its own address space to BYTES
(``RLIMIT_AS``, before anything is imported), loads each file as KIND (``network``,
``checkpoint``: a checkpoint folder, resumed by ``trainnet``; ``checkpoint-file``: a
single-file checkpoint of an earlier release; ``exported``, ``onnx``) within SECONDS
(``SIGALRM``) and prints one JSON line per file: ``{"file", "outcome", "detail"}`` with outcome ``ok`` (loaded), ``named`` (a
``df.Error``), ``hang`` (over its time) or ``raw`` (anything else); a file that kills the
process is the one whose ``start`` line has no outcome line. The networks the files are
made from (and the checkpointed run's data and options) are built here, so the test and the
worker use the same ones.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import warnings


def network():
    import difffn as df

    return df.Network(
        [
            df.layers.FeatureInput(4, normalization="none", name="in"),
            df.layers.FullyConnected(5, name="fc1"),
            df.layers.ReLU(name="relu"),
            df.layers.FullyConnected(3, name="fc2"),
            df.layers.Softmax(name="sm"),
        ]
    )


def data():
    """The data of the checkpointed run (resumed by ``checkpoint`` files)."""
    import numpy as np

    rng = np.random.default_rng(0)
    X = rng.normal(size=(16, 4)).astype(np.float32)
    T = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 16)]
    return X, T


def options(checkpoint_path=None):
    import difffn as df

    return df.TrainingOptions(
        "adam",
        max_epochs=1,
        mini_batch_size=8,
        verbose=False,
        checkpoint_path=checkpoint_path,
    )


def _old_network():
    """The network of the single-file checkpoint of an earlier release (tests/data/before_move)."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "data" / "before_move"))
    import make

    return make.network()


def _load(kind: str, path: str) -> None:
    import difffn as df

    if kind == "network":
        df.load(path, like=network())
    elif kind == "checkpoint":  # a checkpoint folder of this release: resumed, arrays and all
        from difffn._training import _checkpoint

        checkpoint = _checkpoint.find(path)
        checkpoint.history_rows()
        checkpoint.run_key  # noqa: B018 - restores the key from its checked payload
        df.trainnet(*data(), network(), "crossentropy", options(), resume_from=path)
    elif kind == "checkpoint-file":  # a single-file checkpoint of an earlier release
        from difffn._training import _checkpoint

        checkpoint = _checkpoint.find(path)
        checkpoint.history_rows()
        checkpoint.run_key  # noqa: B018 - restores the key from its checked payload
        df.load(path, like=_old_network())
    elif kind == "exported":
        model = df.load_exported(path)
        model(__import__("numpy").ones((2, 4), "float32"))
    elif kind == "onnx":
        df.import_onnx(path, max_tensor_bytes=1 << 26)
    else:
        raise SystemExit(f"unknown kind {kind!r}")


def _alarm(signum, frame):
    raise TimeoutError("the file took longer than its time limit")


def main(kind: str, paths: list[str], seconds: int) -> None:
    import difffn as df

    warnings.simplefilter("ignore")
    signal.signal(signal.SIGALRM, _alarm)
    for path in paths:
        print(json.dumps({"file": path, "outcome": "start"}), flush=True)
        signal.alarm(seconds)
        try:
            _load(kind, path)
            outcome, detail = "ok", ""
        except df.Error as error:
            outcome, detail = "named", f"{type(error).__name__}: {str(error)[:200]}"
        except TimeoutError as error:
            outcome, detail = "hang", str(error)
        except BaseException as error:  # noqa: BLE001 - what the test looks for
            outcome, detail = "raw", f"{type(error).__name__}: {str(error)[:300]}"
        finally:
            signal.alarm(0)
        print(json.dumps({"file": path, "outcome": outcome, "detail": detail}), flush=True)


if __name__ == "__main__":
    memory = int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    main(sys.argv[1], sys.argv[4:], int(sys.argv[2]))
