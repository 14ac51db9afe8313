"""The formats a user's own rows come in, detected from their columns (``detect``), each turning a row into a
record (``Format.build``): ``FORMATS``, one entry per format, tried in ``rank`` order.

- ``trl``: TRL's preference format: ``chosen`` / ``rejected`` with an explicit ``prompt`` or an implicit one (the
  shared prefix, split off as ``trl.data_utils.maybe_extract_prompt`` does), plain text or conversational;
  chosen = answer_a with verdict A (training randomises the order, ``randomize_order``).
- ``pairwise``: a question, two answers and a ``winner`` (A / B / tie in the spellings of ``WINNERS``).
- ``clfjudge``: clfjudge's own pair records (``records.to_dataset``, ``clfjudge score`` input): a verdict and/or a
  score pair.
- ``pointwise``: a question, an answer and a ``score`` on a stated scale (clfjudge's own point records too).
- ``completion``: TRL's prompt-completion format, unlabelled (``clfjudge score``, ``serve``, reward).
- ``messages``: TRL's conversational language-modeling format, unlabelled: the final assistant turn is the answer.

A column named differently is mapped with ``columns`` ({field: column}, ``--columns question=prompt,...``); the
format is forced with ``format``. Every bad value raises ``RecordError`` naming the row and the column.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..registry import Registry
from . import conversation as conv
from .records import Loc, PairRecord, PointRecord, Record, RecordError, Verdict

# The spellings of a winner (case and surrounding space ignored). 0 is refused: PandaLM codes a tie with it,
# Auto-J the first answer.
WINNERS: dict[str, Verdict] = {
    **dict.fromkeys(("a", "model_a", "answer_a", "response_a", "1", "first", "winner_model_a"), Verdict.A),
    **dict.fromkeys(("b", "model_b", "answer_b", "response_b", "2", "second", "winner_model_b"), Verdict.B),
    **dict.fromkeys(("tie", "tie (bothbad)", "tie_bothbad", "bothbad", "both_bad", "draw", "equal", "winner_tie"),
                    Verdict.TIE),
}
DEFAULT_SCALE = (1.0, 5.0)


@dataclass(frozen=True)
class ReadOptions:
    """How to read a user's data: a forced format (else detected), field -> column renames, a point scale."""

    format: str | None = None
    columns: tuple[tuple[str, str], ...] = ()  # (field, column in the data)
    scale: tuple[float, float] | None = None

    @classmethod
    def make(cls, format: str | None = None, columns: Mapping[str, str] | str | None = None,
             scale: Sequence[float] | str | None = None) -> ReadOptions:
        if format is not None:
            FORMATS.get(format)
        if isinstance(columns, str):
            columns = parse_columns(columns)
        unknown = sorted(set(columns or {}) - known_fields())
        if unknown:
            raise ValueError(f"columns: unknown field(s) {unknown}; the fields a column can be mapped to: "
                             f"{', '.join(sorted(known_fields()))}")
        if isinstance(scale, str):
            scale = [float(x) for x in scale.split(",")]
        if scale is not None and (len(scale) != 2 or not float(scale[0]) < float(scale[1])):
            raise ValueError(f"scale: expected two numbers LO,HI with LO < HI, got {scale!r}")
        return cls(format, tuple(sorted((columns or {}).items())),
                   None if scale is None else (float(scale[0]), float(scale[1])))

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "columns": dict(self.columns), "scale": self.scale}


_OPTIONAL_FIELDS = ("id", "rubric", "reference", "scenario", "model_a", "model_b", "scale", "prompt")


def known_fields() -> set[str]:
    """The field names of every format: what ``columns`` maps data columns to."""
    return {n for _, f in FORMATS.items() for n in (*f.needs, *f.labels, *f.aliases)} | set(_OPTIONAL_FIELDS)


