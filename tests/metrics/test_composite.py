import jax.numpy as jnp
import numpy as np
import pytest

from ember import Engine
from ember.metrics import Average, ConfusionMatrix, MetricsLambda, Precision, Recall, Sum


def test_f1_from_precision_and_recall_attaches_alone():
    """F1 = 2PR/(P+R) attached alone puts only F1 in state.metrics, and each dependency updates once."""
    precision, recall = Precision(average=None), Recall(average=None)
    f1 = (2 * precision * recall / (precision + recall)).mean()
    engine = Engine(lambda e, batch: batch)
    f1.attach(engine, "f1")
    y_pred = jnp.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
    state = engine.run([{"y_pred": y_pred, "y": jnp.array([0, 1, 1, 1])}] * 2)
    assert list(state.metrics) == ["f1"]
    p, r = np.array([0.5, 1.0]), np.array([1.0, 2 / 3])
    assert state.metrics["f1"] == pytest.approx(np.mean(2 * p * r / (p + r)))


def test_arithmetic_indexing_and_method_calls():
    """+ - * / ** // %, negation, indexing and method calls on the computed value build lazy metrics."""
    total, mean = Sum(), Average()
    for m in (total, mean):
        m.update(jnp.array([1.0, 2.0, 3.0]))
    assert (total + 1).compute() == 7.0
    assert (1 - total).compute() == -5.0
    assert (total * mean).compute() == 12.0
    assert (total / mean).compute() == 3.0
    assert (mean**2).compute() == 4.0
    assert (2**mean).compute() == 4.0
    assert (total // 4).compute() == 1.0
    assert (total % 4).compute() == 2.0
    assert (-mean).compute() == -2.0
    cm = ConfusionMatrix(num_classes=2)
    cm.update((jnp.array([[0.9, 0.1], [0.3, 0.7]]), jnp.array([0, 0])))
    assert cm[0].compute().tolist() == [1, 1]
    assert cm.sum().compute() == 2
    assert cm.sum(axis=0).compute().tolist() == [1, 1]
    with pytest.raises(AttributeError, match=r"'Sum' object has no attribute 'comput'"):
        total.comput()  # the attribute error is the test


def test_a_shared_dependency_updates_once_and_reset_resets_it():
    """A metric used twice in one expression is updated once per update of the composite."""
    total = Sum()
    double = total + total
    double.update(jnp.array([1.0, 2.0]))
    assert double.compute() == 6.0
    double.reset()
    with pytest.raises(RuntimeError, match=r"computed before any update"):
        double.compute()
    assert repr(double).startswith("MetricsLambda(add")
    with pytest.raises(TypeError, match=r"`fn` must be callable"):
        MetricsLambda(3, total)  # type: ignore[arg-type]


def test_removing_a_composite_detaches_the_parts_nothing_else_uses():
    """The handle of (a + b) stops writing it and detaches a; b stays, for it is attached by name too."""
    import jax.numpy as jnp

    from ember import Engine
    from ember.metrics import Sum

    engine = Engine(lambda e, batch: jnp.asarray(batch, jnp.float32))
    a, b = Sum(), Sum()
    b.attach(engine, "b")
    handle = (a + b).attach(engine, "a_plus_b")
    assert engine.run([[1.0, 2.0]]).metrics == {"b": 3.0, "a_plus_b": 6.0}
    handle.remove()
    assert (a.is_attached(engine), b.is_attached(engine, "b")) == (False, True)
    assert engine.run([[4.0]]).metrics == {"b": 4.0}
