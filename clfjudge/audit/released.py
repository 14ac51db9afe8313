"""Released judges' prediction files, read as judges: ``load_released(name) -> ReleasedPredictions``.

- PandaLM-7B and gpt-3.5-turbo on the PandaLM test (``pandalm_result`` / ``gpt_result``: 0 = tie,
  1 = response 1, 2 = response 2; gpt also writes "Tie", and "garbage" where its output did not parse),
  aligned to the test set by ``idx``; ids ``pandalm-test:{idx}``.
- Auto-J-13B on the Auto-J pairwise test, in both answer orders (``output``: 0 = response 1, 1 = response
  2, 2 = tie, as the test set's labels), aligned by line order; ids ``autoj-test:{i}`` (0-based line).

Unparsed outputs become ``None`` (a parse failure, counted in ``failed``), never a class. Any other
unexpected value is a ``RecordError`` naming the file, line and field.

Gold labels come from ``clfjudge.data.sources.load``; ``gold_verdicts`` falls back to reading the official test
file directly when that source is not registered (and says so), and the raw readers stay available as an
independent check of the loaders' label mapping.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data.records import Loc, RecordError, Verdict
from ..paths import data_root
from ..registry import Registry

# ---------------------------------------------------------------------------------------------------
# file readers that keep line numbers


def _json_array_items(path: Path) -> Iterator[tuple[int, Any]]:
    """Elements of a top-level JSON array with the line each one starts on."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    pos, line = 0, 1

    def skip(p: int) -> int:
        while p < len(text) and text[p] in " \t\r\n":
            p += 1
        return p

    def advance(to: int) -> None:
        nonlocal pos, line
        line += text.count("\n", pos, to)
        pos = to

    advance(skip(0))
    if text[pos : pos + 1] != "[":
        raise RecordError(str(path), line, None, "expected a JSON array")
    advance(skip(pos + 1))
    if text[pos : pos + 1] == "]":
        return
    while True:
        try:
            item, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise RecordError(str(path), exc.lineno, None, f"invalid JSON: {exc.msg}") from None
        yield line, item
        advance(skip(end))
        sep = text[pos : pos + 1]
        if sep == "]":
            return
        if sep != ",":
            raise RecordError(str(path), line, None, "expected ',' or ']' between array elements")
        advance(skip(pos + 1))


def _jsonl_items(path: Path) -> Iterator[tuple[int, Any]]:
    """Objects of a JSON-lines file with their 1-based line numbers; a blank line is an error because these
    files are aligned by line order."""
    with path.open(encoding="utf-8") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                raise RecordError(str(path), line_no, None, "blank line (files are aligned by line order)")
            try:
                yield line_no, json.loads(raw)
            except json.JSONDecodeError as exc:
                raise RecordError(str(path), line_no, None, f"invalid JSON: {exc.msg}") from None


def _field(loc: Loc, obj: Any, name: str) -> Any:
    if not isinstance(obj, dict):
        raise loc.error(None, f"expected a JSON object, got {type(obj).__name__}")
    if name not in obj or obj[name] is None:
        raise loc.error(name, "is missing")
    return obj[name]


