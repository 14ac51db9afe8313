"""Heads stored without pickles: linear heads as arrays, gradient boosting through skops with a trusted-types
list, old joblib heads only on request; a planted pickle is never executed by default."""
from __future__ import annotations

import numpy as np
import pytest

from clfjudge.judges.embedding import PAIR_HEADS, POINT_HEADS
from clfjudge.judges.linear_head import LinearHead, load_head, save_head

RNG = np.random.default_rng(0)
X = RNG.normal(size=(120, 7))
WEIGHTS = np.array([1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 2.0])
GROUPS = np.arange(120) % 30


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("c", [0.1, "auto"])
def test_linear_head_predicts_as_the_fitted_logistic_pipeline(n_classes, c, tmp_path):
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int) + (n_classes == 3) * (X[:, 2] > 1)
    fitted = PAIR_HEADS.get("logreg")({"C": c}, 0, WEIGHTS, GROUPS).fit(X, y)
    head = LinearHead.from_estimator(fitted)
    np.testing.assert_allclose(head.predict_proba(X), fitted.predict_proba(X), atol=1e-10)
    np.testing.assert_array_equal(head.predict(X), fitted.predict(X))
    stored = save_head(head, tmp_path)
    assert stored == {"sklearn_model": "head.safetensors", "format": "safetensors-linear"}
    loaded = load_head(tmp_path, stored)
    np.testing.assert_array_equal(loaded.predict_proba(X), head.predict_proba(X))
    assert list(loaded.classes_) == list(fitted.classes_) and loaded.n_features_in_ == 7


def test_linear_head_regression_round_trip(tmp_path):
    y = X @ np.arange(7.0) + 3
    fitted = POINT_HEADS.get("ridge")({}, 0, WEIGHTS, GROUPS).fit(X, y)
    loaded = load_head(tmp_path, save_head(fitted, tmp_path))
    np.testing.assert_allclose(loaded.predict(X), fitted.predict(X), atol=1e-9)
    with pytest.raises(ValueError, match="no class probabilities"):
        loaded.predict_proba(X)


def test_gradient_boosting_goes_through_skops_with_trusted_types(tmp_path):
    y = (X[:, 0] > 0).astype(int)
    fitted = PAIR_HEADS.get("gbdt")({"max_iter": 10}, 0, WEIGHTS, GROUPS).fit(X, y)
    stored = save_head(fitted, tmp_path)
    assert stored["format"] == "skops" and not (tmp_path / "head.joblib").exists()
    np.testing.assert_array_equal(load_head(tmp_path, stored).predict_proba(X), fitted.predict_proba(X))


def test_a_card_cannot_point_outside_the_directory(tmp_path):
    with pytest.raises(ValueError, match="must be a file name"):
        load_head(tmp_path, {"sklearn_model": "../elsewhere.safetensors", "format": "safetensors-linear"})
    with pytest.raises(ValueError, match="field 'runtime.format'"):
        load_head(tmp_path, {"sklearn_model": "head.bin", "format": "exec"})
