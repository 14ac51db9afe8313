"""How a judge is exported: ``ExportOptions``, built once by whoever exports (``clfjudge export``, ``make main``'s
export step, ``export_judge``'s keywords) and handed whole to the exporter of the judge's kind
(``kinds.EXPORTERS``: ``exporter(judge_dir, out_dir, options)``). An exporter refuses, with a one-line reason, every
option its kind cannot honour (``refuse``) rather than ignore it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .parity import ParityConfig


# the options only a verdict judge's export honours: the other kinds' exporters refuse them (``refuse``)
VERDICT_ONLY = {"openvino": "OpenVINO IR variants are made for verdict judges (others gate --provider openvino)",
                "obvious": "the obvious-pairs check is a verdict judge's"}


def _flag(name: str) -> dict[str, str]:
    return {"flag": name}


@dataclass(frozen=True)
class ExportOptions:
    """``int8``: also write a dynamic int8 copy, with the settings of ``isa`` ("auto": this CPU's) from
    ``int8_config`` (None: clfjudge/configs/int8.yaml). ``int4``: also write a weight-only int4 copy (None: the
    kind's default; a verdict judge writes one, the others do not). ``optimize``: also write a graph-optimized copy;
    ``opset``: the ONNX opset (None: the exporter's). ``source`` ("NAME[:N]") and ``n_records``: the parity gate's
    records (None: the card's sources, then parity.yaml's; parity.yaml's count); ``parity``: its thresholds (None:
    clfjudge/configs/parity.yaml). ``fallback``: when the gate refuses only lossy runs but passes fp32, write what
    passed and say why instead of failing. ``providers``: also gate the fp32 file as each of these runs it.
    ``model_input``: for a model without a judge card, how it reads (``judges.foreign``). ``trust_pickle``: allow the
    pickles the judge directory holds (runs code from it). A verdict judge's alone: ``openvino``, the OpenVINO IR
    variants to make where this machine can (``export.verdict_quant``; None: all of them, (): none); ``obvious``, a
    source or data file of pairs every lossy run must decide as fp32 does (None: no such check)."""

    int8: bool = field(default=False, metadata=_flag("--int8"))
    int4: bool | None = field(default=None, metadata=_flag("--int4"))
    optimize: bool = field(default=False, metadata=_flag("--optimize"))
    opset: int | None = field(default=None, metadata=_flag("--opset"))
    isa: str = field(default="auto", metadata=_flag("--isa"))
    int8_config: str | Path | None = field(default=None, metadata=_flag("int8_config"))
    source: str | None = field(default=None, metadata=_flag("--source"))
    n_records: int | None = field(default=None, metadata=_flag("--n"))
    parity: ParityConfig | None = field(default=None, metadata=_flag("--parity-config / --threshold"))
    fallback: bool = field(default=False, metadata=_flag("--fallback"))
    providers: tuple[str, ...] = field(default=(), metadata=_flag("--provider"))
    model_input: str | None = field(default=None, metadata=_flag("--model-input"))
    trust_pickle: bool = field(default=False, metadata=_flag("--trust-pickle"))
    openvino: tuple[str, ...] | None = field(default=None, metadata=_flag("--openvino"))
    obvious: str | None = field(default=None, metadata=_flag("--obvious"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "providers", tuple(self.providers))
        if self.openvino is not None:
            object.__setattr__(self, "openvino", tuple(self.openvino))
        if not self.int8 and (self.isa != "auto" or self.int8_config is not None):
            given = "isa" if self.isa != "auto" else "int8_config"
            raise ValueError(f"{self.flag(given)} {getattr(self, given)!r} chooses the int8 settings: it needs "
                             "--int8")
        if self.n_records is not None and self.n_records < 1:
            raise ValueError(f"--n must be a positive number of records, got {self.n_records}")

    @classmethod
    def of(cls, **options: Any) -> ExportOptions:
        """The options from ``export_judge``'s keywords; an unknown keyword is a TypeError naming the known ones."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(f"unknown export option(s) {unknown}; known: {', '.join(known)}")
        return cls(**options)

    def with_(self, **changes: Any) -> ExportOptions:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return replace(self, **changes)

    @classmethod
    def flag(cls, name: str) -> str:
        """How ``clfjudge export`` spells the option ``name`` (the field, for one it does not offer)."""
        return next(f.metadata.get("flag", name) for f in fields(cls) if f.name == name)

    def given(self) -> list[str]:
        """The options set to something other than their default."""
        return [f.name for f in fields(self)
                if getattr(self, f.name) != (f.default if f.default is not MISSING else f.default_factory())]

    def refuse(self, cannot: Mapping[str, str], what: str) -> None:
        """Refuse the first option given (``given``) that ``cannot`` names, with its reason: ``what`` says which
        judge, e.g. "JUDGE_DIR: a verdict judge"."""
        for name in self.given():
            if name in cannot:
                raise ValueError(f"{what} cannot honour {self.flag(name)} ({name}={getattr(self, name)!r}): "
                                 f"{cannot[name]}")
