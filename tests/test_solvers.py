"""Solvers against MATLAB's formulas: the custom-loop helpers and trainnet's first steps.

Factors (a learn-rate factor of 0 freezes a parameter, an L2 factor of 0 removes its decay),
coupled L2 for every solver, and gradient clipping bounding the update.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import assert_tree_allclose
from training_layers import regression_data, regression_net

import difffn as df

RNG = np.random.default_rng(0)
PARAMS = {"w": jnp.asarray(RNG.normal(size=(3, 2)), jnp.float32), "b": jnp.ones(2)}
GRADS = [
    {"w": jnp.asarray(RNG.normal(size=(3, 2)), jnp.float32), "b": jnp.asarray(RNG.normal(size=2))}
    for _ in range(3)
]

# -- the custom-loop helpers against the formulas -------------------------------------------------


def test_sgdmupdate_follows_matlab_velocity_formula_with_changing_learn_rate():
    params, vel = PARAMS, None
    theta = {k: np.asarray(v, np.float64) for k, v in PARAMS.items()}
    v = {k: np.zeros_like(x) for k, x in theta.items()}
    for step, (g, lr) in enumerate(zip(GRADS, [0.1, 0.05, 0.2], strict=True)):
        params, vel = df.sgdmupdate(params, g, vel, lr, 0.8)
        for k in theta:
            v[k] = 0.8 * v[k] - lr * np.asarray(g[k])
            theta[k] = theta[k] + v[k]
        for k in theta:
            np.testing.assert_allclose(params[k], theta[k], rtol=1e-5, err_msg=f"step {step}")
            np.testing.assert_allclose(vel[k], v[k], rtol=1e-5)


def test_adamupdate_follows_the_formula_with_bias_correction():
    b1, b2, eps, lr = 0.75, 0.95, 1e-3, 0.05
    params, m, s = PARAMS, None, None
    theta = {k: np.asarray(v, np.float64) for k, v in PARAMS.items()}
    mm = {k: np.zeros_like(x) for k, x in theta.items()}
    vv = {k: np.zeros_like(x) for k, x in theta.items()}
    for t, g in enumerate(GRADS, start=1):
        params, m, s = df.adamupdate(params, g, m, s, t, lr, b1, b2, eps)
        for k in theta:
            gk = np.asarray(g[k], np.float64)
            mm[k] = b1 * mm[k] + (1 - b1) * gk
            vv[k] = b2 * vv[k] + (1 - b2) * gk**2
            m_hat, v_hat = mm[k] / (1 - b1**t), vv[k] / (1 - b2**t)
            theta[k] = theta[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
    for k in theta:
        np.testing.assert_allclose(params[k], theta[k], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m[k], mm[k], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(s[k], vv[k], rtol=1e-5, atol=1e-7)


def test_rmspropupdate_puts_epsilon_outside_the_square_root():
    decay, eps, lr = 0.9, 0.5, 0.1  # a large epsilon makes its placement visible
    params, s = PARAMS, None
    theta = {k: np.asarray(v, np.float64) for k, v in PARAMS.items()}
    vv = {k: np.zeros_like(x) for k, x in theta.items()}
    for g in GRADS:
        params, s = df.rmspropupdate(params, g, s, lr, decay, eps)
        for k in theta:
            gk = np.asarray(g[k], np.float64)
            vv[k] = decay * vv[k] + (1 - decay) * gk**2
            theta[k] = theta[k] - lr * gk / (np.sqrt(vv[k]) + eps)
    for k in theta:
        np.testing.assert_allclose(params[k], theta[k], rtol=1e-5, atol=1e-6)


def test_helpers_default_to_matlab_hyperparameters():
    w, g = jnp.array([1.0]), jnp.array([2.0])
    w1, v = df.sgdmupdate(w, g, None)
    assert float(w1[0]) == pytest.approx(1 - 0.01 * 2)
    w1, _ = df.rmspropupdate(w, g, None)
    assert float(w1[0]) == pytest.approx(1 - 0.001 * 2 / (np.sqrt(0.1 * 4) + 1e-8), rel=1e-6)
    w1, _, _ = df.adamupdate(w, g, None, None, 1)
    assert float(w1[0]) == pytest.approx(1 - 0.001, rel=1e-5)


def test_helpers_work_inside_jit_and_with_a_traced_iteration():
    @jax.jit
    def step(params, g, m, s, t):
        return df.adamupdate(params, g, m, s, t, 0.01)

    zeros = jax.tree.map(jnp.zeros_like, PARAMS)
    params, m, s = step(PARAMS, GRADS[0], zeros, zeros, 1)
    expected = df.adamupdate(PARAMS, GRADS[0], None, None, 1, 0.01)
    assert_tree_allclose((params, m, s), expected)


@pytest.mark.parametrize("iteration", [0, np.int32(0), jnp.array(0), 1.0, -2, True])
def test_adamupdate_iteration_counts_from_one(iteration):
    with pytest.raises(df.OptionsError, match=r"iteration must be an int counted from 1; got"):
        df.adamupdate(PARAMS, GRADS[0], None, None, iteration)


_TRACED_ZERO = (
    r"adamupdate: iteration must be counted from 1 \(MATLAB's definition.*got {} inside a "
    r"traced function \(such as jax\.jit\), so this step used iteration 1 and the parameters stay "
    r"finite\. Fix: pass iteration = step \+ 1 for a step count from 0\."
)


def _adam_reference(params, grads, lr, t):
    """optax's own Adam at step count ``t`` (its bias correction uses count + 1 = t)."""
    tx = optax.adam(lr, b1=0.9, b2=0.999, eps=1e-8)
    state = tx.init(params)
    adam = state[0]._replace(count=jnp.asarray(t - 1, jnp.int32))
    updates, _ = tx.update(grads, (adam, *state[1:]), params)
    return optax.apply_updates(params, updates)


