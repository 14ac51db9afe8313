"""Parsers for the outputs of released generative judges (JudgeLM, PandaLM, Auto-J, Prometheus 1 and 2).

Each parser reads one generated text into a ``Parsed``: a verdict (pairwise selection), a score
(pointwise grading) or, for pairwise *grading* outputs, a score pair plus the verdict it implies.
An output that does not follow the judge's format is a failure (``ok=False``, ``value=None``), never a
tie or a middle score. UnlimitedJudge (``src/build_prompt_judge.py``) does turn failures into a default;
``study_fallback=True`` reproduces that for comparison with its numbers, and the result still says it
failed (``ok=False``, ``fallback=True``). ``ParseStats`` counts successes, failures and fallbacks.

Success criteria follow the repo's rules, with two deliberate tolerances: leading whitespace of the
output is ignored and numbers may be separated by any run of spaces (the repo splits on single spaces).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..data.records import Verdict
from ..registry import Registry

Value = Verdict | float
ReadResult = Verdict | float | tuple[float, float]


class ParseFailure(ValueError):
    """Raised by a reader when the output does not follow the judge's format."""


@dataclass(frozen=True)
class Parsed:
    value: Value | None  # a Verdict (pair parsers) or a float score (point parsers); None on failure
    ok: bool
    raw: str
    scores: tuple[float, float] | None = None  # pairwise-grading outputs keep both scores
    fallback: bool = False  # value is UnlimitedJudge's default for a failed parse, not read from the output
    reason: str | None = None  # why parsing failed

    @property
    def verdict(self) -> Verdict | None:
        return self.value if isinstance(self.value, Verdict) else None

    @property
    def score(self) -> float | None:
        return None if self.value is None or isinstance(self.value, Verdict) else float(self.value)


@dataclass(frozen=True)
class OutputParser:
    name: str
    arity: str  # "pair" (value is a Verdict) | "point" (value is a score)
    read: Callable[[str], ReadResult]  # raises ParseFailure
    study_default: ReadResult | None  # what UnlimitedJudge returns on failure (None: it has no default)
    description: str = ""

    def __call__(self, text: str, *, study_fallback: bool = False) -> Parsed:
        try:
            return _parsed(self.read(text), ok=True, raw=text)
        except ParseFailure as exc:
            if study_fallback and self.study_default is not None:
                return _parsed(self.study_default, ok=False, raw=text, fallback=True, reason=str(exc))
            return Parsed(None, ok=False, raw=text, reason=str(exc))


def _parsed(result: ReadResult, **kw) -> Parsed:
    if isinstance(result, tuple):
        return Parsed(Verdict.from_scores(*result), scores=result, **kw)
    return Parsed(result, **kw)


PARSERS: Registry[OutputParser] = Registry("parser")


def _register(name: str, arity: str, study_default: ReadResult | None, description: str):
    def add(read: Callable[[str], ReadResult]) -> Callable[[str], ReadResult]:
        PARSERS.register(name, OutputParser(name, arity, read, study_default, description))
        return read

    return add


# ---------------------------------------------------------------------------------------------------
# shared pieces


def _first_line(text: str) -> str:
    return text.lstrip().split("\n", 1)[0].strip()


def _number(token: str) -> float:
    try:
        x = float(token)
    except ValueError:
        raise ParseFailure(f"{token!r} is not a number") from None
    if not math.isfinite(x):
        raise ParseFailure(f"{token!r} is not a finite number")
    return x


def _two_numbers(text: str, what: str) -> tuple[float, float]:
    tokens = text.split()
    if len(tokens) < 2:
        raise ParseFailure(f"{what}: expected two scores, got {text.strip()[:40]!r}")
    return _number(tokens[0]), _number(tokens[1])


def _one_of(token: str, allowed: dict[str, ReadResult], what: str) -> ReadResult:
    if token not in allowed:
        raise ParseFailure(f"{what}: expected one of {sorted(allowed)}, got {token[:40]!r}")
    return allowed[token]


def _after_result(text: str) -> str:
    """The text after the first ``[RESULT]`` and before any further one (the repo's ``split('[RESULT]')[1]``)."""
    parts = text.split("[RESULT]")
    if len(parts) < 2:
        raise ParseFailure("no [RESULT] marker")
    return parts[1]


# ---------------------------------------------------------------------------------------------------
# JudgeLM: "s1 s2" on the first line (pair), one score on the first line (point)


@_register("judgelm-pair", "pair", (1.0, 1.0), "first line 'a b' (commas allowed) -> score pair")
def _judgelm_pair(text: str) -> tuple[float, float]:
    return _two_numbers(_first_line(text).replace(",", " "), "first line")


@_register("judgelm-point", "point", 5.0, "first line is one score")
def _judgelm_point(text: str) -> float:
    return _number(_first_line(text))


