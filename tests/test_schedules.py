"""Learn-rate schedules: each named schedule's formula, sequences, callables, units."""

from __future__ import annotations

import math

import pytest

import difffn as df
from difffn._training._schedules import LearnRateSchedule


def rates(options, iterations_per_epoch, n):
    """The learn rate of iterations 1..n, with epochs of ``iterations_per_epoch``."""
    schedule = LearnRateSchedule(options, iterations_per_epoch)
    return [schedule(i, (i - 1) // iterations_per_epoch + 1) for i in range(1, n + 1)]


def test_none_is_constant():
    assert rates(df.TrainingOptions(), 3, 7) == [0.01] * 7


def test_piecewise_drops_every_period_epochs():
    o = df.TrainingOptions(
        learn_rate_schedule="piecewise", learn_rate_drop_factor=0.5, learn_rate_drop_period=2
    )
    # 2 iterations per epoch: epochs 1-2 at 0.01, 3-4 at 0.005, 5 at 0.0025
    assert rates(o, 2, 10) == pytest.approx([0.01] * 4 + [0.005] * 4 + [0.0025] * 2)


def test_piecewise_settings_override_the_matlab_options():
    o = df.TrainingOptions(
        learn_rate_schedule="piecewise",
        learn_rate_schedule_settings={
            "drop_factor": 0.1,
            "period": 3,
            "frequency_unit": "iteration",
        },
    )
    assert rates(o, 100, 7) == pytest.approx([0.01] * 3 + [0.001] * 3 + [0.0001])


def test_warmup_then_constant():
    o = df.TrainingOptions(
        learn_rate_schedule="warmup",
        learn_rate_schedule_settings={
            "initial_factor": 0.0,
            "num_steps": 4,
            "frequency_unit": "iteration",
        },
    )
    assert rates(o, 10, 6) == pytest.approx([0.0, 0.0025, 0.005, 0.0075, 0.01, 0.01])


def test_warmup_defaults_ramp_over_five_iterations_as_matlab_documents():
    # MathWorks' warmupLearnRate: "ramps up the learning for a specified number of
    # iterations"; InitialFactor 0.1, FinalFactor 1, NumSteps 5, FrequencyUnit "iteration".
    # Reference: a straight line from 0.1 to 1 over 5 steps, in plain Python.
    o = df.TrainingOptions(learn_rate_schedule="warmup")
    want = [0.01 * (0.1 + 0.9 * min(k, 5) / 5) for k in range(8)]
    assert rates(o, 3, 8) == pytest.approx(want)  # 3 iterations per epoch: not per epoch


def test_polynomial_decays_to_the_final_factor_over_training():
    o = df.TrainingOptions(max_epochs=4, learn_rate_schedule="polynomial")
    # one iteration per epoch; k = 0..3 of num_steps = 4: 1, 0.75, 0.5, 0.25
    assert rates(o, 1, 4) == pytest.approx([0.01, 0.0075, 0.005, 0.0025])
    o = df.TrainingOptions(
        learn_rate_schedule="polynomial", learn_rate_schedule_settings={"power": 2, "num_steps": 2}
    )
    assert rates(o, 1, 4) == pytest.approx([0.01, 0.0025, 0.0, 0.0])


def test_exponential():
    o = df.TrainingOptions(
        learn_rate_schedule="exponential", learn_rate_schedule_settings={"drop_factor": 0.5}
    )
    assert rates(o, 1, 3) == pytest.approx([0.01, 0.005, 0.0025])


def test_cosine_with_warm_restarts():
    o = df.TrainingOptions(
        learn_rate_schedule="cosine",
        learn_rate_schedule_settings={"period": 4, "period_growth": 2, "min_factor": 0.0},
    )
    values = rates(o, 1, 13)
    expected = [0.01 * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(4)]
    expected += [0.01 * (1 + math.cos(math.pi * t / 8)) / 2 for t in range(8)]
    expected += [0.01]
    assert values == pytest.approx(expected)


def test_cosine_defaults_to_the_whole_training():
    o = df.TrainingOptions(max_epochs=10, learn_rate_schedule="cosine")
    values = rates(o, 2, 20)
    assert values[0] == pytest.approx(0.01) and values[-1] < 0.0005
    assert values == sorted(values, reverse=True)


def test_cyclical_triangle():
    o = df.TrainingOptions(
        learn_rate_schedule="cyclical",
        learn_rate_schedule_settings={"max_factor": 3, "period": 4, "step_ratio": 0.5},
    )
    assert rates(o, 1, 8) == pytest.approx([0.01, 0.02, 0.03, 0.02] * 2)


def test_a_sequence_runs_each_schedule_for_its_steps():
    o = df.TrainingOptions(
        learn_rate_schedule=("warmup", "piecewise"),
        learn_rate_schedule_settings={
            "warmup": {"initial_factor": 0.5, "num_steps": 2, "frequency_unit": "epoch"},
            "piecewise": {"period": 1, "drop_factor": 0.5},
        },
    )
    # epochs of 2 iterations: warmup for epochs 1-2 (0.5, 0.75), then piecewise from epoch 3
    assert rates(o, 2, 10) == pytest.approx(
        [0.005, 0.005, 0.0075, 0.0075, 0.01, 0.01, 0.005, 0.005, 0.0025, 0.0025]
    )


def test_matlab_style_callable_gets_the_initial_rate_iteration_and_epoch():
    seen = []

    def schedule(initial, iteration, epoch):
        seen.append((initial, iteration, epoch))
        return initial / iteration

    o = df.TrainingOptions(learn_rate_schedule=schedule)
    assert rates(o, 2, 4) == pytest.approx([0.01, 0.005, 0.01 / 3, 0.0025])
    assert seen[-1] == (0.01, 4, 2)


def test_optax_style_callable_gets_the_step_count():
    o = df.TrainingOptions(learn_rate_schedule=lambda count: 0.1 * (count + 1))
    assert rates(o, 2, 3) == pytest.approx([0.1, 0.2, 0.3])


def test_mixed_units_need_the_epoch_length():
    o = df.TrainingOptions(
        learn_rate_schedule=("warmup", "cosine"),
        learn_rate_schedule_settings={"warmup": {"frequency_unit": "iteration"}},
    )
    with pytest.raises(df.OptionsError, match="mixes epoch and iteration units"):
        LearnRateSchedule(o, None)
    assert len(rates(o, 3, 9)) == 9


# -- built on optax.schedules, with MATLAB's values (issue 14 item 3) -----------------------------


def test_named_schedules_equal_the_float64_formulas_and_optax():
    import jax
    import optax

    o = df.TrainingOptions(
        learn_rate_schedule="cosine",
        learn_rate_schedule_settings={"period": 7, "period_growth": 1.5, "min_factor": 0.1},
    )
    values = rates(o, 1, 30)
    expected, period, t = [], 7.0, 0.0
    for _ in range(30):
        if t >= period:
            t, period = t - period, period * 1.5
        expected.append(0.01 * (0.1 + 0.9 * (1 + math.cos(math.pi * t / period)) / 2))
        t += 1
    assert values == pytest.approx(expected, rel=1e-12)  # float64, as MATLAB computes
    o = df.TrainingOptions(
        learn_rate_schedule="exponential",
        learn_rate_schedule_settings={"drop_factor": 0.7, "period": 3},
    )
    with jax.enable_x64(True):
        reference = optax.exponential_decay(0.01, transition_steps=3, decay_rate=0.7)
        assert rates(o, 1, 9) == pytest.approx([float(reference(k)) for k in range(9)], rel=1e-12)


def test_a_drop_factor_of_zero_drops_to_zero():
    o = df.TrainingOptions(
        learn_rate_schedule="piecewise", learn_rate_drop_factor=0.0, learn_rate_drop_period=2
    )
    assert rates(o, 1, 4) == [0.01, 0.01, 0.0, 0.0]


def test_cosine_takes_matlabs_property_names():
    # MathWorks' cosineLearnRate names its factors InitialFactor and FinalFactor
    matlab = df.TrainingOptions(
        learn_rate_schedule="cosine",
        learn_rate_schedule_settings={"period": 4, "initial_factor": 2.0, "final_factor": 0.5},
    )
    expected = [0.01 * (0.5 + 1.5 * (1 + math.cos(math.pi * t / 4)) / 2) for t in range(4)]
    assert rates(matlab, 1, 4) == pytest.approx(expected)
    older = df.TrainingOptions(
        learn_rate_schedule="cosine",
        learn_rate_schedule_settings={"period": 4, "max_factor": 2.0, "min_factor": 0.5},
    )
    assert rates(older, 1, 4) == rates(matlab, 1, 4)


def test_cosine_takes_period_growth_factor_and_inf_as_matlab_scripts_write_it():
    # cosineLearnRate(Period=4, PeriodGrowthFactor=Inf): one decay, then an endless period
    o = df.TrainingOptions(
        learn_rate_schedule="cosine",
        learn_rate_schedule_settings={"period": 4, "period_growth_factor": math.inf},
    )
    expected = [0.01 * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(4)]
    assert rates(o, 1, 7) == pytest.approx(expected + [0.01] * 3)
    growth = df.TrainingOptions(
        learn_rate_schedule="cosine",
        learn_rate_schedule_settings={"period": 4, "period_growth_factor": 2},
    )
    older = df.TrainingOptions(
        learn_rate_schedule="cosine",
        learn_rate_schedule_settings={"period": 4, "period_growth": 2},
    )
    assert rates(growth, 1, 13) == rates(older, 1, 13)
    with pytest.raises(df.OptionsError, match=r"'period_growth_factor'\] must be at least 1"):
        df.TrainingOptions(
            learn_rate_schedule="cosine",
            learn_rate_schedule_settings={"period_growth_factor": 0.5},
        )
    with pytest.raises(df.OptionsError) as raised:
        df.TrainingOptions(
            learn_rate_schedule="cosine",
            learn_rate_schedule_settings={"period_growth_factor": 2, "period_growth": 2},
        )
    message = str(raised.value)
    assert "'period_growth_factor' and 'period_growth'" in message
    assert "keep 'period_growth_factor'" in message


def test_cosine_refuses_a_factor_under_both_names():
    with pytest.raises(df.OptionsError) as raised:
        df.TrainingOptions(
            learn_rate_schedule="cosine",
            learn_rate_schedule_settings={"initial_factor": 2.0, "max_factor": 2.0},
        )
    message = str(raised.value)
    assert "'initial_factor' and 'max_factor'" in message and "keep 'initial_factor'" in message


def test_a_schedule_after_warmup_counts_its_own_steps_as_the_mathworks_page_says():
    # polynomialLearnRate's page: trained with {"warmup", schedule} (iteration units), at
    # training iteration 15 the schedule is at its 10th iteration, because the warm-up ran for
    # iterations 1 to 5; its first iteration (training iteration 6) uses InitialFactor.
    o = df.TrainingOptions(
        learn_rate_schedule=("warmup", "polynomial"),
        learn_rate_schedule_settings={
            "polynomial": {"frequency_unit": "iteration", "num_steps": 20}
        },
    )
    values = rates(o, 100, 15)
    assert values[5] == pytest.approx(0.01)  # iteration 6: the schedule's 1st step, k = 0 done
    assert values[14] == pytest.approx(0.01 * (1 - 9 / 20))  # its 10th step, 9 completed