@pytest.mark.parametrize("bad", [0, -3])
def test_a_traced_iteration_below_one_warns_and_steps_as_iteration_one(bad):
    """Under jit the value is known only when the step runs: no exception can cross the user's
    jit (JAX would wrap it in JaxRuntimeError), so it is a named warning and finite parameters."""

    @jax.jit
    def step(params, g, t):
        return df.adamupdate(params, g, None, None, t, 0.01)

    jax.block_until_ready(step(PARAMS, GRADS[0], 1))  # a good one runs as before, silently
    with pytest.warns(df.SolverWarning, match=_TRACED_ZERO.format(bad)):
        params, m, s = jax.block_until_ready(step(PARAMS, GRADS[0], bad))
        jax.effects_barrier()
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((params, m, s)))
    assert_tree_allclose(params, _adam_reference(PARAMS, GRADS[0], 0.01, 1))
    assert_tree_allclose(params, df.adamupdate(PARAMS, GRADS[0], None, None, 1, 0.01)[0])


def test_a_traced_iteration_zero_outside_jit_warns_too():
    """vmap traces the iteration without jit: same warning; each row is checked on its own."""

    def step(t):
        return df.adamupdate(PARAMS, GRADS[0], None, None, t, 0.01)[0]

    with pytest.warns(df.SolverWarning, match=_TRACED_ZERO.format(0)):
        rows = jax.vmap(step)(jnp.array([0, 2]))
        jax.effects_barrier()
    assert_tree_allclose(
        jax.tree.map(lambda x: x[0], rows), _adam_reference(PARAMS, GRADS[0], 0.01, 1)
    )
    assert_tree_allclose(
        jax.tree.map(lambda x: x[1], rows), _adam_reference(PARAMS, GRADS[0], 0.01, 2)
    )


def test_a_traced_iteration_zero_made_an_error_by_the_user_surfaces_with_the_message():
    """warnings.simplefilter("error", df.SolverWarning): JAX wraps it; the message survives."""

    @jax.jit
    def step(params, g, t):
        return df.adamupdate(params, g, None, None, t, 0.01)

    with warnings.catch_warnings():
        warnings.simplefilter("error", df.SolverWarning)
        with pytest.raises(jax.errors.JaxRuntimeError, match=_TRACED_ZERO.format(0)):
            jax.block_until_ready(step(PARAMS, GRADS[0], 0))
            jax.effects_barrier()


