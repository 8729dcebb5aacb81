"""``TrainingOptions(steps_per_execution=...)``: several iterations per compiled call.

The same run with one iteration per call is the reference: the losses, metrics and trained
learnables agree; the calls end where trainnet acts on the state (rows of one call share its
``time_elapsed``); a step whose convolutions XLA:CPU would compile slowly in a loop runs one
iteration per call; and the option's errors.
"""

from __future__ import annotations

import collections
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df
from difffn._training import _chunk, _step

L = df.layers


def _digits(n=480):
    X, T, _, _ = df.data.digits()
    return X[:n], T[:n]


def _cnn(normalization="zerocenter") -> df.Network:
    return df.Network(
        [
            L.ImageInput((8, 8, 1), normalization=normalization, name="input"),
            L.Conv2D(3, 8, padding="same", name="conv1"),
            L.BatchNorm(name="bn"),
            L.ReLU(name="relu"),
            L.Conv2D(3, 8, stride=2, padding="same", name="conv2"),
            L.ReLU(name="relu2"),
            L.FullyConnected(10, name="fc"),
            L.Softmax(name="softmax"),
        ]
    )


def _options(**more):
    base = dict(
        max_epochs=2, mini_batch_size=32, verbose=False, shuffle="every-epoch", metrics="accuracy"
    )
    return df.TrainingOptions(**{**base, **more})


def _train(net, X, T, **more):
    return df.trainnet(X, T, net, "crossentropy", _options(**more), key=jax.random.key(3))


def _calls(info) -> list[list[int]]:
    """The iterations of each call: consecutive rows that share their time_elapsed."""
    rows = info.training_history
    groups = itertools.groupby(zip(rows["time_elapsed"], rows["iteration"]), key=lambda r: r[0])
    return [[int(i) for _, i in group] for _, group in groups]


def _assert_same_run(net, info, net_one, info_one):
    """A run and its one-iteration-per-call reference agree: history, learnables, state."""
    for name in ("loss", "accuracy", "learn_rate", "iteration", "epoch"):
        np.testing.assert_allclose(
            info.training_history[name], info_one.training_history[name], rtol=1e-5,
            atol=1e-6, err_msg=name,
        )  # fmt: skip
    assert_tree_allclose(net.learnables, net_one.learnables, rtol=1e-5, atol=1e-6)
    assert_tree_allclose(net.state, net_one.state, rtol=1e-5, atol=1e-6)


def test_the_same_run_as_one_iteration_per_call():
    X, T = _digits()
    net = _cnn()
    # "warmup" changes the learn rate every iteration for 8 iterations, inside the calls too
    warm = dict(learn_rate_schedule="warmup", learn_rate_schedule_settings={"num_steps": 8})
    one, info_one = _train(net, X, T, steps_per_execution=1, **warm)
    many, info_many = _train(net, X, T, steps_per_execution=4, validation_data=(X[:64], T[:64]),
                             validation_frequency=6, **warm)  # fmt: skip
    _, info_valid = _train(net, X, T, steps_per_execution=1, validation_data=(X[:64], T[:64]),
                           validation_frequency=6, **warm)  # fmt: skip
    rates = np.asarray(info_many.training_history["learn_rate"])
    assert len(set(rates[1:5].tolist())) == 4  # four learn rates inside the call [2, 3, 4, 5]
    _assert_same_run(many, info_many, one, info_one)
    np.testing.assert_allclose(
        info_many.validation_history["loss"], info_valid.validation_history["loss"], rtol=1e-5
    )
    # 15 iterations per epoch: the first alone, then calls of 4 cut at the validation every 6
    # iterations and at the end of each epoch
    assert _calls(info_many) == [
        [1], [2, 3, 4, 5], [6], [7, 8, 9, 10], [11, 12], [13, 14, 15],
        [16, 17, 18], [19, 20, 21, 22], [23, 24], [25, 26, 27, 28], [29, 30],
    ]  # fmt: skip
    assert len(_calls(info_one)) == 30