def _code(
    loc: Loc, name: str, value: Any, codes: Mapping[str, Verdict], failure_markers: frozenset[str]
) -> Verdict | None:
    """Map one raw label to a verdict, or ``None`` for a known parse-failure marker."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise loc.error(name, f"must be an integer or a string, got {value!r}")
    key = str(value).strip().lower()
    if key in codes:
        return codes[key]
    if key in failure_markers:
        return None
    expected = sorted(codes) + sorted(failure_markers)
    raise loc.error(name, f"unknown label {value!r} (expected one of {expected})")


# ---------------------------------------------------------------------------------------------------
# label codings

# PandaLM test set and its released judges: 0 = tie, 1 = response 1 better, 2 = response 2 better.
PANDALM_CODES = {"0": Verdict.TIE, "1": Verdict.A, "2": Verdict.B, "tie": Verdict.TIE}
PANDALM_FAILURES = frozenset({"garbage"})
# Auto-J test set and Auto-J outputs: 0 = response 1, 1 = response 2, 2 = tie.
AUTOJ_CODES = {"0": Verdict.A, "1": Verdict.B, "2": Verdict.TIE}
NO_FAILURES: frozenset[str] = frozenset()


def pandalm_id(idx: int) -> str:
    return f"pandalm-test:{idx}"


def autoj_id(i: int) -> str:
    return f"autoj-test:{i}"


def _pandalm_idx(loc: Loc, obj: Any, seen: dict[str, int]) -> str:
    idx = _field(loc, obj, "idx")
    if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
        raise loc.error("idx", f"must be a non-negative integer, got {idx!r}")
    rid = pandalm_id(idx)
    if rid in seen:
        raise loc.error("idx", f"duplicate idx {idx} (first on line {seen[rid]})")
    seen[rid] = loc.line or 0
    return rid


# ---------------------------------------------------------------------------------------------------
# released predictions


@dataclass(frozen=True)
class Aligned:
    """Gold and predictions in the same order (the gold's)."""

    ids: list[str]
    gold: list[Verdict]
    verdicts: list[Verdict | None]
    reversed_verdicts: list[Verdict | None] | None


@dataclass(frozen=True)
class ReleasedPredictions:
    """One released judge's verdicts on one test set.

    ``reversed_verdicts[i]`` (when the judge was also run with the answers swapped) is the verdict on pair i
    presented in swapped order, in that order's own terms (``A`` = the answer shown first there).
    ``failed`` counts the raw values that were parse failures (each is a ``None`` verdict).
    """

    name: str
    test_source: str
    ids: tuple[str, ...]
    verdicts: tuple[Verdict | None, ...]
    reversed_verdicts: tuple[Verdict | None, ...] | None
    failed: Counter = field(default_factory=Counter, compare=False)
    files: tuple[str, ...] = ()

    @property
    def n_failed(self) -> int:
        return sum(v is None for v in self.verdicts) + sum(v is None for v in self.reversed_verdicts or ())

    def align(self, gold: Mapping[str, Verdict]) -> Aligned:
        """Pair each gold label with this judge's verdict(s); the two id sets must be identical."""
        mine = set(self.ids)
        missing, extra = [i for i in gold if i not in mine], sorted(mine - set(gold))
        if missing or extra:
            raise ValueError(
                f"{self.name}: predictions and gold of {self.test_source!r} cover different records: "
                f"{len(missing)} gold ids without a prediction (e.g. {missing[:3]}), "
                f"{len(extra)} predictions without gold (e.g. {extra[:3]})"
            )
        pos = {rid: i for i, rid in enumerate(self.ids)}
        order = [pos[rid] for rid in gold]
        return Aligned(
            ids=list(gold),
            gold=list(gold.values()),
            verdicts=[self.verdicts[i] for i in order],
            reversed_verdicts=(
                None if self.reversed_verdicts is None else [self.reversed_verdicts[i] for i in order]
            ),
        )


@dataclass(frozen=True)
class _Parsed:
    """What a reader returns: the prediction columns of a ``ReleasedPredictions``."""

    ids: tuple[str, ...]
    verdicts: tuple[Verdict | None, ...]
    reversed_verdicts: tuple[Verdict | None, ...] | None
    failed: Counter


def _read_pandalm_judge(column: str) -> Callable[[list[Path]], _Parsed]:
    def read(paths: list[Path]) -> _Parsed:
        (path,) = paths
        ids, verdicts, failed, seen = [], [], Counter(), {}
        for line, obj in _json_array_items(path):
            loc = Loc(str(path), line)
            ids.append(_pandalm_idx(loc, obj, seen))
            raw = _field(loc, obj, column)
            verdict = _code(loc, column, raw, PANDALM_CODES, PANDALM_FAILURES)
            if verdict is None:
                failed[str(raw)] += 1
            verdicts.append(verdict)
        return _Parsed(tuple(ids), tuple(verdicts), None, failed)

    return read


def _autoj_column(path: Path, name: str) -> list[Verdict]:
    """One label column of an Auto-J JSON-lines file (0 = response 1, 1 = response 2, 2 = tie), by line."""
    out = []
    for line, obj in _jsonl_items(path):
        loc = Loc(str(path), line)
        out.append(_code(loc, name, _field(loc, obj, name), AUTOJ_CODES, NO_FAILURES))
    return out


def _read_autoj_judge(paths: list[Path]) -> _Parsed:
    forward_path, reversed_path = paths
    forward, backward = _autoj_column(forward_path, "output"), _autoj_column(reversed_path, "output")
    if len(forward) != len(backward):
        sizes = sorted([(len(forward), forward_path), (len(backward), reversed_path)])
        (n, short), (n_long, long) = sizes
        message = f"has {n} predictions but {long.name} has {n_long} (aligned by line)"
        raise RecordError(str(short), n + 1, None, message)
    ids = tuple(autoj_id(i) for i in range(len(forward)))
    return _Parsed(ids, tuple(forward), tuple(backward), Counter())


@dataclass(frozen=True)
class ReleasedJudge:
    name: str
    test_source: str
    files: tuple[str, ...]  # relative to the data root
    reader: Callable[[list[Path]], _Parsed]
    description: str = ""

    def load(self, root: Path | None = None) -> ReleasedPredictions:
        paths = [(root or data_root()) / f for f in self.files]
        for p in paths:
            if not p.exists():
                raise FileNotFoundError(
                    f"released judge {self.name!r}: {p} does not exist (set CLFJUDGE_DATA to the data root)"
                )
        parsed = self.reader(paths)
        return ReleasedPredictions(
            name=self.name,
            test_source=self.test_source,
            ids=parsed.ids,
            verdicts=parsed.verdicts,
            reversed_verdicts=parsed.reversed_verdicts,
            failed=parsed.failed,
            files=self.files,
        )


RELEASED: Registry[ReleasedJudge] = Registry("released judge")
RELEASED.register(
    "pandalm-7b",
    ReleasedJudge(
        "pandalm-7b",
        "pandalm-test",
        ("pandalm/data/pandalm-7b-testset-v1.json",),
        _read_pandalm_judge("pandalm_result"),
        "PandaLM-7B verdicts released with the PandaLM test set",
    ),
)
RELEASED.register(
    "gpt-3.5-turbo",
    ReleasedJudge(
        "gpt-3.5-turbo",
        "pandalm-test",
        ("pandalm/data/gpt-3.5-turbo-testset-v1.json",),
        _read_pandalm_judge("gpt_result"),
        "gpt-3.5-turbo verdicts released with the PandaLM test set",
    ),
)
RELEASED.register(
    "auto-j-13b",
    ReleasedJudge(
        "auto-j-13b",
        "autoj-test",
        (
            "auto-j/data/outputs/pairwise_example_output.jsonl",
            "auto-j/data/outputs/pairwise_exchange_example_output.jsonl",
        ),
        _read_autoj_judge,
        "Auto-J-13B verdicts on the Auto-J pairwise test, original and swapped order",
    ),
)


def load_released(name: str, root: Path | None = None) -> ReleasedPredictions:
    return RELEASED.get(name).load(root)


# ---------------------------------------------------------------------------------------------------
# gold labels straight from the official test files


def read_pandalm_votes(path: Path) -> dict[str, tuple[int, int, int]]:
    """The three annotators' votes per PandaLM test record (0 = tie, 1 = response 1, 2 = response 2)."""
    votes: dict[str, tuple[int, int, int]] = {}
    seen: dict[str, int] = {}
    for line, obj in _json_array_items(path):
        loc = Loc(str(path), line)
        rid = _pandalm_idx(loc, obj, seen)
        row = []
        for name in ("annotator1", "annotator2", "annotator3"):
            v = _field(loc, obj, name)
            if isinstance(v, bool) or v not in (0, 1, 2):
                raise loc.error(name, f"must be 0, 1 or 2, got {v!r}")
            row.append(int(v))
        votes[rid] = (row[0], row[1], row[2])
    return votes


def majority_verdict(votes: tuple[int, ...]) -> Verdict | None:
    """The strict-majority verdict of annotator votes, or ``None`` when no label has a majority."""
    label, count = Counter(votes).most_common(1)[0]
    return PANDALM_CODES[str(label)] if 2 * count > len(votes) else None


def _raw_pandalm_gold(path: Path) -> dict[str, Verdict | None]:
    return {rid: majority_verdict(v) for rid, v in read_pandalm_votes(path).items()}


def read_autoj_labels(path: Path) -> dict[str, Verdict]:
    """Gold of the Auto-J pairwise test (``label``), ids by 0-based line."""
    return {autoj_id(i): v for i, v in enumerate(_autoj_column(path, "label"))}


@dataclass(frozen=True)
class RawGold:
    path: str  # relative to the data root
    reader: Callable[[Path], Mapping[str, Verdict | None]]


RAW_GOLD: Registry[RawGold] = Registry("raw gold")
RAW_GOLD.register("pandalm-test", RawGold("pandalm/data/testset-v1.json", _raw_pandalm_gold))
RAW_GOLD.register("autoj-test", RawGold("auto-j/data/test/testdata_pairwise.jsonl", read_autoj_labels))


@dataclass(frozen=True)
class Gold:
    verdicts: dict[str, Verdict]  # in the test set's order
    excluded: Counter  # by reason (e.g. no annotator majority)
    provenance: str


def raw_gold(test_source: str, root: Path | None = None) -> Gold:
    """Gold read directly from the official test file (records without a majority are excluded)."""
    spec = RAW_GOLD.get(test_source)
    path = (root or data_root()) / spec.path
    labels = spec.reader(path)
    verdicts = {rid: v for rid, v in labels.items() if v is not None}
    excluded = +Counter({"no annotator majority": len(labels) - len(verdicts)})  # unary + drops a zero count
    return Gold(verdicts, excluded, f"read directly from {spec.path}")


def gold_verdicts(test_source: str, root: Path | None = None) -> Gold:
    """Gold from the source loader (``clfjudge.data.sources.load``), or from the raw file when the loader is not
    registered yet; ``provenance`` says which."""
    from ..data import sources  # imported here: the source modules pull in their loaders' dependencies

    if test_source not in sources.SOURCES:
        return raw_gold(test_source, root)
    src = sources.SOURCES.get(test_source)
    result = src.load(src.path(root))
    verdicts: dict[str, Verdict] = {}
    excluded = Counter(result.excluded)
    for rec in result.records:
        if rec.verdict is None:
            excluded["no verdict"] += 1
        else:
            verdicts[rec.id] = rec.verdict
    return Gold(verdicts, excluded, f"clfjudge.data.sources.load({test_source!r})")