# -- networks and tables --------------------------------------------------------------------------


@pytest.fixture
def net_and_grads(key):
    net = regression_net().initialize(key=key)
    X, T = regression_data(16)

    def loss(net):
        return df.losses.mse(net.predict(X), T)

    return net, jax.grad(loss)(net)


def test_network_update_uses_gradient_networks_and_returns_velocity_tables(net_and_grads):
    net, grads = net_and_grads
    new, vel = df.sgdmupdate(net, grads, None, 0.1)
    assert isinstance(new, df.Network) and isinstance(vel, df.ParameterTable)
    assert list(vel) == list(net.learnables) == ["fc/weights", "fc/bias"]
    expected = net.learnables["fc/weights"] - 0.1 * grads.learnables["fc/weights"]
    np.testing.assert_allclose(new.learnables["fc/weights"], expected, rtol=1e-6)
    # the velocity table feeds the next call; a gradient table works like a gradient network
    new2, vel2 = df.sgdmupdate(new, grads.learnables, vel, 0.1)
    np.testing.assert_allclose(
        vel2["fc/bias"], 0.9 * vel["fc/bias"] - 0.1 * grads.learnables["fc/bias"], rtol=1e-6
    )


def test_network_update_applies_learn_rate_factors(net_and_grads):
    net, grads = net_and_grads
    net = df.set_learn_rate_factor(net, "fc/bias", 0.0)
    net = df.set_learn_rate_factor(net, "fc/weights", 2.0)
    new, _, _ = df.adamupdate(net, grads, None, None, 1, 0.01)
    np.testing.assert_array_equal(new.learnables["fc/bias"], net.learnables["fc/bias"])
    step = np.asarray(new.learnables["fc/weights"] - net.learnables["fc/weights"])
    np.testing.assert_allclose(np.abs(step), 0.02, rtol=1e-3)  # Adam's first step: lr * factor


def test_parameter_tables_are_updated_row_by_row(net_and_grads):
    net, grads = net_and_grads
    table, vel = df.sgdmupdate(net.learnables, grads.learnables, None, 0.5)
    assert isinstance(table, df.ParameterTable) and list(table) == list(net.learnables)
    np.testing.assert_allclose(
        table["fc/bias"], net.learnables["fc/bias"] - 0.5 * grads.learnables["fc/bias"], rtol=1e-6
    )


def test_structure_mismatch_and_bad_values_are_clear_errors(net_and_grads):
    net, grads = net_and_grads
    with pytest.raises(df.OptionsError, match="structure of the parameters"):
        df.sgdmupdate(PARAMS, {"w": PARAMS["w"]})
    with pytest.raises(df.OptionsError, match="rows of net.learnables"):
        df.sgdmupdate(net, df.ParameterTable([("fc", "weights", grads.learnables["fc/weights"])]))
    with pytest.raises(df.OptionsError, match="a df.Network of gradients"):
        df.sgdmupdate(net, {"w": 1.0})
    with pytest.raises(df.OptionsError, match="learn_rate must be in"):
        df.sgdmupdate(PARAMS, GRADS[0], None, -0.1)
    with pytest.raises(df.OptionsError, match="iteration must be an int counted from 1"):
        df.adamupdate(PARAMS, GRADS[0], None, None, 0)
    with pytest.raises(df.OptionsError, match="not initialized"):
        df.sgdmupdate(regression_net(), grads)


# -- trainnet's solver steps ----------------------------------------------------------------------


def one_step(net, X, T, solver="sgdm", **options):
    """The network after exactly one trainnet iteration over all of (X, T)."""
    opts = df.TrainingOptions(
        solver, max_epochs=1, mini_batch_size=len(X), shuffle="never", verbose=False, **options
    )
    trained, info = df.trainnet(X, T, net, "mse", opts)
    assert len(info.training_history) == 1
    return trained


def gradients(net, X, T):
    return jax.grad(lambda table: df.losses.mse(net.replace(learnables=table).predict(X), T))(
        net.learnables
    )