def test_auto_runs_several_iterations_per_call_on_one_cpu_device(caplog, monkeypatch):
    X, T = _digits(32 * 40)
    monkeypatch.setattr(_step, "_CACHE", collections.OrderedDict())  # no other test's steps
    with jax.log_compiles(), caplog.at_level("WARNING"):
        _, info = _train(_cnn(), X, T, max_epochs=1, verbose_frequency=25)
    compiled = [
        r for r in caplog.records if "XLA compilation of jit(train_steps)" in r.getMessage()
    ]
    if jax.default_backend() == "cpu":  # compiled once to read its layouts; jit reuses it
        assert len(compiled) == 1, [r.getMessage() for r in compiled]
    expected = [[1], list(range(2, 18)), list(range(18, 26)), list(range(26, 41))]
    assert _calls(info) == (expected if jax.default_backend() == "cpu" else [[i] for i in
                                                                            range(1, 41)])  # fmt: skip


class LaxConv(df.Layer):
    """A user's own convolution, written with ``jax.lax``: its gradients are not in the layout
    XLA:CPU's kernels take, so a loop would run them slowly."""

    weights: jax.Array | None = df.learnable(default=None)

    def initialize(self, layout, *, key):
        return self.replace(weights=0.1 * jax.random.normal(key, (3, 3, layout.size("C"), 4)))

    def predict(self, x):
        fmt = getattr(x, "format", None)
        assert fmt in (None, "BSSC"), fmt
        y = jax.lax.conv_general_dilated(
            df.stripdims(x),
            self.weights,
            (1, 1),
            "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )
        return y if fmt is None else df.dlarray(y, fmt)


CPU_ONLY = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's layouts")


@CPU_ONLY
def test_a_step_with_a_slow_convolution_in_loops_runs_one_iteration_per_call():
    X, T = _digits(32 * 6)
    net = df.Network(
        [
            L.ImageInput((8, 8, 1), name="input"),
            LaxConv(name="conv"),
            L.ReLU(name="relu"),
            L.FullyConnected(10, name="fc"),
            L.Softmax(name="softmax"),
        ]
    )
    one, info_one = _train(net, X, T, steps_per_execution=1, max_epochs=1)
    _, info_auto = _train(net, X, T, max_epochs=1)  # "auto": silently one per call
    with pytest.warns(RuntimeWarning) as said:
        many, info_many = _train(net, X, T, steps_per_execution=4, max_epochs=1)
    assert len(said) == 1 and said[0].filename == __file__  # points at the trainnet call
    assert str(said[0].message) == (
        "trainnet: TrainingOptions(steps_per_execution=4) runs one iteration per call in this "
        "run: its step has a convolution XLA:CPU runs slowly inside a loop. Fix: leave "
        "steps_per_execution='auto' to run as many per call as a run allows, without this "
        "warning."
    )
    assert _calls(info_many) == _calls(info_auto) == [[i] for i in range(1, 7)]
    np.testing.assert_allclose(
        info_many.training_history["loss"], info_one.training_history["loss"], rtol=1e-6
    )


@CPU_ONLY
def test_a_convolution_xla_moves_out_of_the_fast_layout_runs_one_iteration_per_call():
    """A 3x3 convolution on 4x4 maps: df.ops.conv writes its gradients in the fast layout, but
    XLA's simplifier swaps the filter gradient's operands (the cotangent is the larger), which
    only the top level of a program undoes. The compiled loop is read, and not used."""
    X, T = _digits(32 * 4)
    net = df.Network(
        [
            L.ImageInput((8, 8, 1), name="input"),
            L.Conv2D(3, 4, stride=2, padding="same", name="conv1"),  # 8x8 -> 4x4
            L.ReLU(name="relu"),
            L.Conv2D(3, 4, name="conv2"),  # 4x4 -> 2x2, no padding
            L.FullyConnected(10, name="fc"),
            L.Softmax(name="softmax"),
        ]
    )
    texts = []
    real = _chunk.compiled_safe
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_chunk, "compiled_safe", lambda hlo, n: texts.append(hlo) or real(hlo, n))
        _, info = _train(net, X, T, max_epochs=1)
    assert _calls(info) == [[1], [2], [3], [4]]
    # the loop program was compiled once, read (what XLA wrote), and dropped
    assert len(texts) == 1 and "dim_labels=01fb_o01i->f01b" in texts[0]


