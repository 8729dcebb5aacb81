"""Loads fuzzed files in a subprocess of tests/test_fuzz_files.py, one after another.

``python tests/fuzz_worker.py KIND SECONDS BYTES FILE...`` limits its own address space to BYTES
(``RLIMIT_AS``, before anything is imported), loads each file as KIND (``network``,
``checkpoint``, ``exported``, ``onnx``) within SECONDS (``SIGALRM``) and prints one JSON line
per file: ``{"file", "outcome", "detail"}`` with outcome ``ok`` (loaded), ``named`` (a
``df.Error``), ``hang`` (over its time) or ``raw`` (anything else); a file that kills the
process is the one whose ``start`` line has no outcome line. The networks the files are
made from are built here, so the test and the worker use the same ones.
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


def _load(kind: str, path: str) -> None:
    import difffn as df

    if kind == "network":
        df.load(path, like=network())
    elif kind == "checkpoint":
        from difffn._training import _checkpoint

        checkpoint = _checkpoint.find(path)
        checkpoint.history_rows()
        checkpoint.run_key  # noqa: B018 - restores the key from its checked payload
        df.load(path, like=network())
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