@pytest.fixture
def problem(key):
    X, T = regression_data(32)
    return regression_net().initialize(key=key), X, 10 * T


def test_trainnet_sgdm_first_step_adds_coupled_l2(problem):
    net, X, T = problem
    g = gradients(net, X, T)
    trained = one_step(net, X, T, initial_learn_rate=0.05, l2_regularization=0.3)
    for path in ("fc/weights", "fc/bias"):
        w = net.learnables[path]
        np.testing.assert_allclose(
            trained.learnables[path], w - 0.05 * (g[path] + 0.3 * w), rtol=1e-5, atol=1e-6
        )


def test_trainnet_adam_and_rmsprop_first_steps_include_l2_in_the_gradient(problem):
    net, X, T = problem
    g = gradients(net, X, T)
    adam = one_step(net, X, T, "adam", initial_learn_rate=0.01, l2_regularization=0.3)
    rms = one_step(net, X, T, "rmsprop", initial_learn_rate=0.01, l2_regularization=0.3)
    w = net.learnables["fc/weights"]
    gl2 = np.asarray(g["fc/weights"] + 0.3 * w, np.float64)
    # Adam's first bias-corrected step is lr * g / (|g| + eps)
    np.testing.assert_allclose(
        adam.learnables["fc/weights"], w - 0.01 * gl2 / (np.abs(gl2) + 1e-8), rtol=1e-5
    )
    np.testing.assert_allclose(
        rms.learnables["fc/weights"], w - 0.01 * gl2 / (np.sqrt(0.1 * gl2**2) + 1e-8), rtol=1e-5
    )


def test_learn_rate_factor_zero_freezes_a_parameter(problem):
    net, X, T = problem
    frozen = df.set_learn_rate_factor(net, "fc/weights", 0.0)
    opts = df.TrainingOptions(max_epochs=3, mini_batch_size=8, verbose=False)
    trained, _ = df.trainnet(X, T, frozen, "mse", opts)
    np.testing.assert_array_equal(trained.learnables["fc/weights"], net.learnables["fc/weights"])
    assert not np.allclose(trained.learnables["fc/bias"], net.learnables["fc/bias"])


def test_learn_rate_factor_scales_the_step(problem):
    net, X, T = problem
    g = gradients(net, X, T)
    trained = one_step(df.set_learn_rate_factor(net, "fc/bias", 3.0), X, T, l2_regularization=0.0)
    np.testing.assert_allclose(
        trained.learnables["fc/bias"], net.learnables["fc/bias"] - 0.03 * g["fc/bias"], rtol=1e-5
    )


def test_l2_factor_zero_removes_decay_and_factors_multiply_the_global_l2(problem):
    net, X, T = problem
    g = gradients(net, X, T)
    changed = df.set_l2_factor(df.set_l2_factor(net, "fc/weights", 0.0), "fc/bias", 2.0)
    b0 = net.learnables["fc/bias"] + 1.0  # a non-zero bias, so its decay shows
    changed = changed.replace(learnables={"fc/bias": b0})
    g = gradients(changed, X, T)
    trained = one_step(changed, X, T, l2_regularization=0.5)
    w = net.learnables["fc/weights"]
    np.testing.assert_allclose(
        trained.learnables["fc/weights"], w - 0.01 * g["fc/weights"], rtol=1e-5
    )
    np.testing.assert_allclose(
        trained.learnables["fc/bias"], b0 - 0.01 * (g["fc/bias"] + 2 * 0.5 * b0), rtol=1e-5
    )