def test_compiled_safe_reads_the_layouts():
    ok = "%c = f32[4,8,8,2]{3,2,1,0} convolution(%a, %b), window={size=3x3}, dim_labels=b01f_01io->b01f"
    one_d = "%c = f32[4,8,2]{2,1,0} convolution(%a, %b), window={size=3}, dim_labels=b0f_0io->b0f"
    swapped = ok.replace("b01f_01io->b01f", "01fb_o01i->f01b")
    assert _chunk.compiled_safe(ok + "\n" + one_d, 2)
    assert not _chunk.compiled_safe(ok + "\n" + swapped, 2)
    three_d = ok.replace("b01f_01io->b01f", "b012f_012io->b012f")
    assert _chunk.compiled_safe(three_d, 1)
    assert not _chunk.compiled_safe(three_d.replace("b012f_012io", "b021f_012io"), 1)
    assert not _chunk.compiled_safe("%c = f32[2] custom-call(%a)", 1)  # none found: unsafe
    assert _chunk.compiled_safe("%c = f32[2] add(%a, %b)", 0)


def _batches(X, T, size=32):
    return [(X[i : i + size], T[i : i + size]) for i in range(0, len(X), size)]


class _NoLength:
    """A re-iterable without ``len()``: trainnet learns an epoch's end when it ends."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def test_an_iterable_of_batches_runs_several_iterations_per_call(caplog, monkeypatch):
    """An iterable's batches are read ahead and stacked into one call: the same run as one
    iteration per call, with the convolution layout check on the stacked program too (whose
    compilation the calls reuse)."""
    X, T = _digits(32 * 7 + 20)  # seven full batches and a smaller last one (dropped)
    batches = _batches(X, T)
    opts = _options(max_epochs=2, steps_per_execution=4, learn_rate_schedule="warmup",
                    learn_rate_schedule_settings={"num_steps": 6})  # fmt: skip
    one_opts = opts.replace(steps_per_execution=1)
    monkeypatch.setattr(_step, "_CACHE", collections.OrderedDict())  # no other test's steps
    for data in (batches, _NoLength(batches)):
        caplog.clear()
        with jax.log_compiles(), caplog.at_level("WARNING"):
            many, info = df.trainnet(data, _cnn(), "crossentropy", opts, key=jax.random.key(3))
        compiled = [m for m in caplog.messages if "XLA compilation of jit(train_steps)" in m]
        if jax.default_backend() == "cpu":  # compiled once, to read its layouts: calls reuse
            # it; the second run reuses the first's (trainnet's steps are shared by runs with
            # the same network, loss and options)
            assert len(compiled) == (1 if data is batches else 0), compiled
        one, info_one = df.trainnet(data, _cnn(), "crossentropy", one_opts, key=jax.random.key(3))
        # each epoch: the first iteration alone (epoch 1), then up to four, cut at its end
        assert _calls(info) == [[1], [2, 3, 4, 5], [6, 7], [8, 9, 10, 11], [12, 13, 14]]
        assert len(_calls(info_one)) == 14
        _assert_same_run(many, info, one, info_one)


def test_the_stacker_writes_each_call_into_its_buffer_in_place(monkeypatch):
    """A call's batches go into one device buffer per signature, in place: a call of one batch
    copies one batch, and no call allocates; buffers of alternating signatures are kept, the
    least recently used dropped past twice STACK_BYTES."""
    batches = [(jnp.full((4, 3), float(i)), jnp.arange(4) + i) for i in range(5)]
    stacker = _chunk.Stacker()
    buffer = stacker.fill(batches[:3], 4)
    assert [b.shape for b in buffer] == [(4, 4, 3), (4, 4)]
    np.testing.assert_array_equal(buffer[0][:3, 0, 0], [0, 1, 2])
    cpu = jax.default_backend() == "cpu"
    where = [b.unsafe_buffer_pointer() for b in buffer] if cpu else None
    buffer = stacker.fill(batches[4:5], 4)  # one batch: the first entry, the rest as they were
    np.testing.assert_array_equal(buffer[0][:3, 0, 0], [4, 1, 2])
    np.testing.assert_array_equal(buffer[1][0], np.arange(4) + 4)
    if cpu:  # written in place
        assert [b.unsafe_buffer_pointer() for b in buffer] == where
    other = stacker.fill([(jnp.ones((2, 3)), jnp.arange(2))], 4)
    assert [b.shape for b in other] == [(4, 2, 3), (4, 2)]
    buffer = stacker.fill(batches[:1], 4)  # the first signature again: its buffer, kept
    np.testing.assert_array_equal(buffer[0][:3, 0, 0], [0, 1, 2])
    if cpu:
        assert [b.unsafe_buffer_pointer() for b in buffer] == where
    assert len(stacker.buffers) == 2
    monkeypatch.setattr(_chunk, "STACK_BYTES", 4 * _chunk.batch_bytes(batches[0]))
    stacker.fill([(jnp.ones((3, 3)), jnp.arange(3))], 4)  # a third: past 2 * STACK_BYTES
    assert [k[1] for k in stacker.buffers] == [4, 4] and len(stacker.buffers) == 2
    assert _chunk.signature(other_batch := (jnp.ones((2, 3)), jnp.arange(2))) not in [
        k[0] for k in stacker.buffers
    ], other_batch  # the least recently used went


def test_a_nan_loss_inside_a_call_of_an_iterables_batches_stops_at_its_iteration():
    X, T = _digits(32 * 10)
    X = np.array(X)
    X[32 * 6 + 3] = np.nan  # the 7th batch
    batches = _batches(X, T)
    opts = _options(max_epochs=1, shuffle="never")
    net, info = df.trainnet(batches, _cnn("none"), "crossentropy",
                            opts.replace(steps_per_execution=8), key=jax.random.key(3))  # fmt: skip
    one, info_one = df.trainnet(batches, _cnn("none"), "crossentropy",
                                opts.replace(steps_per_execution=1), key=jax.random.key(3))  # fmt: skip
    assert _calls(info)[:2] == [[1], [2, 3, 4, 5, 6, 7]]  # the call that met the NaN ends there
    assert info.stop_reason == info_one.stop_reason == "Training loss is NaN"
    assert len(info.training_history) == len(info_one.training_history) == 7
    assert_tree_allclose(net.learnables, one.learnables, rtol=1e-6)


def test_an_iterable_with_the_host_acting_every_iteration_is_the_same_run():
    X, T = _digits(32 * 5)
    opts = _options(max_epochs=1, verbose_frequency=1, steps_per_execution=4)
    many, info = df.trainnet(_batches(X, T), _cnn(), "crossentropy", opts, key=jax.random.key(3))
    one, info_one = df.trainnet(_batches(X, T), _cnn(), "crossentropy",
                                opts.replace(steps_per_execution=1), key=jax.random.key(3))  # fmt: skip
    assert _calls(info) == [[1], [2], [3], [4], [5]]
    np.testing.assert_allclose(
        info.training_history["loss"], info_one.training_history["loss"], rtol=1e-5
    )
    assert_tree_allclose(many.learnables, one.learnables, rtol=1e-5, atol=1e-6)


def _sequences(lengths):
    """Batches of 8 sequences of 3 channels, each batch padded to its own length."""
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((8, t, 3)).astype(np.float32), rng.integers(0, 4, 8)) for t in lengths
    ]


def _lstm() -> df.Network:
    return df.Network([L.SequenceInput(3, name="in"), L.LSTM(6, output_mode="last", name="lstm"),
                       L.FullyConnected(4, name="fc"), L.Softmax(name="sm")])  # fmt: skip


def _stop_at_look(monkeypatch, tmp_path, look: int) -> dict:
    """The stop file "created" at trainnet's ``look``-th look; the options that make it look."""
    from difffn._training import _watch

    looked = []
    monkeypatch.setattr(_watch.Watch, "stop_requested", lambda self: looked.append(1) or
                        len(looked) == look)  # fmt: skip
    return dict(plots="training-progress", plots_path=tmp_path / "progress.png")


