"""Metrics against hand-computed values; streaming equals one-shot; names and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df

# 6 observations, 3 classes; predicted classes 0, 1, 1, 2, 2, 0; true classes 0, 1, 2, 2, 0, 0
SCORES = jnp.array(
    [
        [0.8, 0.1, 0.1],
        [0.2, 0.7, 0.1],
        [0.3, 0.4, 0.3],
        [0.1, 0.1, 0.8],
        [0.2, 0.2, 0.6],
        [0.5, 0.4, 0.1],
    ]
)
LABELS = jnp.array([0, 1, 2, 2, 0, 0])


def test_accuracy_is_a_percentage():
    assert float(df.metrics.accuracy(SCORES, LABELS)) == pytest.approx(100 * 4 / 6)
    assert float(df.metrics.accuracy(SCORES, jax.nn.one_hot(LABELS, 3))) == pytest.approx(
        100 * 4 / 6
    )


def test_precision_recall_fscore_are_macro_averages():
    # class 0: predicted {0, 5}, true {0, 4, 5} -> P 2/2, R 2/3
    # class 1: predicted {1, 2}, true {1}       -> P 1/2, R 1/1
    # class 2: predicted {3, 4}, true {2, 3}    -> P 1/2, R 1/2
    precision = (1 + 0.5 + 0.5) / 3
    recall = (2 / 3 + 1 + 0.5) / 3
    f1 = [2 * p * r / (p + r) for p, r in [(1, 2 / 3), (0.5, 1), (0.5, 0.5)]]
    assert float(df.metrics.precision(SCORES, LABELS)) == pytest.approx(precision)
    assert float(df.metrics.recall(SCORES, LABELS)) == pytest.approx(recall)
    assert float(df.metrics.fscore(SCORES, LABELS)) == pytest.approx(sum(f1) / 3)


def test_classes_absent_from_targets_and_predictions_are_not_averaged():
    scores = jnp.array([[0.9, 0.1, 0.0], [0.1, 0.9, 0.0]])
    labels = jnp.array([0, 1])
    assert float(df.metrics.precision(scores, labels)) == pytest.approx(1.0)


def test_binary_metrics_for_one_output_channel_are_for_the_positive_class():
    scores = jnp.array([[0.9], [0.8], [0.3], [0.6]])
    labels = jnp.array([1, 0, 0, 1])
    # predicted positive: {0, 1, 3}; true positive: {0, 3}
    assert float(df.metrics.precision(scores, labels)) == pytest.approx(2 / 3)
    assert float(df.metrics.recall(scores, labels)) == pytest.approx(1.0)
    assert float(df.metrics.accuracy(scores, labels)) == pytest.approx(75.0)


def test_auc_matches_the_pairwise_definition():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(200, 4))
    labels = rng.integers(0, 4, size=200)
    logits[np.arange(200), labels] += 1.0
    scores = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    expected = []
    for c in range(4):
        pos, neg = scores[labels == c, c], scores[labels != c, c]
        wins = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
        expected.append(wins)
    value = float(df.metrics.auc(jnp.asarray(scores, jnp.float32), jnp.asarray(labels)))
    assert value == pytest.approx(np.mean(expected), abs=2e-3)


def test_rmse():
    assert float(df.metrics.rmse(jnp.array([[1.0, 2.0], [3.0, 4.0]]), jnp.zeros((2, 2)))) == (
        pytest.approx(np.sqrt(30 / 4))
    )


@pytest.mark.parametrize("name", ["accuracy", "precision", "recall", "fscore", "auc", "rmse"])
def test_streaming_over_batches_equals_one_pass(name):
    from difffn._scoring._metrics import get_metric

    metric = get_metric(name)
    targets = LABELS if name != "rmse" else jax.nn.one_hot(LABELS, 3)
    whole = float(metric(SCORES, targets))
    update = jax.jit(metric.update)
    state = metric.init(SCORES)
    for start in range(0, 6, 4):
        state = update(state, SCORES[start : start + 4], targets[start : start + 4])
    assert float(metric.compute(state)) == pytest.approx(whole, rel=1e-6)


def test_metrics_read_the_format():
    y = df.dlarray(SCORES.T, "CB")
    assert float(df.metrics.accuracy(y, LABELS)) == pytest.approx(100 * 4 / 6)


def test_custom_metric_class_and_callable():
    class Count(df.metrics.Metric):
        name, title, maximize = "count", "Count", True

        def init(self, Y):
            return jnp.zeros(())

        def update(self, state, Y, T):
            return state + Y.shape[0]

        def compute(self, state):
            return state

    assert float(Count()(SCORES, LABELS)) == 6
    fm = df.metrics.FunctionMetric(lambda y, t: jnp.mean(y), name="mean_score")
    assert fm.name == "mean_score" and fm.maximize is False
    assert float(fm(SCORES, LABELS)) == pytest.approx(float(jnp.mean(SCORES)))


def test_unknown_metric_lists_the_names():
    with pytest.raises(df.OptionsError, match="accuracy.*precision.*rmse"):
        df.TrainingOptions(metrics="acuracy")


def test_class_labels_out_of_range_are_named_and_integer_one_hot_is_one_hot():
    with pytest.raises(
        df.OptionsError, match=r"accuracy: the targets are class labels 1\.\.3.*1-based"
    ):
        df.metrics.accuracy(SCORES, jnp.array([1, 2, 3, 3, 1, 1]))
    with pytest.raises(df.OptionsError, match=r"auc: the targets hold the class label -1"):
        df.metrics.auc(SCORES, jnp.array([0, 1, 2, 2, 0, -1]))
    true = jnp.array([0, 1, 2, 2, 0, 0])
    one_hot = jax.nn.one_hot(true, 3)
    for metric in (df.metrics.accuracy, df.metrics.fscore, df.metrics.auc):
        assert float(metric(SCORES, one_hot.astype(jnp.int32))) == float(metric(SCORES, true))