def parse_columns(text: str) -> dict[str, str]:
    """``"question=prompt,answer=response"`` -> {field: column}."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, column = item.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise ValueError(f"--columns: expected FIELD=COLUMN[,FIELD=COLUMN...], got {item!r}")
        out[name.strip()] = column.strip()
    return out


class Row:
    """One row and its columns under the format's field names; errors name the row and the data's column."""

    def __init__(self, values: Mapping[str, Any], loc: Loc, columns: Mapping[str, str]) -> None:
        self.values, self.loc, self.columns = values, loc, columns

    def column(self, name: str) -> str:
        return self.columns.get(name, name)

    def has(self, name: str) -> bool:
        return self.values.get(self.column(name)) is not None

    def raw(self, name: str) -> Any:
        value = self.values.get(self.column(name))
        if value is None:
            raise self.loc.error(self.column(name), "is missing")
        return value

    def text(self, name: str) -> str:
        value = self.raw(name)
        if not isinstance(value, str):
            raise self.loc.error(self.column(name), f"must be a string, got {type(value).__name__}: {value!r:.80}")
        return self.nonempty(name, value)

    def nonempty(self, name: str, value: str) -> str:
        if not value.strip():
            raise self.loc.error(self.column(name), "is empty")
        return value

    def optional(self, name: str) -> str | None:
        return self.text(name) if self.has(name) else None

    def prompt(self, name: str) -> tuple[str, dict[str, Any]]:
        """(question, meta) from a plain-text or conversational prompt column."""
        value = self.raw(name)
        if conv.is_messages(value):
            question, meta = conv.prompt_question(conv.turns(value, self.loc, self.column(name)), self.loc,
                                                  self.column(name))
            return self.nonempty(name, question), meta
        return self.text(name), {}

    def answer(self, name: str) -> str:
        """An answer column: plain text, or an assistant turn (a list of messages). An empty answer is kept (a model
        can answer nothing; the built-in sources keep such answers too), a missing one is not."""
        value = self.raw(name)
        if conv.is_messages(value):
            return conv.answer_text(conv.turns(value, self.loc, self.column(name)), self.loc, self.column(name))
        if not isinstance(value, str):
            raise self.loc.error(self.column(name), f"must be a string, got {type(value).__name__}: {value!r:.80}")
        return value

    def base(self) -> dict[str, Any]:
        """The fields every format passes on when the row has them: id and the optional texts."""
        out: dict[str, Any] = {}
        if self.has("id"):
            out["id"] = str(self.raw("id"))
        for name in ("rubric", "reference", "scenario"):
            if self.has(name):
                out[name] = self.text(name)
        return out


@dataclass(frozen=True)
class Format:
    name: str
    arity: str  # "pair" | "point"
    rank: int  # detection order (lower first)
    needs: tuple[str, ...]  # fields that must be columns for the format to be detected
    labels: tuple[str, ...]  # fields of which one must be a column for labelled data (training, audit)
    build: Callable[[Row, ReadOptions, bool], dict[str, Any]]  # row, options, labelled -> record fields
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # field -> other common column names
    chosen_first: bool = False  # answer_a is always the preferred answer: the order gives the label away
    description: str = ""
    # (dataset, field -> column, where) -> None: a rule over the whole file, before any row is read
    check_table: Callable[[Any, Mapping[str, str], str], None] | None = None

    def column_map(self, columns: Sequence[str], options: ReadOptions) -> dict[str, str]:
        """field -> the column that holds it: the user's mapping, else the field's own name, else an alias."""
        chosen = dict(options.columns)
        for name, aliases in self.aliases.items():
            if name not in chosen and name not in columns:
                found = [a for a in aliases if a in columns]
                if found:
                    chosen[name] = found[0]
        return chosen

    def fits(self, columns: Sequence[str], options: ReadOptions, labelled: bool) -> bool:
        mapped = self.column_map(columns, options)
        present = {name for name in (*self.needs, *self.labels) if mapped.get(name, name) in columns}
        return set(self.needs) <= present and (not labelled or not self.labels or bool(present & set(self.labels)))

    def record(self, values: Mapping[str, Any], loc: Loc, columns: Mapping[str, str], options: ReadOptions,
               labelled: bool, source: str, default_id: str | None = None) -> Record:
        fields = self.build(Row(values, loc, columns), options, labelled)
        if default_id is not None:
            fields.setdefault("id", default_id)
        cls = PairRecord if self.arity == "pair" else PointRecord
        return cls.build(loc, source=source, unlabelled=not labelled, allow_empty_answers=True, **fields)


FORMATS: Registry[Format] = Registry("data format")
_QUESTION = ("prompt", "instruction", "input")


def _pair(row: Row, question: str, meta: dict, answer_a: str, answer_b: str, **label: Any) -> dict[str, Any]:
    return {**row.base(), "question": question, "answer_a": answer_a, "answer_b": answer_b, "meta": meta, **label}


def build_trl(row: Row, options: ReadOptions, labelled: bool) -> dict[str, Any]:
    chosen, rejected = row.raw("chosen"), row.raw("rejected")
    # as trl.data_utils.maybe_extract_prompt: a plain-text prompt beside conversational answers is a copy of their
    # first turn (some data sets add one), the conversations themselves hold the prompt
    explicit = row.has("prompt") and (conv.is_messages(row.raw("prompt")) or not conv.is_messages(chosen))
    if explicit:
        question, meta = row.prompt("prompt")
        answers = row.answer("chosen"), row.answer("rejected")
    elif conv.is_messages(chosen) and conv.is_messages(rejected):
        prompt, chosen, rejected = conv.split_shared_prefix(chosen, rejected)
        where = f"{row.column('chosen')}/{row.column('rejected')}"
        if not prompt:
            raise row.loc.error(where, "the two conversations share no prompt turn (and there is no prompt column)")
        question, meta = conv.prompt_question(conv.turns(prompt, row.loc, where), row.loc, where)
        answers = tuple(conv.answer_text(conv.turns(v, row.loc, row.column(n)), row.loc, row.column(n))
                        for v, n in ((chosen, "chosen"), (rejected, "rejected")))
    else:
        question, *answers = conv.split_shared_text(row.text("chosen"), row.text("rejected"))
        meta = {}
        if not question:
            raise row.loc.error(row.column("chosen"), "chosen and rejected share no prompt (and there is no prompt "
                                                      "column)")
    return _pair(row, question, meta, *answers, verdict=Verdict.A if labelled else None)


def _winner(row: Row) -> Verdict:
    value = row.raw("winner")
    key = str(value).strip().lower() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if key is None or key not in WINNERS:
        hint = " (0 is ambiguous: a tie in PandaLM's coding, the first answer in Auto-J's)" if key == "0" else ""
        raise row.loc.error(row.column("winner"), f"must be A, B or tie (or {', '.join(sorted(WINNERS))}), "
                                                  f"got {value!r:.80}{hint}")
    return WINNERS[key]


def check_winner_coding(dataset, columns: Mapping[str, str], where: str) -> None:
    """A winner column holding 0 uses a 0-based coding (Auto-J: 0 first answer, 1 second, 2 tie; PandaLM: 0 tie):
    its 1s and 2s would be read wrongly as A and B, so the whole file is refused rather than any row guessed."""
    column = columns.get("winner", "winner")
    if column not in dataset.column_names:
        return
    zeros = sum(str(v).strip() == "0" for v in dataset[column] if v is not None and not isinstance(v, bool))
    if zeros:
        raise RecordError(where, None, column, f"holds 0 in {zeros} row(s): a 0-based label coding (Auto-J: 0 = "
                                               "first answer, 1 = second, 2 = tie; PandaLM: 0 = tie) that A / B / "
                                               "tie cannot be read from; write the winner as A, B or tie")


def _answers(row: Row) -> tuple[str, dict, str, str]:
    question, meta = row.prompt("question")
    return question, meta, row.answer("answer_a"), row.answer("answer_b")


def build_pairwise(row: Row, options: ReadOptions, labelled: bool) -> dict[str, Any]:
    label = {"verdict": _winner(row)} if labelled else {}
    return _pair(row, *_answers(row), **label)


def build_clfjudge(row: Row, options: ReadOptions, labelled: bool) -> dict[str, Any]:
    label = {}
    if labelled and row.has("verdict"):
        label["verdict"] = row.raw("verdict")
    if labelled and row.has("scores"):
        label["scores"] = row.raw("scores")
    return _pair(row, *_answers(row), model_a=row.optional("model_a"), model_b=row.optional("model_b"), **label)


def _scale(row: Row, options: ReadOptions) -> tuple[float, float]:
    if options.scale is not None:
        return options.scale
    if row.has("scale"):
        scale = row.raw("scale")
        if not isinstance(scale, (list, tuple)) or len(scale) != 2:
            raise row.loc.error(row.column("scale"), f"must be [low, high], got {scale!r:.80}")
        return float(scale[0]), float(scale[1])
    return DEFAULT_SCALE


def build_pointwise(row: Row, options: ReadOptions, labelled: bool) -> dict[str, Any]:
    question, meta = row.prompt("question")
    out = {**row.base(), "question": question, "answer": row.answer("answer"), "meta": meta,
           "scale": _scale(row, options)}
    if labelled:
        score = row.raw("score")
        if isinstance(score, bool) or not isinstance(score, (int, float, str)):
            raise row.loc.error(row.column("score"), f"must be a number, got {score!r:.80}")
        try:
            value = float(score)
        except ValueError:
            raise row.loc.error(row.column("score"), f"is not a number: {score!r:.80}") from None
        lo, hi = out["scale"]
        if not lo <= value <= hi:
            raise row.loc.error(row.column("score"), f"is outside the scale [{lo:g}, {hi:g}], got {value:g} (state "
                                                     "the scale: --scale LO,HI, or scale: [LO, HI] in a recipe)")
        out["score"] = value
    return out


def build_completion(row: Row, options: ReadOptions, labelled: bool) -> dict[str, Any]:
    question, meta = row.prompt("prompt")
    return {**row.base(), "question": question, "answer": row.answer("completion"), "meta": meta}


def build_messages(row: Row, options: ReadOptions, labelled: bool) -> dict[str, Any]:
    name = row.column("messages")
    turns = conv.turns(row.raw("messages"), row.loc, name)
    if len(turns) < 2 or turns[-1][0] != "assistant":
        raise row.loc.error(name, "a conversation to judge ends with the assistant's answer after a user turn")
    question, meta = conv.prompt_question(turns[:-1], row.loc, name)
    return {**row.base(), "question": question, "answer": turns[-1][1], "meta": meta}


_A = ("response_a", "response_1", "output_1", "completion_a", "response 1")
_B = ("response_b", "response_2", "output_2", "completion_b", "response 2")
for _format in (
    Format("trl", "pair", 0, ("chosen", "rejected"), (), build_trl, chosen_first=True,
           description="TRL preference: prompt? / chosen / rejected (text or conversational)"),
    Format("pairwise", "pair", 1, ("question", "answer_a", "answer_b"), ("winner",), build_pairwise,
           aliases={"question": _QUESTION, "answer_a": _A, "answer_b": _B, "winner": ("label", "preference")},
           description="question / answer_a / answer_b / winner (A, B or tie)", check_table=check_winner_coding),
    Format("clfjudge", "pair", 2, ("question", "answer_a", "answer_b"), ("verdict", "scores"), build_clfjudge,
           description="clfjudge pair records: question / answer_a / answer_b / verdict and/or scores"),
    Format("pointwise", "point", 3, ("question", "answer"), ("score",), build_pointwise,
           aliases={"question": _QUESTION, "answer": ("response", "output", "completion"),
                    "score": ("rating", "label")},
           description="question / answer / score on a scale (--scale LO,HI; default 1,5)"),
    Format("completion", "point", 4, ("prompt", "completion"), (), build_completion,
           description="TRL prompt-completion, unlabelled (scoring)"),
    Format("messages", "point", 5, ("messages",), (), build_messages,
           description="TRL conversational messages ending with the answer, unlabelled (scoring)"),
):
    FORMATS.register(_format.name, _format)


def detect(columns: Sequence[str], options: ReadOptions, labelled: bool, where: str) -> Format:
    """The format of data with these columns: the forced one, else the first (by rank) that fits."""
    if options.format is not None:
        chosen = FORMATS.get(options.format)
        if not chosen.fits(columns, options, labelled):
            mapped = chosen.column_map(columns, options)
            wanted = [mapped.get(n, n) for n in chosen.needs] + ([f"one of {list(chosen.labels)}"]
                                                                  if labelled and chosen.labels else [])
            raise RecordError(where, None, None, f"format {chosen.name!r} needs the columns {wanted}; the data has "
                                                 f"{sorted(columns)} (map them with --columns FIELD=COLUMN)")
        return chosen
    for candidate in sorted((f for _, f in FORMATS.items()), key=lambda f: f.rank):
        if candidate.fits(columns, options, labelled):
            return candidate
    known = "; ".join(f"{f.name}: {f.description}" for f in sorted((f for _, f in FORMATS.items()),
                                                                     key=lambda f: f.rank))
    what = "labelled" if labelled else "unlabelled"
    raise RecordError(where, None, None, f"no known format has the columns {sorted(columns)} ({what} data); name "
                                         "the format (--format) or map columns (--columns FIELD=COLUMN). Formats: "
                                         f"{known}")


def nearest(columns: Sequence[str], options: ReadOptions) -> Format | None:
    """The format an item that fits none most likely meant: all its needed fields but one present (building it then
    names the missing one), the most present first, then by rank; None if there is no such format."""
    def present(f: Format) -> int:
        mapped = f.column_map(columns, options)
        return sum(mapped.get(n, n) in columns for n in f.needs)

    close = [f for _, f in FORMATS.items() if present(f) and present(f) >= len(f.needs) - 1]
    return min(close, key=lambda f: (-present(f), f.rank)) if close else None


OWN_FIELDS = {"pair": ("question", "answer_a", "answer_b"), "point": ("question", "answer")}


def is_own_item(item: Mapping[str, Any], arity: str) -> bool:
    """Whether an item uses clfjudge's own field names (``judges.base.as_pair`` / ``as_point`` read it, and name
    what it lacks) rather than another format's."""
    return any(name in item for name in OWN_FIELDS[arity])