def test_batches_of_other_shapes_start_a_new_call(tmp_path, monkeypatch):
    """Sequences padded per batch: a batch whose length differs from the call's first cannot
    be stacked with it; it starts the next call, and the run is the same as one per call. The
    host acts after every call, one cut short so too: the stop file is looked for there."""
    batches, net = _sequences([5, 5, 7, 7, 7, 7, 5]), _lstm()
    opts = df.TrainingOptions("sgdm", max_epochs=1, verbose=False, steps_per_execution=4)
    many, info = df.trainnet(batches, net, "crossentropy", opts, key=jax.random.key(1))
    one, info_one = df.trainnet(
        batches, net, "crossentropy", opts.replace(steps_per_execution=1), key=jax.random.key(1)
    )
    assert _calls(info) == [[1], [2], [3, 4, 5, 6], [7]]
    np.testing.assert_allclose(
        info.training_history["loss"], info_one.training_history["loss"], rtol=1e-5
    )
    assert_tree_allclose(many.learnables, one.learnables, rtol=1e-5, atol=1e-6)
    plot = _stop_at_look(monkeypatch, tmp_path, 2)
    _, info = df.trainnet(batches, net, "crossentropy", opts.replace(**plot),
                          key=jax.random.key(1))  # fmt: skip
    assert info.stop_reason == "Stopped by user" and info.output_network_iteration == 2


