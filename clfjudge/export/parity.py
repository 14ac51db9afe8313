"""The parity gate's thresholds and slice (clfjudge/configs/parity.yaml): ``Thresholds`` per precision (fp32,
int8, int4, bf16) and ``ParityConfig``, read from the YAML with ``PRECISION.KEY=VALUE`` overrides (``clfjudge export
--threshold``). ``export.gate`` runs the gate with them."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..configs import config_path

PARITY_CONFIG = config_path("parity.yaml")


@dataclass(frozen=True)
class Thresholds:
    """Parity thresholds of one precision; None = not gated (still measured and reported)."""

    max_abs_diff: float | None = None  # max |ONNX logit - PyTorch logit|
    min_agreement: float | None = None  # fraction of identical decisions
    max_metric_delta: float | None = None  # |metric(ONNX) - metric(PyTorch)|, metric as a fraction (0.01 = 1 point)
    boundary_eps: float | None = None  # records whose PyTorch decision is this close to flipping are not compared
    min_cosine: float | None = None  # embedding judges: the smallest cosine of an ONNX feature vector with PyTorch's
    batch_tolerance: float | None = None  # stated in the card, not gated: how far a row moves in another batch

    def failures(self, measured: Mapping[str, float]) -> list[str]:
        out = []
        for key, what in (("min_cosine", "feature cosine"), ("shared_min_cosine", "shared-prefix feature cosine")):
            if self.min_cosine is not None and key in measured and not measured[key] >= self.min_cosine:
                out.append(f"{what} {measured[key]:.6f} < min_cosine {self.min_cosine:g}")
        if self.max_abs_diff is not None and not measured["max_abs_diff"] <= self.max_abs_diff:
            out.append(f"max |logit diff| {measured['max_abs_diff']:.3g} > max_abs_diff {self.max_abs_diff:g}")
        if self.min_agreement is not None and not measured["agreement"] >= self.min_agreement:
            out.append(f"decision agreement {measured['agreement']:.2%} < min_agreement {self.min_agreement:.2%}")
        if self.max_metric_delta is not None and not abs(measured["metric_delta"]) <= self.max_metric_delta:
            out.append(f"|{measured['metric']} delta| {abs(measured['metric_delta']):.4f} > max_metric_delta "
                       f"{self.max_metric_delta:g}")
        return out


@dataclass(frozen=True)
class ParityConfig:
    thresholds: dict[str, Thresholds]  # precision ("fp32" | "int8" | "bf16") -> thresholds
    n_records: int = 128
    seed: int = 0
    batch_size: int = 8
    default_sources: dict[str, list[str]] = field(default_factory=dict)  # arity (pair / point) -> sources to try
    budget_tflop: float | None = None  # compute one run of the gate may take; None: n_records always
    min_records: int = 16  # the budget never cuts the slice below this

    @classmethod
    def load(cls, path: str | Path = PARITY_CONFIG, overrides: Sequence[str] = ()) -> ParityConfig:
        """Read parity.yaml; ``overrides`` are ``PRECISION.KEY=VALUE`` strings (e.g. ``fp32.max_abs_diff=0``)."""
        import yaml

        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
        known = {f.name for f in fields(Thresholds)}
        thresholds: dict[str, dict[str, Any]] = {}
        for precision, values in (raw.get("thresholds") or {}).items():
            unknown = set(values or {}) - known
            if unknown:
                raise ValueError(f"{path}: thresholds.{precision}: unknown key(s) {sorted(unknown)}; "
                                 f"known: {sorted(known)}")
            thresholds[precision] = dict(values or {})
        for item in overrides:
            key, sep, value = item.partition("=")
            precision, dot, name = key.strip().partition(".")
            if not sep or not dot or name not in known:
                raise ValueError(f"--threshold {item!r}: expected PRECISION.KEY=VALUE with KEY in {sorted(known)}")
            parsed = None if value.strip().lower() in ("none", "null") else float(value)
            thresholds.setdefault(precision, {})[name] = parsed
        validation = raw.get("validation") or {}
        return cls(
            thresholds={p: Thresholds(**{k: None if v is None else float(v) for k, v in t.items()})
                        for p, t in thresholds.items()},
            n_records=int(validation.get("n_records", 128)),
            seed=int(validation.get("seed", 0)),
            batch_size=int(validation.get("batch_size", 8)),
            default_sources={k: list(v) for k, v in (validation.get("default_sources") or {}).items()},
            budget_tflop=None if validation.get("budget_tflop") is None else float(validation["budget_tflop"]),
            min_records=int(validation.get("min_records", 16)),
        )

    def for_precision(self, precision: str) -> Thresholds:
        if precision not in self.thresholds:
            raise ValueError(f"parity config has no thresholds for {precision!r} (has {sorted(self.thresholds)})")
        return self.thresholds[precision]
