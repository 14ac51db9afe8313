"""Evaluation schemes as data: prompt templates with named slots, loaded from ``templates/*.yaml``.

A scheme says which records it shows (its arity: ``pair`` or ``point``), how each field is shown (the template
and per-slot formatting: a slot's text around the value, a default for a missing rubric, a section left out
when the record has no reference), the chat wrapper a released checkpoint needs, and for generative use the
parser of the judge's output and how a label is written as target text. ``render`` is the only way a record
becomes judge input; ``target`` the only way a label becomes judge output text.

Also here: the cross-scheme transforms (``pair_to_points``, ``points_to_verdict``, ``point_to_pair``) of "An
Empirical Study of LLM-as-a-Judge for LLM Evaluation: Fine-tuned Judge Models are Task-specific Classifiers"
(the Empirical Study below), Sec. 2.2.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..data.records import Loc, PairRecord, PointRecord, Record, RecordError, Verdict
from ..registry import Registry
from .parsers import PARSERS

TEMPLATES_DIR = Path(__file__).with_name("templates")
SLOTS = {
    "pair": ("question", "answer_a", "answer_b", "rubric", "reference"),
    "point": ("question", "answer", "rubric", "reference"),
}
REQUIRED_SLOTS = {"pair": ("question", "answer_a", "answer_b"), "point": ("question", "answer")}
TARGET_SLOTS = {"pair": ("verdict", "score_a", "score_b"), "point": ("score",)}
_NAME = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SCHEME_KEYS = {"arity", "description", "template", "slots", "params", "wrap", "parser", "target", "scale"}
_SLOT_KEYS = {"format", "default", "optional"}


class RenderError(ValueError):
    """A record cannot be shown (or its label written) in a scheme; names the record, scheme and field."""


@dataclass(frozen=True)
class Slot:
    format: str  # the slot's text around its value, e.g. "[Reference Answer]\n{reference}\n\n"
    default: str | None = None  # used (through ``format``) when the record has no value
    optional: bool = False  # no value and no default: the slot renders as "" instead of failing


@dataclass(frozen=True)
class Target:
    template: str  # with {verdict} / {score_a} {score_b} (pair) or {score} (point)
    verdicts: Mapping[str, str] | None = None  # Verdict value -> the judge's word for it


@dataclass(frozen=True)
class Scheme:
    name: str
    arity: str  # "pair" | "point"
    template: str
    slots: Mapping[str, Slot] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)  # non-record placeholders, e.g. sep
    wrap: str | None = None  # chat wrapper with {prompt}
    parser: str | None = None
    target: Target | None = None
    scale: tuple[float, float] | None = None
    description: str = ""
    origin: str = ""  # file:line of the definition

    @property
    def fields(self) -> tuple[str, ...]:
        """The record fields this scheme shows, in template order."""
        names = _names(self.template)
        return tuple(n for n in SLOTS[self.arity] if n in names)

    def slot(self, name: str) -> Slot:
        return self.slots.get(name) or Slot("{" + name + "}")


def _names(text: str) -> list[str]:
    return _NAME.findall(text)


def _fill(text: str, values: Mapping[str, str]) -> str:
    # One pass, so braces inside the values (code, JSON) are never read as placeholders.
    return _NAME.sub(lambda m: values[m.group(1)], text)


def _lookup(scheme: str | Scheme) -> Scheme:
    return scheme if isinstance(scheme, Scheme) else SCHEMES.get(scheme)


def _check_arity(record: Record, scheme: Scheme) -> None:
    if record.arity != scheme.arity:
        hint = " (pair_to_points turns a pair into two point records)" if record.arity == "pair" else ""
        raise RenderError(f"record {record.id!r}: scheme {scheme.name!r} shows {scheme.arity} records, "
                          f"got a {record.arity} record{hint}")


def render(record: Record, scheme: str | Scheme, *, use_reference: bool = True, **params: str) -> str:
    """The judge input for ``record`` in ``scheme`` (a registered name or a ``Scheme``).

    ``use_reference=False`` leaves the reference out even when the record has one; ``params`` override the
    scheme's parameters (e.g. ``sep="</s>"`` for an encoder whose separator token is not "[SEP]").
    """
    s = _lookup(scheme)
    _check_arity(record, s)
    unknown = set(params) - set(s.params)
    if unknown:
        raise RenderError(f"scheme {s.name!r} has no parameter(s) {sorted(unknown)}; it has {sorted(s.params)}")
    values: dict[str, str] = {**s.params, **params}
    for name in s.fields:
        value = getattr(record, name)
        if name == "reference" and not use_reference:
            value = None
        slot = s.slot(name)
        if value is None:
            value = slot.default
        if value is None:
            if not slot.optional:
                raise RenderError(f"record {record.id!r} (source {record.source!r}): scheme {s.name!r} "
                                  f"needs field {name!r}, which the record does not have")
            values[name] = ""
        else:
            values[name] = _fill(slot.format, {**values, name: value})
    prompt = _fill(s.template, values)
    return _fill(s.wrap, {"prompt": prompt}) if s.wrap else prompt


def _number_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))  # repr round-trips through float()


def target(record: Record, scheme: str | Scheme) -> str:
    """The label of ``record`` written as the judge's output (generative training target).

    The text is checked to parse back to the same label with the scheme's parser, so a target can never
    teach a format the parser would reject (e.g. a 3.5 for Prometheus, a tie for a judge with no tie).
    """
    s = _lookup(scheme)
    _check_arity(record, s)
    if s.target is None or s.parser is None:
        raise RenderError(f"scheme {s.name!r} is a classifier input: it has no generative target")
    where = f"record {record.id!r}, scheme {s.name!r}"
    names = set(_names(s.target.template))
    values: dict[str, str] = {}
    if isinstance(record, PairRecord):
        if "verdict" in names:
            if record.verdict is None:
                raise RenderError(f"{where}: field 'verdict' is missing")
            word = (s.target.verdicts or {}).get(record.verdict.value)
            if word is None:
                raise RenderError(f"{where}: field 'verdict': {record.verdict.value} cannot be written in this scheme")
            values["verdict"] = word
        if names & {"score_a", "score_b"}:
            if record.scores is None:
                raise RenderError(f"{where}: field 'scores': this target needs a score pair, "
                                  "the record has only a verdict")
            _check_scale(s, record.scores, where)
            values["score_a"], values["score_b"] = map(_number_text, record.scores)
        expected: Any = record.scores if names & {"score_a", "score_b"} else record.verdict
    else:
        if record.score is None:
            raise RenderError(f"{where}: field 'score' is missing")
        if s.scale is not None and tuple(record.scale) != tuple(s.scale):
            raise RenderError(f"{where}: field 'scale': the record is on {record.scale}, the scheme asks for "
                              f"{s.scale}; rescale the scores first")
        values["score"] = _number_text(record.score)
        expected = record.score
    text = _fill(s.target.template, values)
    parsed = PARSERS.get(s.parser)(text)
    got = parsed.scores if isinstance(expected, tuple) else parsed.value
    if not parsed.ok or got != expected:
        raise RenderError(f"{where}: target {text!r} does not parse back to {expected!r} with parser "
                          f"{s.parser!r} ({parsed.reason or got!r})")
    return text


def _check_scale(s: Scheme, scores: Sequence[float], where: str) -> None:
    if s.scale is not None and not all(s.scale[0] <= x <= s.scale[1] for x in scores):
        raise RenderError(f"{where}: field 'scores': {tuple(scores)} is outside the scheme's scale {s.scale}")


# ---------------------------------------------------------------------------------------------------
# loading templates/*.yaml


def _line_numbers(text: str) -> dict[str, int]:
    """Line (1-based) of each scheme's name in a templates file."""
    root = yaml.compose(text)
    lines: dict[str, int] = {}
    if not isinstance(root, yaml.MappingNode):  # not a templates file: load_schemes says so
        return lines
    for key, value in root.value:
        if key.value == "schemes" and isinstance(value, yaml.MappingNode):
            for name_node, _ in value.value:
                if isinstance(name_node, yaml.ScalarNode):
                    lines[name_node.value] = name_node.start_mark.line + 1
    return lines