def test_a_stream_stopped_with_a_batch_read_ahead_resumes_at_that_batch(tmp_path, monkeypatch):
    """Stopped after a call cut short by a batch of other shapes: that batch was read but not
    trained on, so the final checkpoint's data position names it, and the resumed run equals
    the uninterrupted one."""
    batches, net = _sequences([5, 5, 7, 7, 5, 5, 7, 5]), _lstm()
    opts = df.TrainingOptions("sgdm", max_epochs=2, steps_per_epoch=8, verbose=False,
                              steps_per_execution=4, checkpoint_frequency=100)  # fmt: skip
    whole, info_whole = df.trainnet(batches, net, "crossentropy", opts, key=jax.random.key(1))
    plot = _stop_at_look(monkeypatch, tmp_path, 3)
    _, info = df.trainnet(batches, net, "crossentropy",
                          opts.replace(checkpoint_path=tmp_path, **plot),
                          key=jax.random.key(1))  # fmt: skip
    # calls [1], [2] (cut short: batch 3 is longer), [3, 4] (cut short: batch 5) -> stop
    assert _calls(info) == [[1], [2], [3, 4]] and info.stop_reason == "Stopped by user"
    monkeypatch.undo()
    folder = next(p for p in tmp_path.iterdir() if p.name.startswith("net_checkpoint__4__"))
    resumed, info_resumed = df.trainnet(batches, net, "crossentropy", opts,
                                        key=jax.random.key(1), resume_from=folder)  # fmt: skip
    np.testing.assert_allclose(
        info_resumed.training_history["loss"], info_whole.training_history["loss"], rtol=1e-5
    )
    assert_tree_allclose(resumed.learnables, whole.learnables, rtol=1e-5, atol=1e-6)