def item_arity(item: Any, options: ReadOptions = ReadOptions()) -> str | None:
    """What an item asks to judge: "pair" (two answers) or "point" (one answer: clfjudge's fields, TRL's prompt /
    completion or messages); None when it fits no format."""
    if not isinstance(item, Mapping):
        return None
    if options.format is None and not options.columns:
        for arity in ("pair", "point"):
            if OWN_FIELDS[arity][-1] in item:
                return arity
    try:
        return detect([k for k, v in item.items() if v is not None], options, False, "<item>").arity
    except RecordError:
        return None


def item_record(item: Any, loc: Loc, labelled: bool, options: ReadOptions = ReadOptions(), arity: str | None = None,
                source: str = "") -> Record:
    """One item (a JSON object: a line of ``clfjudge score`` input, a request item of ``serve``) in any format ->
    a record; ``arity`` ("pair" / "point"), when given, is what the caller can judge."""
    if not isinstance(item, Mapping):
        raise loc.error(None, f"expected a JSON object, got {type(item).__name__}")
    columns = [k for k, v in item.items() if v is not None]
    where = f"{loc.file or '<memory>'}:{loc.line if loc.line is not None else '?'}"
    try:
        fmt = detect(columns, options, labelled, where)
    except RecordError as err:
        fmt = nearest(columns, options)
        if fmt is None:
            raise loc.error(None, err.message) from None
    if arity is not None and fmt.arity != arity:
        raise loc.error(None, f"a {fmt.name} item is a {fmt.arity} to judge; this judge takes {arity}s here "
                              f"(items: {sorted(columns)})")
    return fmt.record(item, loc, fmt.column_map(columns, options), options, labelled, source)