@pytest.mark.parametrize("method", ["l2norm", "global-l2norm", "absolute-value"])
def test_gradient_clipping_bounds_the_update(problem, method):
    net, X, T = problem
    g = gradients(net, X, T)
    threshold, lr = 0.5, 0.1
    trained = one_step(
        net,
        X,
        T,
        initial_learn_rate=lr,
        l2_regularization=0.0,
        gradient_threshold=threshold,
        gradient_threshold_method=method,
    )
    steps = {p: np.asarray(trained.learnables[p] - net.learnables[p]) for p in net.learnables}
    norms = {p: np.linalg.norm(g[p]) for p in g}
    assert all(n > threshold for n in norms.values())  # every gradient is clipped
    if method == "l2norm":
        for p, s in steps.items():
            assert np.linalg.norm(s) == pytest.approx(lr * threshold, rel=1e-4)
            np.testing.assert_allclose(s, -lr * threshold * g[p] / norms[p], rtol=1e-4)
    elif method == "global-l2norm":
        total = np.sqrt(sum(np.sum(s**2) for s in steps.values()))
        assert total == pytest.approx(lr * threshold, rel=1e-4)
    else:
        for p, s in steps.items():
            np.testing.assert_allclose(s, -lr * np.clip(g[p], -threshold, threshold), rtol=1e-4)


def test_sgdm_velocity_in_trainnet_matches_the_formula_over_iterations(problem):
    net, X, T = problem
    opts = df.TrainingOptions(
        max_epochs=3,
        mini_batch_size=len(X),
        shuffle="never",
        verbose=False,
        l2_regularization=0.0,
        learn_rate_schedule=lambda lr, iteration, epoch: [0.02, 0.01, 0.04][iteration - 1],
    )
    trained, _ = df.trainnet(X, T, net, "mse", opts)
    table, vel = net.learnables, None
    current = net
    for lr in [0.02, 0.01, 0.04]:
        g = gradients(current, X, T)
        table, vel = df.sgdmupdate(table, g, vel, lr, 0.9)
        current = net.replace(learnables=table)
    assert_tree_allclose(trained.learnables, table, rtol=1e-5, atol=1e-6)


# -- any optax transformation as the solver (issue 14 item 3) ------------------------------------


def optax_reference(net, X, T, tx, *, epochs, batch, learn_rate=None, l2=0.0, factors=None):
    """A hand-written optax loop over the same mini-batches (in order): the reference.

    ``learn_rate(iteration, epoch)`` is written into the injected learning rate each step;
    ``l2`` is added to the gradients (coupled); ``factors`` scale each parameter's update.
    """
    params = dict(net.learnables.items())

    def loss(params, x, t):
        table = df.ParameterTable([(*k.split("/"), v) for k, v in params.items()])
        return df.losses.mse(net.replace(learnables=table).predict(x), t)

    state = tx.init(params)
    iteration = 0
    for epoch in range(1, epochs + 1):
        for start in range(0, len(X) - batch + 1, batch):
            iteration += 1
            g = jax.grad(loss)(params, X[start : start + batch], T[start : start + batch])
            g = {k: g[k] + l2 * params[k] for k in g}
            if learn_rate is not None:
                state.hyperparams["learning_rate"] = jnp.asarray(learn_rate(iteration, epoch))
            updates, state = tx.update(g, state, params)
            updates = {k: u * (factors or {}).get(k, 1.0) for k, u in updates.items()}
            params = optax.apply_updates(params, updates)
    return params


def test_adamw_with_global_norm_clipping_equals_a_hand_written_optax_loop(problem):
    net, X, T = problem
    options = df.TrainingOptions(
        optax.adamw(0.02, weight_decay=0.1),
        max_epochs=3,
        mini_batch_size=8,
        shuffle="never",
        l2_regularization=0,
        gradient_threshold_method="global-l2norm",
        gradient_threshold=1.0,
        verbose=False,
    )
    trained, info = df.trainnet(X, T, net, "mse", options)
    expected = optax_reference(
        net,
        X,
        T,
        optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(0.02, weight_decay=0.1)),
        epochs=3,
        batch=8,
    )
    for path, value in expected.items():
        np.testing.assert_allclose(trained.learnables[path], value, rtol=2e-5, atol=1e-6)
    assert np.all(np.isnan(info.training_history["learn_rate"]))  # its own, fixed inside it


