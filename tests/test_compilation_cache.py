"""TrainingOptions(compilation_cache=...): JAX's persistent compilation cache across processes."""

from __future__ import annotations

import json

import pytest
from helpers import run_python, unwritable_folder

import difffn as df

# Trains a tiny network with the cache in argv[1]; prints the cache hits JAX's monitoring events
# counted and the misses it logged (jax_explain_cache_misses logs each persistent-cache miss).
TRAIN = """
import json, logging, sys
import jax, numpy as np
import difffn as df

events, misses = [], []
jax.monitoring.register_event_listener(lambda name, **kwargs: events.append(name))
jax.config.update("jax_explain_cache_misses", True)
handler = logging.Handler()
handler.emit = lambda record: misses.append(record.getMessage())
logging.getLogger("jax._src.compiler").addHandler(handler)
jax.jit(lambda x: x + 1)(1.0)  # compiled before the cache is on: trainnet must still turn it on
net = df.Network([df.layers.FeatureInput(2, name="in"), df.layers.FullyConnected(1, name="fc")])
X = np.arange(16, dtype=np.float32).reshape(8, 2) / 16
options = df.TrainingOptions(
    max_epochs=1, mini_batch_size=4, verbose=False, compilation_cache=sys.argv[1]
)
net, info = df.trainnet(X, X[:, :1], net, "mse", options)
print(json.dumps({
    "hits": events.count("/jax/compilation_cache/cache_hits"),
    "misses": sum(m.startswith("PERSISTENT COMPILATION CACHE MISS") for m in misses),
    "dir": jax.config.jax_compilation_cache_dir,
    "loss": [float(v) for v in info.training_history["loss"]],
}))
"""


def _train(folder) -> dict:
    done = run_python(TRAIN, str(folder), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_reads_what_the_first_compiled(tmp_path):
    folder = tmp_path / "cache" / "jax"  # missing: trainnet creates it
    first = _train(folder)
    written = sorted(p.name for p in folder.iterdir())
    assert first["dir"] == str(folder)
    assert first["misses"] > 0 and first["hits"] == 0
    assert written, "the first process wrote nothing to the cache"

    second = _train(folder)
    # Every program the second process needed was in the cache: nothing compiled, nothing new.
    assert second["misses"] == 0 and second["hits"] > 0
    assert sorted(p.name for p in folder.iterdir()) == written
    assert second["loss"] == first["loss"]


def test_the_option_is_validated(tmp_path):
    file = tmp_path / "a-file"
    file.write_text("")
    with pytest.raises(df.OptionsError, match=r"compilation_cache must be a folder; .* is a file"):
        df.TrainingOptions(compilation_cache=file)
    with pytest.raises(df.OptionsError, match=r"compilation_cache=.* is not writable"):
        df.TrainingOptions(compilation_cache=file / "inside")
    with pytest.raises(df.OptionsError, match=r"compilation_cache=.* is not writable .*Fix"):
        df.TrainingOptions(compilation_cache=unwritable_folder(tmp_path) / "jax")
    with pytest.raises(df.OptionsError, match="must be a folder path or None; got int"):
        df.TrainingOptions(compilation_cache=3)
    options = df.TrainingOptions(compilation_cache=tmp_path / "new")
    assert options.compilation_cache == str(tmp_path / "new")
    assert not (tmp_path / "new").exists()  # made when training starts, not by the options
    assert "compilation_cache=" in repr(options)
