"""Audit judges: one small adapter per kind of judge, all giving predictions on the audit's test sets.

A judge spec names the adapter by prefix (``released:``, ``gen:``, ``baseline:``, ``semscore``); anything else
is a judge directory (PyTorch, ONNX, embedding or generative). Adding a kind is one adapter class and one registry
line. Every adapter answers, per test set, with ``Predictions`` or with a reason it does not apply (reported as n/a,
never as zero).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..data.records import PairRecord, PointRecord, Verdict
from ..metrics import longer_answer_wins, majority_class, shorter_answer_wins
from ..options import LoadOptions
from ..registry import Registry


@dataclass
class Predictions:
    """A judge's output on one test set, aligned with its records.

    Pair sets: ``forward`` verdicts, ``reversed`` verdicts on the swapped pairs (in the swapped order's terms;
    None when the judge was not run that way), ``margin`` = how strongly answer A is preferred (for length
    correlations). Point sets: ``scores``. ``None`` entries are parse failures (counted, never scored).
    ``transform`` says how a judge of the other arity was applied ("" = native).
    """

    forward: list[Verdict | None] | None = None
    reversed: list[Verdict | None] | None = None
    margin: list[float] | None = None
    scores: list[float | None] | None = None
    transform: str = ""
    truncation: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    seen_in_training: bool = False  # the judge was trained on records of this set (not out-of-distribution)

    def to_json(self) -> dict[str, Any]:
        def verdicts(vs):
            return None if vs is None else [None if v is None else v.value for v in vs]

        return {"forward": verdicts(self.forward), "reversed": verdicts(self.reversed), "margin": self.margin,
                "scores": self.scores, "transform": self.transform, "truncation": self.truncation,
                "notes": self.notes, "seen_in_training": self.seen_in_training}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Predictions:
        def verdicts(vs):
            return None if vs is None else [None if v is None else Verdict(v) for v in vs]

        return cls(forward=verdicts(data["forward"]), reversed=verdicts(data["reversed"]), margin=data["margin"],
                   scores=data["scores"], transform=data["transform"], truncation=data["truncation"],
                   notes=data["notes"], seen_in_training=data.get("seen_in_training", False))


class NotApplicable(Exception):
    """This judge has nothing to say on this set (e.g. a released judge's file covers another test set)."""


class AuditJudge:
    """Base: ``name`` for tables; ``predict(set_name, arity, records)`` -> Predictions or NotApplicable."""

    name: str

    def predict(self, set_name: str, arity: str, records: Sequence[PairRecord | PointRecord]) -> Predictions:
        raise NotImplementedError


def trained_on(card) -> set[str]:
    """Names of the sources a judge card says the judge was trained on (and the resolved paths of its user data)."""
    train = (card.training.get("sources") or {}).get("train") or {}
    return set(train) | {stats["data"]["path"] for stats in train.values()
                         if isinstance(stats, dict) and (stats.get("data") or {}).get("path")}


def seen_in_training(card, set_name: str, records: Sequence[PairRecord | PointRecord]) -> bool:
    """Whether the judge was trained on records of this set: by content where the card lists its training split's
    (``data.splits.content_key``: the same pairs under another name or file are found), else by name or by the
    file the records came from."""
    from ..data.splits import CONTENT_KEY, content_key

    content = card.training.get("content") or {}
    if content.get("key") == CONTENT_KEY and isinstance(content.get("train"), str):
        trained_keys = set(content["train"].split())
        return any(content_key(r) in trained_keys for r in records)
    trained = trained_on(card)
    if set_name in trained:
        return True
    source = records[0].source if records else ""
    return bool(source) and (source in trained or str(Path(source).resolve()) in trained)


def _swapped_verdicts(verdicts: Sequence[Verdict | None]) -> list[Verdict | None]:
    """What a position-invariant judge says on the swapped pairs, in the swapped order's own terms."""
    return [None if v is None else v.swapped() for v in verdicts]


class BaselineJudge(AuditJudge):
    """A judge defined by a rule on the record (longer answer wins; the test set's majority class)."""

    def __init__(self, name: str, rule: Callable[[Sequence[PairRecord]], list[Verdict]],
                 point_rule: Callable[[PointRecord], float] | None,
                 margin_rule: Callable[[PairRecord], float] | None = None) -> None:
        self.name, self.rule, self.point_rule, self.margin_rule = name, rule, point_rule, margin_rule

    def predict(self, set_name, arity, records):
        if arity == "point":
            if self.point_rule is None:
                raise NotApplicable("no pointwise form")
            return Predictions(scores=[self.point_rule(r) for r in records])
        forward = self.rule(records)
        reversed_ = self.rule([r.swapped() for r in records])
        margin = None if self.margin_rule is None else [self.margin_rule(r) for r in records]
        return Predictions(forward=forward, reversed=reversed_, margin=margin)


class ReleasedJudgeFile(AuditJudge):
    """A released judge's prediction file: it covers only the test set it was released with."""

    def __init__(self, name: str) -> None:
        from .released import RELEASED

        self.released = RELEASED.get(name)
        self.name = name

    def predict(self, set_name, arity, records):
        if set_name != self.released.test_source:
            raise NotApplicable(f"its released outputs cover {self.released.test_source} only")
        preds = self.released.load()
        pos = {rid: i for i, rid in enumerate(preds.ids)}
        missing = [r.id for r in records if r.id not in pos]
        if missing:
            raise ValueError(f"released:{self.name}: no prediction for {len(missing)} records (e.g. {missing[:3]})")
        order = [pos[r.id] for r in records]
        rev = None if preds.reversed_verdicts is None else [preds.reversed_verdicts[i] for i in order]
        n_failed = sum(preds.verdicts[i] is None for i in order)
        notes = [f"{n_failed} unparsed output(s), counted wrong"] if n_failed else []
        return Predictions(forward=[preds.verdicts[i] for i in order], reversed=rev, notes=notes)


class SemScoreJudge(AuditJudge):
    """SemScore (all-mpnet-base-v2 cosine to the reference answer): a reference-based point judge; on pairs
    with a reference it compares the two answers' similarities."""

    name = "semscore"

    def __init__(self) -> None:
        from .semscore import SemScore

        self.semscore = SemScore()

    def predict(self, set_name, arity, records):
        if not all(r.reference for r in records):
            raise NotApplicable("needs a reference answer, this set has none")
        if arity == "point":
            return Predictions(scores=[float(s) for s in self.semscore.score_records(records)])
        both = self.semscore.similarity([*(r.answer_a for r in records), *(r.answer_b for r in records)],
                                        [r.reference for r in records] * 2)  # one call: each reference read once
        sim_a, sim_b = both[:len(records)], both[len(records):]
        forward = [Verdict.from_scores(a, b) for a, b in zip(sim_a, sim_b)]
        return Predictions(forward=forward, reversed=_swapped_verdicts(forward),
                           margin=list(map(float, sim_a - sim_b)), transform="grade each answer, compare")


class RuntimeJudge(AuditJudge):
    """A ``clfjudge.judges.base.Judge`` of any kind (PyTorch, ONNX, embedding, generative).

    Pair judges on point sets use ``schemes.point_to_pair``'s pairwise->pointwise transform (reference as answer 1; the
    prediction is P(answer 2) - P(answer 1)); point judges on pair sets grade each answer (rounded to the
    scale) and compare, equal -> tie. A generative judge's outputs that did not parse stay None (and its
    comparisons have a margin only when every one parsed); how many there were is in the notes.
    """

    def __init__(self, judge, name: str) -> None:
        self.judge, self.name = judge, name

    def _truncation_start(self) -> None:
        from ..prompts.truncation import TruncationReport

        encoder = getattr(self.judge, "encoder", None)
        if encoder is not None:
            encoder.report = TruncationReport()

    def _truncation(self) -> dict[str, Any] | None:
        encoder = getattr(self.judge, "encoder", None)
        return None if encoder is None else encoder.report.to_dict()

    def predict(self, set_name, arity, records):
        self._truncation_start()
        if arity == "pair":
            preds = self._pairs(records)
        else:
            preds = self._points(records)
        preds.truncation = self._truncation()
        preds.seen_in_training = seen_in_training(self.judge.card, set_name, records)
        return preds

    def _parse_notes(self, results: Sequence[Any]) -> list[str]:
        """For a judge that writes its verdict (its results carry the generated text): how many did not parse."""
        if not any(r.generated is not None for r in results):
            return []
        failed = sum(not r.parsed for r in results)
        return [f"{failed} outputs did not parse ({self.judge.card.label_map.get('parser', 'its parser')})"]

    def _pairs(self, records: Sequence[PairRecord]) -> Predictions:
        if "compare" in self.judge.tasks:
            fwd = self.judge.compare_batch(records)
            rev = self.judge.compare_batch([r.swapped() for r in records])
            margin = [c.p_a - c.p_b if c.margin is None else c.margin for c in fwd]
            return Predictions(forward=[c.verdict for c in fwd], reversed=[c.verdict for c in rev],
                               margin=margin if all(c.parsed for c in fwd) else None,
                               notes=self._parse_notes([*fwd, *rev]))
        from ..prompts.schemes import pair_to_points, points_to_verdict

        # the answers are graded unseen, so any gold score pair stays out of the points
        points = [p for r in records for p in pair_to_points(replace(r, scores=None))]
        results = self.judge.score_batch(points)
        scores = np.asarray([s.value for s in results]).reshape(-1, 2)  # NaN: not parsed
        graded = np.rint(scores)  # grades compared as integers (as the paper does), so near-equal answers tie
        forward = [points_to_verdict(*(None if np.isnan(x) else x for x in row)) for row in graded]
        margin = None if np.isnan(scores).any() else list(map(float, scores[:, 0] - scores[:, 1]))
        return Predictions(forward=forward, reversed=_swapped_verdicts(forward), margin=margin,
                           transform="w/ trans: grade each answer (rounded), compare",
                           notes=self._parse_notes(results))

    def _points(self, records: Sequence[PointRecord]) -> Predictions:
        if "score" in self.judge.tasks:
            results = self.judge.score_batch(records)
            return Predictions(scores=[s.value if s.parsed else None for s in results],
                               notes=self._parse_notes(results))
        from ..prompts.schemes import point_to_pair

        if not all(r.reference for r in records):
            raise NotApplicable("a pairwise judge grades pointwise data against a reference; this set has none")
        comparisons = self.judge.compare_batch([point_to_pair(r) for r in records])
        return Predictions(scores=[c.p_b - c.p_a if c.parsed else None for c in comparisons],
                           transform="w/ trans: reference as answer 1, score = P(answer 2) - P(answer 1)",
                           notes=self._parse_notes(comparisons))


class DirectoryJudge(RuntimeJudge):
    """A judge directory of any kind, loaded by ``clfjudge.judges.base.Judge.load`` (``options``: its
    ``LoadOptions``, e.g. threads and provider for a judge on a Ray actor)."""

    def __init__(self, directory: str | Path, options: LoadOptions | None = None) -> None:
        from ..judges.base import Judge
        from ..judges.foreign import write_card

        self.directory = Path(directory)
        judge = Judge.load(directory, options or LoadOptions())
        write_card(self.directory, judge.card)  # a model without a card gets the one it was read with
        super().__init__(judge, self.display_name(self.directory, judge.card))

    @staticmethod
    def display_name(directory: Path, card) -> str:
        """The judge's name in the report, from its directory and card (no need to load the model)."""
        onnx = card.runtime.get("onnx", {}) if card.runtime.get("backend") == "onnx" else {}
        run = onnx.get("served") or {"file": onnx.get("primary", ""), "provider": "cpu"}  # what provider auto runs
        variant = run["file"] + (f" @ {run['provider']}" if run["file"] and run["provider"] != "cpu" else "")
        return f"{directory.name} ({card.name}, {card.backbone}{', ' + variant if variant else ''})"


def _generative(rest: str) -> AuditJudge:
    """``gen:BACKBONE@SCHEME``: any causal LM, zero-shot, in a scheme that has a parser (e.g.
    ``gen:smollm2-135m@pandalm-pair``). ``gen:DIR`` is a deprecated alias of the plain directory spec ``DIR``."""
    backbone, _, scheme = rest.partition("@")
    if not scheme:
        return DirectoryJudge(backbone)
    from ..judges.generative import GenerativeJudge

    return RuntimeJudge(GenerativeJudge.zero_shot(backbone, scheme), f"gen:{backbone} zero-shot")


def _baseline(name: str) -> AuditJudge:
    rules = {
        "longer": ("baseline:longer", longer_answer_wins, lambda r: float(np.log1p(len(r.answer))),
                   lambda r: float(np.log1p(len(r.answer_a)) - np.log1p(len(r.answer_b)))),
        "shorter": ("baseline:shorter", shorter_answer_wins, lambda r: -float(np.log1p(len(r.answer))),
                    lambda r: float(np.log1p(len(r.answer_b)) - np.log1p(len(r.answer_a)))),
        "majority": ("baseline:majority", majority_class, None, None),  # no margin: a constant verdict
    }
    if name not in rules:
        raise KeyError(f"unknown baseline {name!r}; known: {sorted(rules)}")
    return BaselineJudge(*rules[name])


# prefix -> builder(rest of the spec); a spec without a known prefix is a judge directory.
AUDIT_JUDGES: Registry[Callable[[str], AuditJudge]] = Registry("audit judge")  # spec prefix -> builder
AUDIT_JUDGES.register("released", ReleasedJudgeFile)
AUDIT_JUDGES.register("baseline", _baseline)
AUDIT_JUDGES.register("semscore", lambda _rest: SemScoreJudge())
AUDIT_JUDGES.register("gen", _generative)


def _prefixed(spec: str) -> tuple[str, str] | None:
    """(prefix, rest) of a spec that names a registered audit judge (AUDIT_JUDGES); None for a judge directory."""
    prefix, _, rest = spec.partition(":")
    return (prefix, rest) if prefix in AUDIT_JUDGES and (rest or prefix == "semscore") else None


def judge_directory(spec: str) -> Path | None:
    """The judge directory a spec names (``DIR``, or the deprecated ``gen:DIR``), or None for the other kinds
    (those ``clfjudge audit --engine ray`` does not send to Ray)."""
    prefixed = _prefixed(spec)
    if prefixed is not None:
        return Path(prefixed[1]) if prefixed[0] == "gen" and "@" not in prefixed[1] else None
    return Path(spec) if Path(spec).is_dir() else None


def check_spec(spec: str) -> None:
    """Refuse, before anything is loaded, a spec that names neither an audit judge, nor a directory, nor a hub id."""
    from ..judges.foreign import is_hub_id

    if _prefixed(spec) is None and not Path(spec).is_dir() and not is_hub_id(spec):
        raise FileNotFoundError(f"judge {spec!r} is neither a judge directory nor one of "
                                f"{', '.join(p + ':...' for p in AUDIT_JUDGES.names())}")


def predict_or_reason(judge: AuditJudge, set_name: str, arity: str,
                      records: Sequence[PairRecord | PointRecord]) -> Predictions | str:
    """A judge's predictions on one test set, or the reason it does not apply (``NotApplicable``)."""
    try:
        return judge.predict(set_name, arity, records)
    except NotApplicable as why:
        return str(why)


def build_judge(spec: str, load: LoadOptions = LoadOptions()) -> AuditJudge:
    """The audit judge a spec names; a judge directory loaded with ``load``."""
    prefixed = _prefixed(spec)
    if prefixed is not None:
        return AUDIT_JUDGES.get(prefixed[0])(prefixed[1])
    check_spec(spec)
    return DirectoryJudge(spec, load)