def test_an_injected_lion_gets_the_schedule_l2_and_factors(problem):
    net, X, T = problem
    net = df.set_learn_rate_factor(net, "fc/bias", 0.5)
    lion = optax.inject_hyperparams(optax.lion)(learning_rate=0.01, b1=0.8)
    options = df.TrainingOptions(
        lion,
        max_epochs=3,
        mini_batch_size=8,
        shuffle="never",
        l2_regularization=0.01,
        learn_rate_schedule="piecewise",
        learn_rate_drop_period=1,
        learn_rate_drop_factor=0.5,
        verbose=False,
    )
    assert options.initial_learn_rate is None  # the transformation's own: 0.01
    trained, info = df.trainnet(X, T, net, "mse", options)
    rate = lambda iteration, epoch: 0.01 * 0.5 ** (epoch - 1)  # noqa: E731
    np.testing.assert_allclose(
        info.training_history["learn_rate"], [0.01] * 4 + [0.005] * 4 + [0.0025] * 4
    )
    expected = optax_reference(
        net,
        X,
        T,
        optax.inject_hyperparams(optax.lion)(learning_rate=0.01, b1=0.8),
        epochs=3,
        batch=8,
        learn_rate=rate,
        l2=0.01,
        factors={"fc/bias": 0.5},
    )
    for path, value in expected.items():
        np.testing.assert_allclose(trained.learnables[path], value, rtol=2e-5, atol=1e-6)


def test_an_optax_schedule_as_learn_rate_schedule(problem):
    net, X, T = problem
    schedule = optax.cosine_decay_schedule(0.05, decay_steps=8)
    options = df.TrainingOptions(
        max_epochs=2, mini_batch_size=8, learn_rate_schedule=schedule, verbose=False
    )
    _, info = df.trainnet(X, T, net, "mse", options)
    np.testing.assert_allclose(
        info.training_history["learn_rate"], [float(schedule(count)) for count in range(8)]
    )


def test_custom_solver_options_and_errors(problem):
    net, X, T = problem
    tx = optax.lion(1e-3)
    assert (
        repr(df.TrainingOptions(tx, max_epochs=2))
        == "TrainingOptions(<optax transformation>, max_epochs=2)"
    )
    with pytest.raises(
        df.OptionsError,
        match=r"momentum is an option of solver\(s\) \['sgdm'\], not of <optax transformation>.*Set them when building",
    ):
        df.TrainingOptions(tx, momentum=0.5)
    with pytest.raises(
        df.OptionsError,
        match=r"solver must be one of 'sgdm', 'adam', 'rmsprop', or an optax\.GradientTransformation",
    ):
        df.TrainingOptions(optax.lion)  # the factory, not a transformation
    with pytest.raises(
        df.OptionsError,
        match=r"the optax transformation given as solver has no learning_rate that trainnet can "
        r"set.*Fix: build it with optax\.inject_hyperparams",
    ):
        df.trainnet(
            X,
            T,
            net,
            "mse",
            df.TrainingOptions(
                tx, mini_batch_size=8, learn_rate_schedule="piecewise", verbose=False
            ),
        )


def test_a_custom_solver_resumes_exactly_and_its_settings_are_checked(problem, tmp_path):
    net, X, T = problem

    def options(rate=0.01, **changes):
        solver = optax.inject_hyperparams(optax.adamw)(learning_rate=rate, weight_decay=0.05)
        return df.TrainingOptions(
            solver,
            max_epochs=3,
            mini_batch_size=8,
            learn_rate_schedule="piecewise",
            learn_rate_drop_period=1,
            verbose=False,
            **changes,
        )

    reference, _ = df.trainnet(X, T, net, "mse", options())
    df.trainnet(
        X,
        T,
        net,
        "mse",
        options(
            checkpoint_path=tmp_path,
            checkpoint_frequency_unit="iteration",
            output_fcn=lambda info: info["iteration"] >= 6,
        ),
    )
    resumed, info = df.trainnet(X, T, net, "mse", options(), resume_from=tmp_path)  # a new object
    assert len(info.training_history) == 12
    assert_tree_allclose(resumed.learnables, reference.learnables, rtol=0, atol=0)
    with pytest.raises(
        df.SerializationError,
        match=r"differs in option solver: it had optax transformation .*0\.01.*; this call has .*0\.02",
    ):
        df.trainnet(X, T, net, "mse", options(rate=0.02), resume_from=tmp_path)