def _text(loc: Loc, name: str, value: Any) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    if not isinstance(value, str):
        raise loc.error(name, f"must be a string (or a list of strings), got {type(value).__name__}")
    return value


def _mapping(loc: Loc, name: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise loc.error(name, f"must be a mapping, got {type(value).__name__}")
    return value


def _parse_scheme(name: str, raw: Any, loc: Loc) -> Scheme:
    if not isinstance(name, str):
        raise loc.error(None, f"scheme names are strings, got {name!r}")
    if not isinstance(raw, dict):
        raise loc.error(None, f"scheme {name!r} must be a mapping")
    if "kind" in raw and "arity" not in raw:  # a scheme file written before the key was named arity
        raw = {"arity" if key == "kind" else key: value for key, value in raw.items()}
    unknown = sorted(map(str, set(raw) - _SCHEME_KEYS))
    if unknown:
        raise loc.error(unknown[0], f"unknown key in scheme {name!r}; allowed: {sorted(_SCHEME_KEYS)}")
    arity = raw.get("arity")
    if not isinstance(arity, str) or arity not in SLOTS:
        raise loc.error("arity", f"must be 'pair' or 'point', got {arity!r}")
    params = {str(k): _text(loc, f"params.{k}", v) for k, v in _mapping(loc, "params", raw.get("params")).items()}
    template = _text(loc, "template", raw.get("template"))
    allowed = set(SLOTS[arity]) | set(params)
    used = _names(template)
    for n in used:
        if n not in allowed:
            raise loc.error("template", f"unknown placeholder {{{n}}} in a {arity} scheme; allowed: {sorted(allowed)}")
    for n in REQUIRED_SLOTS[arity]:
        if n not in used:
            raise loc.error("template", f"a {arity} scheme must show {{{n}}}")
    slots: dict[str, Slot] = {}
    for slot_name, spec in _mapping(loc, "slots", raw.get("slots")).items():
        where = f"slots.{slot_name}"
        if slot_name not in used:
            raise loc.error(where, "formats a slot the template does not use")
        if not isinstance(spec, dict) or set(spec) - _SLOT_KEYS:
            raise loc.error(where, f"must be a mapping with keys among {sorted(_SLOT_KEYS)}")
        fmt = _text(loc, f"{where}.format", spec.get("format", "{" + slot_name + "}"))
        if slot_name not in _names(fmt) or set(_names(fmt)) - {slot_name} - set(params):
            raise loc.error(f"{where}.format", f"must contain {{{slot_name}}} and only scheme parameters besides")
        default = spec.get("default")
        slots[slot_name] = Slot(fmt, None if default is None else _text(loc, f"{where}.default", default),
                                bool(spec.get("optional", False)))
    wrap = raw.get("wrap")
    if wrap is not None and _names(_text(loc, "wrap", wrap)) != ["prompt"]:
        raise loc.error("wrap", "must contain {prompt} once and no other placeholder")
    parser, tgt = raw.get("parser"), raw.get("target")
    if (parser is None) != (tgt is None):
        raise loc.error("parser" if parser is None else "target", "parser and target go together")
    if parser is not None:
        if not isinstance(parser, str) or parser not in PARSERS:
            raise loc.error("parser", f"unknown parser {parser!r}; known: {PARSERS.names()}")
        if PARSERS.get(parser).arity != arity:
            raise loc.error("parser", f"{parser!r} reads {PARSERS.get(parser).arity} outputs, the scheme is {arity}")
        tgt = _parse_target(tgt, arity, loc)
    scale = raw.get("scale")
    if scale is not None:
        if not (isinstance(scale, list) and len(scale) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in scale)):
            raise loc.error("scale", f"must be [low, high], got {scale!r}")
        scale = (float(scale[0]), float(scale[1]))
    return Scheme(name, arity, template, slots, params, wrap, parser, tgt, scale,
                  str(raw.get("description", "")), f"{loc.file}:{loc.line}")


