"""TrainingOptions(compilation_cache=...): JAX's persistent compilation cache across processes,
on by default in the user's cache folder from the first Network.initialize or trainnet (the suite
turns the default off in conftest.py)."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from helpers import run_python, unwritable_folder

import difffn as df
from difffn._network import compilation_cache as _compilation_cache

# The start of both scripts below: counts the cache hits JAX's monitoring events report and
# the misses it logs (jax_explain_cache_misses logs each persistent-cache miss).
LISTEN = """
import json, logging, sys
import jax, numpy as np
import difffn as df

events, misses = [], []
jax.monitoring.register_event_listener(lambda name, **kwargs: events.append(name))
jax.config.update("jax_explain_cache_misses", True)
handler = logging.Handler()
handler.emit = lambda record: misses.append(record.getMessage())
logging.getLogger("jax._src.compiler").addHandler(handler)
"""

# Trains a tiny network with the cache in argv[1]; prints the hits and misses.
TRAIN = (
    LISTEN
    + """
jax.jit(lambda x: x + 1)(1.0)  # compiled before the cache is on: trainnet must still turn it on
net = df.Network([df.layers.FeatureInput(2, name="in"), df.layers.FullyConnected(1, name="fc")])
X = np.arange(16, dtype=np.float32).reshape(8, 2) / 16
cache = {"default": {}}.get(sys.argv[1], {"compilation_cache": sys.argv[1]})
options = df.TrainingOptions(max_epochs=1, mini_batch_size=4, verbose=False, **cache)
net, info = df.trainnet(X, X[:, :1], net, "mse", options)
print(json.dumps({
    "hits": events.count("/jax/compilation_cache/cache_hits"),
    "misses": sum(m.startswith("PERSISTENT COMPILATION CACHE MISS") for m in misses),
    "dir": jax.config.jax_compilation_cache_dir,
    "max_size": jax.config.jax_compilation_cache_max_size,
    "loss": [float(v) for v in info.training_history["loss"]],
}))
"""
)


def _train(folder, env=None) -> dict:
    done = run_python(TRAIN, str(folder), timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_reads_what_the_first_compiled(tmp_path):
    folder = tmp_path / "cache" / "jax"  # missing: trainnet creates it
    folder.mkdir(parents=True)
    (folder / "old-cache").write_bytes(b"0" * 10)  # written by an unbounded run: no -atime file
    first = _train(folder)
    written = sorted(p.name for p in folder.iterdir())
    assert first["dir"] == str(folder)
    # bounded: JAX's LRU eviction is on, so it records each entry's last use (-atime files)
    assert first["max_size"] == _compilation_cache.MAX_SIZE_BYTES
    entries = [n.removesuffix("-cache") for n in written if n.endswith("-cache")]
    assert len(entries) > 1 and all(f"{e}-atime" in written for e in entries)
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
    with pytest.raises(df.OptionsError, match=r"compilation_cache=.*a-file', which is a file; it"):
        df.TrainingOptions(compilation_cache=file)
    with pytest.raises(df.OptionsError, match=r"compilation_cache=.* is not writable"):
        df.TrainingOptions(compilation_cache=file / "inside")
    with pytest.raises(df.OptionsError, match=r"compilation_cache=.* is not writable .*Fix"):
        df.TrainingOptions(compilation_cache=unwritable_folder(tmp_path) / "jax")
    with pytest.raises(
        df.OptionsError, match="must be 'auto', a folder path or None .off.; got int"
    ):
        df.TrainingOptions(compilation_cache=3)
    assert df.TrainingOptions().compilation_cache == "auto"
    assert df.TrainingOptions(compilation_cache=False).compilation_cache is None


def test_off_turns_the_cache_off_as_the_environment_variable_does(tmp_path, monkeypatch):
    # not a folder named "off" in the working directory (a benchmark once wrote one)
    monkeypatch.chdir(tmp_path)
    for off in ("off", "OFF", "none", "0"):
        assert df.TrainingOptions(compilation_cache=off).compilation_cache is None
    X, T = np.zeros((4, 3), np.float32), np.array([0, 1, 0, 1])
    net = df.Network([df.layers.FeatureInput(3), df.layers.FullyConnected(2), df.layers.Softmax()])
    options = df.TrainingOptions(
        max_epochs=1, mini_batch_size=4, verbose=False, compilation_cache="off"
    )
    df.trainnet(X, T, net.initialize(key=jax.random.key(0)), "crossentropy", options)
    assert list(tmp_path.iterdir()) == []
    options = df.TrainingOptions(compilation_cache=tmp_path / "new")
    assert options.compilation_cache == str(tmp_path / "new")
    assert not (tmp_path / "new").exists()  # made when training starts, not by the options
    assert "compilation_cache=" in repr(options)


def test_by_default_training_caches_in_the_users_cache_folder(tmp_path):
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    env = {"HOME": str(home), "XDG_CACHE_HOME": "", "DIFFFN_COMPILATION_CACHE": ""}
    first = _train("default", env)
    folder = home / ".cache" / "difffn" / "xla"
    assert first["dir"] == str(folder) and first["misses"] > 0
    assert any(p.name.endswith("-cache") for p in folder.iterdir())
    second = _train("default", env)
    assert second["misses"] == 0 and second["hits"] > 0 and second["loss"] == first["loss"]
    # XDG_CACHE_HOME moves it; DIFFFN_COMPILATION_CACHE=off turns it off
    env["XDG_CACHE_HOME"] = str(xdg)
    assert _train("default", env)["dir"] == str(xdg / "difffn" / "xla")
    off = _train("default", env | {"DIFFFN_COMPILATION_CACHE": "off"})
    assert off["dir"] is None and off["hits"] == 0


@pytest.fixture
def no_jax_cache():
    """JAX without a cache folder (this process's setting restored after the test)."""
    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    yield
    jax.config.update("jax_compilation_cache_dir", previous)


def test_auto_resolves_the_environment_then_xdg_then_home(tmp_path, monkeypatch, no_jax_cache):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("DIFFFN_COMPILATION_CACHE", raising=False)
    assert _compilation_cache.default_folder() == str(tmp_path / "home/.cache/difffn/xla")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: absolute only
    assert _compilation_cache.default_folder() == str(tmp_path / "home/.cache/difffn/xla")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _compilation_cache.resolve("auto") == str(tmp_path / "xdg/difffn/xla")
    assert (tmp_path / "xdg/difffn/xla").is_dir()
    assert _compilation_cache.resolve(None) is None
    assert _compilation_cache.resolve(str(tmp_path / "mine")) == str(tmp_path / "mine")
    for off in ("off", "OFF", "0", "false", "none"):
        monkeypatch.setenv("DIFFFN_COMPILATION_CACHE", off)
        assert _compilation_cache.resolve("auto") is None
        assert _compilation_cache.use("auto") is None
    monkeypatch.setenv("DIFFFN_COMPILATION_CACHE", str(tmp_path / "moved"))
    assert _compilation_cache.resolve("auto") == str(tmp_path / "moved")
    # a folder the user gave JAX is kept
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "users-own"))
    assert _compilation_cache.resolve("auto") is None