def test_a_call_holds_at_most_stack_bytes_of_an_iterables_batches(monkeypatch):
    X, T = _digits(32 * 6)
    batches = _batches(X, T)
    size = _chunk.batch_bytes((batches[0][0], batches[0][1].astype(np.int32)))
    monkeypatch.setattr(_chunk, "STACK_BYTES", 2 * size)  # two batches per call
    opts = _options(max_epochs=1, steps_per_execution=4)
    _, info = df.trainnet(batches, _cnn(), "crossentropy", opts, key=jax.random.key(3))
    assert _calls(info) == [[1], [2, 3], [4, 5], [6]]
    monkeypatch.setattr(_chunk, "STACK_BYTES", size // 2)  # not even one
    with pytest.warns(RuntimeWarning, match=r"a call holds its batches at once") as said:
        _, info = df.trainnet(batches, _cnn(), "crossentropy", opts, key=jax.random.key(3))
    assert said[0].filename == __file__
    assert "Fix: leave steps_per_execution='auto'" in str(said[0].message)
    assert _calls(info) == [[1], [2], [3], [4], [5], [6]]


def test_a_network_run_eagerly_runs_one_iteration_per_call_and_says_so():
    from layers_for_checks import EagerTanh

    X, T = _digits(32 * 3)
    net = df.Network(
        [
            L.ImageInput((8, 8, 1), normalization="none", name="input"),
            L.FullyConnected(10, name="fc"),
            EagerTanh(name="eager"),
            L.Softmax(name="softmax"),
        ]
    )
    with pytest.warns(RuntimeWarning, match=r"the network has layers that run eagerly") as said:
        _, info = _train(net, X, T, steps_per_execution=4, max_epochs=1)
    assert said[0].filename == __file__
    assert "Fix: leave steps_per_execution='auto'" in str(said[0].message)
    assert _calls(info) == [[1], [2], [3]]


def test_the_stop_file_stops_at_the_end_of_a_call(tmp_path, monkeypatch):
    """The stop file is looked for after each call: training stops where the state is."""
    from difffn._training import _watch

    looked = []

    def stop_on_the_second_look(self):
        looked.append(1)
        return len(looked) == 2

    monkeypatch.setattr(_watch.Watch, "stop_requested", stop_on_the_second_look)
    X, T = _digits()
    plot = dict(plots="training-progress", plots_path=tmp_path / "progress.png")
    net, info = _train(_cnn(), X, T, steps_per_execution=4, max_epochs=1, **plot)
    assert info.stop_reason == "Stopped by user" and _calls(info) == [[1], [2, 3, 4, 5]]
    assert info.output_network_iteration == 5 == len(info.training_history)
    looked.clear()
    monkeypatch.setattr(_watch.Watch, "stop_requested", lambda self: looked.append(1) or
                        len(looked) == 5)  # fmt: skip
    one, info_one = _train(_cnn(), X, T, steps_per_execution=1, max_epochs=1, **plot)
    assert info_one.output_network_iteration == 5
    assert_tree_allclose(net.learnables, one.learnables, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["arrays", "stream"])
def test_resuming_a_checkpoint_of_a_chunked_run_equals_the_uninterrupted_run(tmp_path, form):
    """Calls end at the checkpoints; for a stream read ahead into calls, the checkpoints' data
    position is the calls' end."""
    X, T = _digits()
    kw = dict(steps_per_execution=4, checkpoint_path=tmp_path, checkpoint_frequency=5,
              checkpoint_frequency_unit="iteration", checkpoint_keep=math.inf)  # fmt: skip
    if form == "arrays":  # 15 iterations per epoch, 2 epochs
        data, calls, at, total = (X, T), [[1], [2, 3, 4, 5], [6, 7, 8, 9], [10]], 20, 30
    else:  # 6 of the 15 batches per epoch, 3 epochs: the stream crosses a pass
        data, calls, at, total = (_batches(X, T),), [[1], [2, 3, 4, 5], [6], [7, 8, 9, 10]], 10, 18
        kw.update(steps_per_epoch=6, max_epochs=3)
    net, info = df.trainnet(*data, _cnn(), "crossentropy", _options(**kw), key=jax.random.key(3))
    assert _calls(info)[:4] == calls  # cut at the checkpoints (and epochs)
    folder = next(p for p in tmp_path.iterdir() if p.name.startswith(f"net_checkpoint__{at}__"))
    resumed, info_resumed = df.trainnet(
        *data, _cnn(), "crossentropy", _options(**{**kw, "checkpoint_path": None}),
        key=jax.random.key(3), resume_from=folder,
    )  # fmt: skip
    assert info_resumed.output_network_iteration == total
    np.testing.assert_allclose(
        info_resumed.training_history["loss"], info.training_history["loss"], rtol=1e-5
    )
    assert_tree_allclose(resumed.learnables, net.learnables, rtol=1e-5, atol=1e-6)


def _jaxpr(conv):
    x = jnp.ones((2, 6, 6, 3))
    w = jnp.ones((3, 3, 3, 4))
    return jax.make_jaxpr(jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), (0, 1)))(x, w)