def _parse_target(raw: Any, arity: str, loc: Loc) -> Target:
    spec = {"template": raw} if isinstance(raw, str) else raw
    if not isinstance(spec, dict) or set(spec) - {"template", "verdicts"}:
        raise loc.error("target", "must be a string or {template, verdicts}")
    tpl = _text(loc, "target.template", spec.get("template"))
    names = set(_names(tpl))
    if not names or names - set(TARGET_SLOTS[arity]):
        raise loc.error("target.template", f"placeholders must be among {TARGET_SLOTS[arity]}, got {sorted(names)}")
    verdicts = spec.get("verdicts")
    if ("verdict" in names) != (verdicts is not None):
        raise loc.error("target.verdicts", "needed exactly when the target shows {verdict}")
    if verdicts is not None and (not isinstance(verdicts, dict) or set(verdicts) - {v.value for v in Verdict}):
        raise loc.error("target.verdicts", f"keys must be among {[v.value for v in Verdict]}")
    return Target(tpl, None if verdicts is None else {str(k): str(v) for k, v in verdicts.items()})


def load_schemes(path: Path) -> list[Scheme]:
    """Schemes of one templates file; errors name the file, the scheme's line and the field."""
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
        lines = _line_numbers(text)
    except UnicodeDecodeError as exc:
        raise RecordError(str(path), None, None, f"not valid UTF-8: {exc.reason} at byte {exc.start}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise RecordError(str(path), mark.line + 1 if mark else None, None, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise RecordError(str(path), None, None, "invalid YAML: nested too deeply") from None
    if not isinstance(data, dict) or not isinstance(data.get("schemes"), dict):
        raise RecordError(str(path), None, "schemes", "a templates file needs a 'schemes' mapping")
    extra = [k for k in data if k != "schemes" and not str(k).startswith("x-")]
    if extra:
        raise RecordError(str(path), None, str(extra[0]), "unknown top-level key (only 'schemes' and 'x-' anchors)")
    return [_parse_scheme(name, raw, Loc(str(path), lines.get(name))) for name, raw in data["schemes"].items()]


SCHEMES: Registry[Scheme] = Registry("scheme")
for _path in sorted(TEMPLATES_DIR.glob("*.yaml")):
    for _scheme in load_schemes(_path):
        SCHEMES.register(_scheme.name, _scheme)


# ---------------------------------------------------------------------------------------------------
# cross-scheme transforms (the Empirical Study's Sec. 2.2)


def pair_to_points(pair: PairRecord, scale: tuple[float, float] | None = None) -> tuple[PointRecord, PointRecord]:
    """Each answer of a pair as its own point record, for pointwise judges and per-answer heads.

    A scored pair gives each point its score; the scale comes from ``scale`` or ``pair.meta["scale"]`` and
    must be known (a wrong scale would silently mis-normalise regression targets). An unscored pair gives
    unlabelled points.
    """
    if scale is None and pair.meta.get("scale") is not None:
        scale = tuple(pair.meta["scale"])
    if pair.scores is not None and scale is None:
        raise RenderError(f"record {pair.id!r} (source {pair.source!r}): field 'scores': the score scale is "
                          f"unknown; pass scale= or set meta['scale'] in the loader")
    scores = pair.scores or (None, None)
    extra = {"scale": (float(scale[0]), float(scale[1]))} if scale is not None else {}
    a, b = (PointRecord(id=f"{pair.id}:{pos}", question=pair.question, answer=answer, score=score,
                        rubric=pair.rubric, reference=pair.reference, source=pair.source, scenario=pair.scenario,
                        model=model, meta={**pair.meta, "pair_id": pair.id, "position": pos}, **extra)
            for pos, answer, model, score in (("A", pair.answer_a, pair.model_a, scores[0]),
                                              ("B", pair.answer_b, pair.model_b, scores[1])))
    return a, b


def points_to_verdict(score_a: float | None, score_b: float | None) -> Verdict | None:
    """Compare two independent grades (equal -> TIE). A missing grade (a parse failure) gives None, not a tie."""
    if score_a is None or score_b is None:
        return None
    return Verdict.from_scores(score_a, score_b)


def point_to_pair(point: PointRecord) -> PairRecord:
    """The Empirical Study's pairwise -> pointwise transform: the reference is answer 1, the graded answer answer 2.

    A pairwise judge then grades the pair and answer 2's score is the prediction. The pair is unlabelled;
    the point's gold score stays in ``meta["gold_score"]`` (with ``meta["scale"]``).
    """
    if point.reference is None:
        raise RenderError(f"record {point.id!r} (source {point.source!r}): field 'reference': point_to_pair "
                          f"puts the reference answer first, and this record has none")
    return PairRecord(
        id=f"{point.id}:vs-reference", question=point.question, answer_a=point.reference, answer_b=point.answer,
        rubric=point.rubric, source=point.source, scenario=point.scenario, model_a="reference", model_b=point.model,
        meta={**point.meta, "point_id": point.id, "gold_score": point.score, "scale": list(point.scale)},
    )


__all__ = ["SCHEMES", "Scheme", "Slot", "Target", "RenderError", "render", "target", "load_schemes",
           "pair_to_points", "points_to_verdict", "point_to_pair"]