def test_a_bad_environment_variable_or_home_is_explained(tmp_path, monkeypatch, no_jax_cache):
    file = tmp_path / "a-file"
    file.write_text("")
    monkeypatch.setenv("DIFFFN_COMPILATION_CACHE", str(file))
    with pytest.raises(
        df.OptionsError,
        match=r"environment variable DIFFFN_COMPILATION_CACHE=.*a-file', which is a file.*"
        r"DIFFFN_COMPILATION_CACHE=off",
    ):
        _compilation_cache.resolve("auto")
    monkeypatch.setenv("DIFFFN_COMPILATION_CACHE", str(unwritable_folder(tmp_path) / "x"))
    with pytest.raises(df.OptionsError, match=r"DIFFFN_COMPILATION_CACHE=.*not writable.*Fix"):
        _compilation_cache.resolve("auto")
    # the default folder cannot be made: training goes on without the cache, with a warning
    monkeypatch.delenv("DIFFFN_COMPILATION_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(file))
    with pytest.warns(RuntimeWarning, match=r"default folder .*a-file.*cannot be made.*Fix"):
        assert _compilation_cache.resolve("auto") is None


def test_entries_of_an_unbounded_run_get_a_last_use(tmp_path):
    (tmp_path / "k1-cache").write_bytes(b"x")
    (tmp_path / "k2-cache").write_bytes(b"y")
    (tmp_path / "k2-atime").write_bytes((7).to_bytes(8, "little"))
    _compilation_cache._date_unused_entries(str(tmp_path))
    stamp = int.from_bytes((tmp_path / "k1-atime").read_bytes(), "little")
    assert stamp == os.stat(tmp_path / "k1-cache").st_mtime_ns
    assert int.from_bytes((tmp_path / "k2-atime").read_bytes(), "little") == 7


# Builds and initializes a network (no training) with the default option; prints what the
# initialization compiled or read back, and its learnables. With argv[1] == "then-off", a
# trainnet(compilation_cache=None) follows and the folder in use after it is printed.
INITIALIZE = (
    LISTEN
    + """
layers = [df.layers.ImageInput((8, 8, 3), name="in"), df.layers.Conv2D(3, 4, name="conv"),
          df.layers.BatchNorm(name="bn"), df.layers.ReLU(name="relu")]
net = df.Network(layers).initialize(key=jax.random.key(0))
result = {
    "hits": events.count("/jax/compilation_cache/cache_hits"),
    "misses": sum(m.startswith("PERSISTENT COMPILATION CACHE MISS") for m in misses),
    "dir": jax.config.jax_compilation_cache_dir,
    "learnables": {k: np.asarray(v).tolist() for k, v in net.learnables.items()},
}
if sys.argv[1] == "then-off":
    X = np.ones((4, 8, 8, 3), np.float32)
    options = df.TrainingOptions(max_epochs=1, mini_batch_size=4, verbose=False, compilation_cache=None)
    df.trainnet(X, np.ones((4, 6, 6, 4), np.float32), net, "mse", options)
    result["dir_after_off"] = jax.config.jax_compilation_cache_dir
print(json.dumps(result))
"""
)


def test_initialize_turns_the_cache_on_so_a_second_run_does_not_compile_it(tmp_path):
    # The initializers' program is the first compilation of a script: before, it ran before
    # trainnet turned the cache on and was compiled again by every run (seconds on a ResNet).
    folder = tmp_path / "cache"
    env = {"DIFFFN_COMPILATION_CACHE": str(folder)}
    first = run_python(INITIALIZE, "init", timeout=120, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    first = json.loads(first.stdout.strip().splitlines()[-1])
    assert first["dir"] == str(folder) and first["misses"] > 0 and first["hits"] == 0
    assert any(p.name.startswith("jit_initializers") for p in folder.iterdir())
    written = sorted(p.name for p in folder.iterdir())
    second = run_python(INITIALIZE, "init", timeout=120, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    second = json.loads(second.stdout.strip().splitlines()[-1])
    assert second["misses"] == 0 and second["hits"] > 0
    assert sorted(p.name for p in folder.iterdir()) == written
    assert second["learnables"] == first["learnables"]


def test_trainnet_with_the_cache_off_turns_off_what_initialize_turned_on(tmp_path):
    folder = tmp_path / "cache"
    done = run_python(
        INITIALIZE, "then-off", timeout=120, env={"DIFFFN_COMPILATION_CACHE": str(folder)}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["dir"] == str(folder) and result["dir_after_off"] is None
    # a folder the user gave JAX is theirs: neither initialize nor compilation_cache=None touch it
    users = tmp_path / "users-own"
    env = {"DIFFFN_COMPILATION_CACHE": str(folder), "JAX_COMPILATION_CACHE_DIR": str(users)}
    done = run_python(INITIALIZE, "then-off", timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["dir"] == str(users) and result["dir_after_off"] == str(users)


def test_use_none_turns_off_only_difffns_own_folder(tmp_path, no_jax_cache):
    folder = str(tmp_path / "ours")
    assert _compilation_cache.use(folder) == folder
    assert jax.config.jax_compilation_cache_dir == folder
    assert _compilation_cache.use("auto") is None  # a folder in use is kept
    assert jax.config.jax_compilation_cache_dir == folder
    assert _compilation_cache.use(None) is None
    assert jax.config.jax_compilation_cache_dir is None
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "users"))
    assert _compilation_cache.use(None) is None
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "users")


def test_messages_name_the_function_that_compiles(tmp_path, monkeypatch, no_jax_cache):
    file = tmp_path / "a-file"
    file.write_text("")
    monkeypatch.setenv("DIFFFN_COMPILATION_CACHE", str(file))
    net = df.Network([df.layers.FeatureInput(2), df.layers.FullyConnected(1)])
    with pytest.raises(
        df.OptionsError,
        match=r"^Network.initialize: the environment variable DIFFFN_COMPILATION_CACHE=.*a-file"
        r"', which is a file; it must be a folder. Fix: .*DIFFFN_COMPILATION_CACHE=off",
    ):
        net.initialize(key=jax.random.key(0))
