"""The judge card: a JSON file (judge_card.json) beside every trained judge that says what it is.

Everything a loader, an exporter or an auditor needs to use a judge correctly lives here: backbone,
head, scheme, label map, max length and truncation policy, training sources with counts and
contamination removals, validation metrics, calibration, and library versions.
"""
from __future__ import annotations

import json
import platform
from dataclasses import MISSING, asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .data.records import RecordError
from .outputs import write_whole
from .untrusted import inside, read_json

CARD_NAME = "judge_card.json"
# The layout of judge_card.json. 1: the cards written before the key existed (no schema_version); 2: the key;
# 3: the judge kind in ``kind``, the fine-tuned head in ``head``, pair / point in ``arity``.
# A new version gets a step in ``_UPGRADES`` that turns a card of the version below into it.
SCHEMA_VERSION = 3
TASK_OF_ARITY = {"pair": "compare", "point": "score"}  # what a judge does with a record of the arity
ARITIES = tuple(TASK_OF_ARITY)


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("clfjudge", "torch", "transformers", "datasets", "sentence-transformers", "scikit-learn",
                "onnxruntime"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


@dataclass
class JudgeCard:
    kind: str  # the judge kind (clfjudge/kinds.py ``KINDS``: "fine-tuned", "embedding", "verdict", ...)
    arity: str  # what the judge answers: "pair" (compare) or "point" (score)
    backbone: str  # the spec the user gave (alias, hub id or path)
    scheme: str  # scheme name used to render inputs
    max_length: int
    head: str = ""  # the kind's head where it has several (the fine-tuned kind: "cls3", "regression", ...)
    label_map: dict[str, Any] = field(default_factory=dict)
    truncation: dict[str, Any] = field(default_factory=dict)
    template: str = ""  # the template text, for the record
    score_scale: list[float] | None = None  # pointwise judges
    training: dict[str, Any] = field(default_factory=dict)  # sources, counts, removals, hyperparameters
    validation: dict[str, Any] = field(default_factory=dict)  # metrics on the dev split
    calibration: dict[str, Any] = field(default_factory=dict)  # temperature, tie threshold
    runtime: dict[str, Any] = field(default_factory=dict)  # backend-specific files (onnx, sklearn, ...)
    versions: dict[str, str] = field(default_factory=library_versions)
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    schema_version: int = SCHEMA_VERSION  # the card's layout; a loaded older card is upgraded to this one

    def save(self, directory: str | Path) -> Path:
        """Write judge_card.json in the current layout (``SCHEMA_VERSION``), whole (a failed write leaves the old
        card)."""
        path = Path(directory) / CARD_NAME
        data = {**asdict(self), "schema_version": SCHEMA_VERSION}
        write_whole(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        return path

    @property
    def name(self) -> str:
        """The head where the kind has one, else the kind: what a judge is called in messages and reports."""
        return self.head or self.kind

    @classmethod
    def load(cls, directory: str | Path) -> JudgeCard:
        path = Path(directory) / CARD_NAME
        if not path.exists():
            raise FileNotFoundError(f"{directory} is not a judge directory: {CARD_NAME} is missing")
        # a card from anyone: size and nesting limited, and no link to a file elsewhere
        data = read_json(inside(directory, CARD_NAME, str(directory)), "judge card", shown=path)
        if not isinstance(data, dict):
            raise RecordError(str(path), None, None, f"a judge card is a JSON object, got {type(data).__name__}")
        data = _upgrade(path, data)
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{path}: unknown judge card fields {sorted(unknown)}")
        for name, spec in cls.__dataclass_fields__.items():
            _check_field(path, name, spec, data)
        if data["arity"] not in ARITIES:
            raise RecordError(str(path), None, "arity",
                              f"must be one of {', '.join(ARITIES)}, got {data['arity']!r:.80}")
        return cls(**data)


# The card's field types as written in the dataclass (annotations are strings here): what a loaded value must be.
_FIELD_TYPES = {"str": str, "int": int, "dict[str, Any]": dict, "dict[str, str]": dict,
                "list[float] | None": (list, type(None))}


def _check_field(path: Path, name: str, spec: Any, data: dict[str, Any]) -> None:
    if name not in data:
        if spec.default is MISSING and spec.default_factory is MISSING:
            raise RecordError(str(path), None, name, "is missing")
        return
    wanted = _FIELD_TYPES.get(spec.type)
    value = data[name]
    if wanted is not None and (not isinstance(value, wanted) or isinstance(value, bool)):
        raise RecordError(str(path), None, name, f"must be {spec.type}, got {type(value).__name__}: {value!r:.80}")


def _upgrade_1_to_2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 only adds ``schema_version`` (set by ``_upgrade``): every version-1 key reads as before."""
    return data


def _upgrade_2_to_3(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2's ``head`` held a judge kind's name or a fine-tuned head's, and ``kind`` held pair / point: now
    ``kind`` is the judge kind, ``head`` the head (fine-tuned kind only) and ``arity`` pair / point. A head that is
    no registered kind's nor any kind's head was a kind's name (one registered later, or not at all: ``Judge.load``
    names it)."""
    from .kinds import kind_of

    head, arity = data.pop("head", None), data.pop("kind", None)
    if arity is not None:
        data["arity"] = arity
    if not isinstance(head, str):  # missing or malformed: refused by the field checks, naming "kind"
        return data if head is None else {**data, "kind": head}
    try:
        kind = kind_of(head)
    except ValueError:
        kind = head
    return {**data, "kind": kind, **({"head": head} if head != kind else {})}


# version v -> the step that turns a card of version v into one of version v + 1
_UPGRADES = {1: _upgrade_1_to_2, 2: _upgrade_2_to_3}


def _upgrade(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """A loaded card in the current layout: a card without ``schema_version`` is version 1; an older version is
    upgraded step by step; a newer one (written by a later clfjudge) is refused rather than misread."""
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RecordError(str(path), None, "schema_version", f"must be an int >= 1, got {version!r:.80}")
    if version > SCHEMA_VERSION:
        raise RecordError(str(path), None, "schema_version",
                          f"is {version}, newer than the {SCHEMA_VERSION} this clfjudge reads: the judge was saved "
                          f"by a later clfjudge; upgrade clfjudge to load it")
    for step in range(version, SCHEMA_VERSION):
        data = _UPGRADES[step](dict(data))
    return {**data, "schema_version": SCHEMA_VERSION}