def test_loop_safe_reads_the_layouts_of_every_convolution_in_the_step():
    def lax_conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    def ops_conv(x, w):
        return df.ops.conv(df.dlarray(x, "BSSC"), w, padding="same").data

    def grouped(x, w):
        return df.ops.conv(df.dlarray(jnp.tile(x, 2), "BSSC"), w, padding="same").data

    assert not _chunk.loop_safe(_jaxpr(lax_conv))  # JAX's transposes: f01b_i01o->01bf, 01oi
    assert _chunk.loop_safe(jax.make_jaxpr(lax_conv)(jnp.ones((2, 6, 6, 3)),
                                                     jnp.ones((3, 3, 3, 4))))  # fmt: skip
    if jax.default_backend() == "cpu":
        assert _chunk.loop_safe(_jaxpr(ops_conv))
    assert not _chunk.loop_safe(_jaxpr(grouped))  # two groups of 3 channels
    # nested: inside a jit and a scan
    nested = jax.make_jaxpr(
        lambda x, w: jax.lax.scan(
            lambda c, _: (jax.jit(lax_conv)(c, w)[..., :3], None), x, None, length=2
        )[0]  # fmt: skip
    )
    assert _chunk.loop_safe(nested(jnp.ones((2, 6, 6, 3)), jnp.ones((3, 3, 3, 4))))
    looped_grad = jax.make_jaxpr(
        jax.grad(
            lambda x, w: jnp.sum(
                jax.lax.scan(lambda c, _: (lax_conv(c, w)[..., :3], None), x, None, length=2)[0]
            )
        )
    )
    assert not _chunk.loop_safe(looped_grad(jnp.ones((2, 6, 6, 3)), jnp.ones((3, 3, 3, 4))))


def test_count_ends_where_the_host_acts():
    kw = dict(limit=16, left=100, final=None, every=(50,))
    assert _chunk.count(1, **kw) == 1
    assert _chunk.count(2, **kw) == 16
    assert _chunk.count(40, **kw) == 11  # 40..50
    assert _chunk.count(50, **kw) == 1
    assert _chunk.count(51, **{**kw, "left": 3}) == 3  # the epoch's end
    assert _chunk.count(51, **{**kw, "final": 52}) == 2
    assert _chunk.count(2, **{**kw, "every": (50, 6)}) == 5  # 2..6


def test_a_nan_loss_inside_a_call_stops_training_at_its_iteration():
    X, T = _digits(32 * 10)
    X = np.array(X)
    X[32 * 6 + 3] = np.nan  # the 7th mini-batch of the epoch (no shuffle)
    kw = dict(shuffle="never", max_epochs=1)
    net, info = _train(_cnn("none"), X, T, steps_per_execution=8, **kw)
    net_one, info_one = _train(_cnn("none"), X, T, steps_per_execution=1, **kw)
    assert info.stop_reason == info_one.stop_reason == "Training loss is NaN"
    assert len(info.training_history) == len(info_one.training_history) == 7
    assert info.output_network_iteration == 7
    # the steps after the NaN one, in the same call, changed nothing
    for name, value in net.learnables.items():
        np.testing.assert_allclose(value, net_one.learnables[name], rtol=1e-6, err_msg=name)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "steps_per_execution must be 'auto' or a positive int; got 0"),
        ("fast", "steps_per_execution must be 'auto' or a positive int; got 'fast'"),
        (2.5, "Fix: steps_per_execution='auto'"),
    ],
)
def test_bad_values_are_named(value, message):
    with pytest.raises(df.OptionsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        df.TrainingOptions(steps_per_execution=value)


def test_an_output_fcn_needs_one_call_per_iteration():
    X, T = _digits(64)
    with pytest.raises(df.OptionsError) as error:
        _train(_cnn(), X, T, steps_per_execution=4, output_fcn=lambda info: False)
    text = str(error.value)
    assert "steps_per_execution=4" in text and "output_fcn sees the network after every" in text
    assert "Fix: steps_per_execution='auto' (or 1)" in text
    # "auto" runs it one call per iteration, without complaint
    _, info = _train(_cnn(), X, T, output_fcn=lambda info: False, max_epochs=1)
    assert _calls(info) == [[1], [2]]
