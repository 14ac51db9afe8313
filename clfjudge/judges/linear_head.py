"""Fitted scikit-learn heads stored without pickles.

A judge directory someone sent you must not run their code when it is loaded. A linear head (logistic or
ridge regression behind a standard scaler and the per-column group weights) is nothing but arrays, so it is
stored as arrays (safetensors) and applied in NumPy: ``LinearHead``. A non-linear head (gradient boosting) is
stored with skops, whose loader rebuilds only an explicit list of trusted scikit-learn types. Judges written
before this (``head.joblib``) load only when the caller says it trusts the directory (``trust_pickle``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..untrusted import inside

LINEAR_FILE = "head.safetensors"
SKOPS_FILE = "head.skops"
PICKLE_FILE = "head.joblib"
# What skops may rebuild from a head file beyond its own defaults (scikit-learn estimators, NumPy arrays):
# the tree predictors inside a gradient-boosting head. Anything else in a file is refused on load.
SKOPS_TRUSTED = ("sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",)
# Where the functions a pickled head of clfjudge < 0.2 names by module path live now: its pipeline's
# FunctionTransformer holds ``clfjudge.embedding_judge.weight_columns``.
PICKLED_MODULES = {"clfjudge.embedding_judge": "clfjudge.judges.embedding"}


class PickleRefused(ValueError):
    """A judge directory whose head is a pickle, loaded without ``trust_pickle``."""


class LinearHead:
    """``x -> ((x - mean) / scale) * weights -> x @ coef.T + intercept`` and then softmax (several classes),
    a sigmoid (two classes, sklearn's binary logistic regression) or nothing (regression).

    The same arithmetic as the fitted scikit-learn pipeline, so predictions agree to float rounding; exposes
    ``predict_proba`` / ``predict`` / ``classes_`` / ``n_features_in_`` like the estimator it replaces."""

    def __init__(self, mean: np.ndarray, scale: np.ndarray, weights: np.ndarray, coef: np.ndarray,
                 intercept: np.ndarray, classes: np.ndarray | None) -> None:
        self.mean, self.scale, self.weights = (np.asarray(a, np.float64) for a in (mean, scale, weights))
        self.coef = np.atleast_2d(np.asarray(coef, np.float64))
        self.intercept = np.atleast_1d(np.asarray(intercept, np.float64))
        self.classes_ = None if classes is None else np.asarray(classes)
        self.n_features_in_ = self.mean.shape[0]
        if not (self.scale.shape == self.weights.shape == self.mean.shape == (self.coef.shape[1],)):
            raise ValueError(f"linear head arrays disagree: mean {self.mean.shape}, scale {self.scale.shape}, "
                             f"weights {self.weights.shape}, coef {self.coef.shape}")

    @property
    def is_classifier(self) -> bool:
        return self.classes_ is not None

    @classmethod
    def from_estimator(cls, estimator: Any) -> LinearHead | None:
        """The arrays of a fitted StandardScaler -> column weights -> LogisticRegression / Ridge pipeline (also
        inside a GridSearchCV); None for any other estimator."""
        from sklearn.model_selection import GridSearchCV
        from sklearn.pipeline import Pipeline

        if isinstance(estimator, GridSearchCV):
            estimator = estimator.best_estimator_
        if not isinstance(estimator, Pipeline) or len(estimator.steps) != 3:
            return None
        scaler, columns, model = (step for _, step in estimator.steps)
        if not hasattr(model, "coef_") or not hasattr(scaler, "mean_"):
            return None
        return cls(scaler.mean_, scaler.scale_, columns.kw_args["weights"], model.coef_, model.intercept_,
                   getattr(model, "classes_", None))

    def decision_function(self, x: np.ndarray) -> np.ndarray:
        z = ((np.asarray(x, np.float64) - self.mean) / self.scale) * self.weights
        return z @ self.coef.T + self.intercept

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        if not self.is_classifier:
            raise ValueError("a regression head has no class probabilities")
        z = self.decision_function(x)
        if self.coef.shape[0] == 1:  # binary logistic regression: P(classes_[1]) = sigmoid(z)
            p = 1 / (1 + np.exp(-z[:, 0]))
            return np.stack([1 - p, p], axis=1)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.is_classifier:
            return self.classes_[np.argmax(self.predict_proba(x), axis=1)]
        return self.decision_function(x)[:, 0]

    # -- files -------------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        from safetensors.numpy import save_file

        # safetensors writes the raw buffer: a strided view (sklearn's coef_ can be one) must be made contiguous
        arrays = {name: np.ascontiguousarray(getattr(self, name))
                  for name in ("mean", "scale", "weights", "coef", "intercept")}
        meta = {"classes": json.dumps(None if self.classes_ is None else self.classes_.tolist())}
        save_file(arrays, str(path), metadata=meta)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> LinearHead:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            arrays = {name: f.get_tensor(name) for name in f.keys()}
            meta = f.metadata() or {}
        missing = {"mean", "scale", "weights", "coef", "intercept"} - set(arrays)
        if missing:
            raise ValueError(f"{path}: linear head lacks arrays {sorted(missing)}")
        try:
            classes = json.loads(meta.get("classes", "null"))
        except ValueError:
            raise ValueError(f"{path}: metadata field 'classes' is not JSON") from None
        return cls(arrays["mean"], arrays["scale"], arrays["weights"], arrays["coef"], arrays["intercept"],
                   None if classes is None else np.asarray(classes))


def save_head(estimator: Any, directory: Path) -> dict[str, str]:
    """Write a fitted head into ``directory``; returns the judge card's runtime entries (file, format)."""
    linear = estimator if isinstance(estimator, LinearHead) else LinearHead.from_estimator(estimator)
    if linear is not None:
        linear.save(directory / LINEAR_FILE)
        return {"sklearn_model": LINEAR_FILE, "format": "safetensors-linear"}
    import skops.io

    skops.io.dump(estimator, directory / SKOPS_FILE)
    untrusted = sorted(set(skops.io.get_untrusted_types(file=directory / SKOPS_FILE)) - set(SKOPS_TRUSTED))
    if untrusted:
        (directory / SKOPS_FILE).unlink()
        raise ValueError(f"cannot store a {type(estimator).__name__} head safely: skops would need to trust "
                         f"{untrusted}")
    return {"sklearn_model": SKOPS_FILE, "format": "skops"}


def load_head(directory: Path, runtime: dict[str, Any], *, trust_pickle: bool = False) -> Any:
    """The head a judge directory holds. Never executes code from the directory unless ``trust_pickle``."""
    name, fmt = runtime.get("sklearn_model"), runtime.get("format")
    if not isinstance(name, str) or Path(name).name != name:
        raise ValueError(f"{directory / 'judge_card.json'}: field 'runtime.sklearn_model' must be a file name, "
                         f"got {name!r}")
    path = inside(directory, name, f"{directory / 'judge_card.json'} field 'runtime.sklearn_model'")
    if fmt == "safetensors-linear":
        return LinearHead.load(path)
    if fmt == "skops":
        import skops.io

        return skops.io.load(path, trusted=list(SKOPS_TRUSTED))
    if fmt == "joblib":
        if not trust_pickle:
            raise PickleRefused(
                f"{path} is a pickle (a judge saved by clfjudge < 0.2): loading it runs whatever code it holds. "
                "Load it only if you trust where the directory came from (trust_pickle=True / --trust-pickle), "
                "then re-save it to get a pickle-free head")
        import importlib
        import sys

        import joblib

        for old, new in PICKLED_MODULES.items():  # the pickle names the module by its old path
            sys.modules.setdefault(old, importlib.import_module(new))
        return joblib.load(path)
    raise ValueError(f"{directory / 'judge_card.json'}: field 'runtime.format' is {fmt!r}; known: "
                     "safetensors-linear, skops, joblib")