# ---------------------------------------------------------------------------------------------------
# PandaLM: "1" / "2" / "Tie" on the first line; pointwise (Fig. 8 asks for 1 to 10) an integer


@_register("pandalm-pair", "pair", Verdict.TIE, "first line '1' / '2' / 'Tie'")
def _pandalm_pair(text: str) -> Verdict:
    return _one_of(_first_line(text), {"1": Verdict.A, "2": Verdict.B, "Tie": Verdict.TIE}, "first line")


# The repo's prompt asks for 1-5 and accepts 1-5; Fig. 8 (our pandalm-point scheme) asks for 1 to 10.
_PANDALM_SCORES: dict[str, ReadResult] = {str(i): float(i) for i in range(1, 11)}


@_register("pandalm-point", "point", 3.0, "first line an integer 1-10")
def _pandalm_point(text: str) -> float:
    return _one_of(_first_line(text), _PANDALM_SCORES, "first line")


# ---------------------------------------------------------------------------------------------------
# Auto-J: "... final decision is Response 1 / Response 2 / Tie" (last occurrence); "Rating: [[x]]"

_DECISION = "final decision is "
_RATING = "Rating: [["


@_register("autoj-pair", "pair", Verdict.TIE, "last 'final decision is Response 1|Response 2|Tie'")
def _autoj_pair(text: str) -> Verdict:
    pos = text.rfind(_DECISION)
    if pos == -1:
        raise ParseFailure(f"no {_DECISION.strip()!r} statement")
    rest = text[pos + len(_DECISION):].strip().lower()
    for prefix, verdict in (("response 1", Verdict.A), ("response 2", Verdict.B), ("tie", Verdict.TIE)):
        if rest.startswith(prefix):
            return verdict
    raise ParseFailure(f"final decision is neither Response 1, Response 2 nor Tie: {rest[:40]!r}")


@_register("autoj-point", "point", 0.0, "last 'Rating: [[x]]'")
def _autoj_point(text: str) -> float:
    pos = text.rfind(_RATING)
    if pos == -1:
        raise ParseFailure(f"no {_RATING!r}")
    end = text.find("]]", pos)
    if end == -1:
        raise ParseFailure("rating is not closed by ']]'")
    return _number(text[pos + len(_RATING):end].strip())


# ---------------------------------------------------------------------------------------------------
# Prometheus: "[RESULT] n" (1-5), "[RESULT] a b" (Fig. 11 pairwise), Prometheus 2 "[RESULT] A|B"

_PROMETHEUS_SCORES: dict[str, ReadResult] = {str(i): float(i) for i in range(1, 6)}


@_register("prometheus-point", "point", 1.0, "'[RESULT] n', n an integer 1-5")
def _prometheus_point(text: str) -> float:
    return _one_of(_after_result(text).strip(), _PROMETHEUS_SCORES, "[RESULT]")


@_register("prometheus-pair", "pair", (1.0, 1.0), "'[RESULT] a b' (two scores; ',', '.' and newlines separate)")
def _prometheus_pair(text: str) -> tuple[float, float]:
    rest = re.sub(r"[,.\n]", " ", _after_result(text))
    return _two_numbers(rest, "[RESULT]")


_AB = re.compile(r"\s*([AB])(?![A-Za-z0-9])")


@_register("prometheus2-pair", "pair", None, "Prometheus 2 relative grading '[RESULT] A|B'")
def _prometheus2_pair(text: str) -> Verdict:
    m = _AB.match(_after_result(text))
    if not m:
        raise ParseFailure(f"[RESULT] is not followed by A or B: {_after_result(text).strip()[:40]!r}")
    return Verdict(m.group(1))


# ---------------------------------------------------------------------------------------------------
# counting


@dataclass
class ParseStats:
    """Successes, failures and fallbacks per parser (a fallback is also a failure)."""

    ok: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    fallback: Counter = field(default_factory=Counter)

    def add(self, parser: str, parsed: Parsed) -> Parsed:
        (self.ok if parsed.ok else self.failed)[parser] += 1
        if parsed.fallback:
            self.fallback[parser] += 1
        return parsed

    def total(self, parser: str) -> int:
        return self.ok[parser] + self.failed[parser]

    def to_dict(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for name in sorted(set(self.ok) | set(self.failed)):
            n = self.total(name)
            out[name] = {"total": n, "ok": self.ok[name], "failed": self.failed[name],
                         "fallback": self.fallback[name], "failure_rate": self.failed[name] / n if n else 0.0}
        return out


def parse_all(parser: str, texts: Iterable[str], *, study_fallback: bool = False,
              stats: ParseStats | None = None) -> tuple[list[Parsed], ParseStats]:
    """Parse many outputs with one parser, counting the outcome of each."""
    stats = stats if stats is not None else ParseStats()
    read = PARSERS.get(parser)
    return [stats.add(parser, read(t, study_fallback=study_fallback)) for t in texts], stats
