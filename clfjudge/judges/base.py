"""The judge runtime: ``Judge.load(dir)`` -> a judge that takes a batch and returns typed results.

The directory says what it is (judge_card.json): its card's kind and backend pick the loader (``kinds.find_loader``;
the kinds are registered in ``clfjudge/kinds.py``): a fine-tuned head served by PyTorch (model.safetensors) or
onnxruntime (model.onnx and its variants, written by ``clfjudge export``; ``model.FineTunedJudge``), an embedding judge
(a scikit-learn head over a frozen encoder; ``embedding.EmbeddingJudge``), or a generative judge (a causal LM that
writes its verdict, read by the scheme's parser; ``generative.GenerativeJudge``). Every classifier backend goes
through the same steps:

records (or dicts) -> the judge's own encoding (``Encoder.from_card``: truncation policy + scheme, exactly as
in training) -> length-bucketed batches (sorted by token length so little padding is computed, cut at
the caller's ``batching.Budget``, given once at load: ``options.LoadOptions``; order restored) -> raw outputs
(logits) -> head mapping with the card's calibration -> ``Comparison`` / ``Score``.

``compare(..., symmetric=True)`` judges both answer orders and averages P(A) of (A, B) with P(B) of (B, A)
(and P(TIE) over both), which makes the result independent of the answer order; judges that are
position-invariant by construction (reward heads, embedding judges) skip the second pass.
"""
from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..batching import DEFAULT_BATCH_SIZE, Budget
from ..card import CARD_NAME, TASK_OF_ARITY, JudgeCard
from ..data import conversation as conv
from ..data.formats import ReadOptions, is_own_item, item_record
from ..data.records import Loc, PairRecord, PointRecord, Record, Verdict
from ..kinds import UnknownBackend, find_loader  # the loaders of every judge kind (clfjudge/kinds.py)
from ..models.heads import PairOutputs
from ..models.onnx_session import AUTO, gate_key
from ..options import LoadOptions
from ..registry import resolve
from ..runtimes import EXPORTED
from ..untrusted import check_directory
from .calibration import Calibration

# ONNX files in an exported judge directory, named as optimum's ORTModel* expect them.
ONNX_VARIANTS = {"fp32": "model.onnx", "optimized": "model_optimized.onnx", "int8": "model_quantized.onnx",
                 "int4": "model_int4.onnx"}
# PyTorch weights of a judge: safetensors, or pickles read as tensors only (``weights_only``), whole or in shards.
TORCH_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")

BATCH = "<batch item>"  # input errors of compare_batch / score_batch name the item, from 1 as files count lines
# What ``Judge.warm_up`` reads: plain prose, repeated into an answer longer than any judge's token limit.
WARM_UP_TEXT = ("The committee reviewed the proposal in detail, weighed its costs against the expected benefits, "
                "and asked the authors to clarify how the results would be measured and reported. ")
WARM_UP_CHARS = 8000
_PAIR_FIELDS = ("id", "question", "answer_a", "answer_b", "rubric", "reference", "verdict", "scores", "source",
                "scenario", "model_a", "model_b")
_POINT_FIELDS = ("id", "question", "answer", "rubric", "reference", "score", "scale", "source", "scenario", "model")


# -- results ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """P(answer A better), P(tie), P(answer B better) and the calibrated verdict. ``margin``: r_A - r_B for
    reward heads. ``generated``: a generative judge's text (one per answer order judged); ``parsed=False``
    when its parser could not read it: then there is no verdict (None) and no probabilities (NaN)."""

    p_a: float
    p_tie: float
    p_b: float
    verdict: Verdict | None
    margin: float | None = None
    parsed: bool = True
    generated: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        probs = (self.p_a, self.p_tie, self.p_b) if self.parsed else (None, None, None)
        out = {**dict(zip(("p_a", "p_tie", "p_b"), probs)),
               "verdict": None if self.verdict is None else self.verdict.value}
        if self.margin is not None:
            out["margin"] = self.margin
        return out if self.generated is None else {**out, "parsed": self.parsed, "generated": list(self.generated)}


@dataclass(frozen=True)
class Score:
    """A point judge's score on the card's ``score_scale``, or a reward head's raw reward r(question, answer).
    ``generated`` / ``parsed`` as in ``Comparison`` (an unparsed output has no score: NaN)."""

    value: float
    parsed: bool = True
    generated: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"score": self.value if self.parsed else None}
        return out if self.generated is None else {**out, "parsed": self.parsed, "generated": list(self.generated)}


# -- inputs -----------------------------------------------------------------------------------------------

PairInput = PairRecord | Mapping[str, Any]
PointInput = PointRecord | Mapping[str, Any]
Text = str | list[dict[str, Any]]  # text, or chat messages ({"role", "content"}; content a string or text parts)


def _pick(item: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {k: item[k] for k in names if item.get(k) is not None}


def _read_messages(fields: dict[str, Any], loc: Loc, answers: Sequence[str]) -> dict[str, Any]:
    """A question or an answer given as chat messages (list content too) -> its text, the prompt's turns in meta, as
    every other format reads them (``data.conversation``)."""
    question = fields.get("question")
    if conv.is_messages(question):
        fields["question"], meta = conv.prompt_question(conv.turns(question, loc, "question"), loc, "question")
        fields["meta"] = {**fields.get("meta", {}), **meta}
    for name in answers:
        if conv.is_messages(fields.get(name)):
            fields[name] = conv.answer_text(conv.turns(fields[name], loc, name), loc, name)
    return fields


def as_pair(item: PairInput, loc: Loc = Loc()) -> PairRecord:
    """A pair record from a record or a dict with question / answer_a / answer_b [/ rubric / reference / id] (a
    question or answer may be chat messages); bad input raises ``RecordError`` naming ``loc`` and the field."""
    if isinstance(item, PairRecord):
        return item
    if not isinstance(item, Mapping):
        raise loc.error(None, f"expected a pair (a mapping or a PairRecord), got {type(item).__name__}")
    fields = _read_messages(_pick(item, _PAIR_FIELDS), loc, ("answer_a", "answer_b"))
    return PairRecord.build(loc, **fields, unlabelled=True, allow_empty_answers=True)


def as_point(item: PointInput, loc: Loc = Loc()) -> PointRecord:
    """A point record from a record or a dict with question / answer [/ rubric / reference / id] (a question or
    the answer may be chat messages)."""
    if isinstance(item, PointRecord):
        return item
    if not isinstance(item, Mapping):
        raise loc.error(None, f"expected an answer to score (a mapping or a PointRecord), got {type(item).__name__}")
    fields = _read_messages(_pick(item, _POINT_FIELDS), loc, ("answer",))
    return PointRecord.build(loc, **fields, unlabelled=True, allow_empty_answers=True)


def read_item(item: Any, loc: Loc, arity: str, options: ReadOptions = ReadOptions()) -> Record:
    """One item as every interface reads it (the Python API, ``clfjudge score``'s lines, the server's items): a
    record of ``arity`` ("pair" / "point") as it is; clfjudge's own fields (``as_pair`` / ``as_point``); or another
    of the ecosystem's formats, TRL's prompt / chosen / rejected, prompt / completion and messages among them
    (``data.formats.item_record``), which is also how any item is read when ``options`` force a format or map
    columns. Bad input raises ``RecordError`` naming ``loc`` and the field."""
    own = as_pair if arity == "pair" else as_point
    if not isinstance(item, Mapping) or (options.format is None and not options.columns and is_own_item(item, arity)):
        return own(item, loc)
    return item_record(item, loc, labelled=False, options=options, arity=arity)


# -- judges -----------------------------------------------------------------------------------------------

def symmetrize(forward: PairOutputs, reversed_: PairOutputs) -> PairOutputs:
    """Combine a pair judged in both orders: P(A) = mean(P(A | A,B), P(B | B,A)), likewise P(B), P(TIE)."""
    margin = None if forward.margin is None else (forward.margin - reversed_.margin) / 2
    return PairOutputs(p_a=(forward.p_a + reversed_.p_b) / 2, p_tie=(forward.p_tie + reversed_.p_tie) / 2,
                       p_b=(forward.p_b + reversed_.p_a) / 2, margin=margin)


class Judge:
    """A loaded judge. ``compare*`` for pair judges, ``score*`` for point judges (and reward heads, whose score
    is the raw reward of one answer). Subclasses provide ``raw_outputs``, ``pair_outputs`` and ``point_scores``,
    and where they can tell cheaply ``sequence_lengths`` (what the server's token budget counts).
    ``budget``: rows, padded tokens and padding per forward pass (``batching.Budget``; an int: rows only), the
    caller's, given once when the judge is built."""

    backend_name: str
    position_invariant: bool = False
    # what runs it on this machine and why (provider, variant, why), for /metrics and a run's record
    runtime_choice: dict[str, Any] = {}

    def __init__(self, card: JudgeCard, tasks: Iterable[str], budget: Budget | int = DEFAULT_BATCH_SIZE) -> None:
        self.card = card
        self.tasks = frozenset(tasks)
        self.budget = budget if isinstance(budget, Budget) else Budget(budget)
        self.calibration = Calibration.from_card(card)

    @property
    def batch_size(self) -> int:
        return self.budget.max_batch_size

    def keep_readings(self, items: int) -> None:
        """Keep at most ``items`` readings in memory (``LoadOptions.memory_items``; ``loads(readings=True)`` calls
        it on the judge it loaded). A judge whose reader keeps readings overrides it to bound that reader's memory."""
        raise NotImplementedError(f"this {self.card.name} judge keeps no readings")

    # -- loading ------------------------------------------------------------------------------------------
    @staticmethod
    def load(directory: str | Path, options: LoadOptions | None = None, **keywords: Any) -> Judge:
        """Load a judge directory, or a transformers sequence-classification model without a judge card (a local
        directory or ``hf:OWNER/NAME[@REV]``; ``judges.foreign``), with ``options`` (``options.LoadOptions``:
        backend, provider, variant, threads, budget, trust_pickle, model_input, memory_items) or the same as
        keywords (the budget as ``batch_size``, ``max_batch_tokens``, ``max_padding``), e.g.
        ``Judge.load(path, provider="cpu", threads=4)``. ``backend``: "auto" (what the card names, else what the
        directory holds) or one of the card's kind (``clfjudge.kinds``): "onnx" (any kind's export), "torch"
        (fine-tuned heads), "sklearn" (embedding judges), "generate" (generative judges) or "verdict"; ``provider``,
        what runs an ONNX file (``runtimes.PROVIDERS``): "cpu" | "cuda" (onnxruntime), "openvino" |
        "openvino-bf16", or "auto": what the export measured fastest among the runs its parity gate passed, where
        this machine has it (else "cpu"; "cpu" for a judge that is not ONNX); ``variant``: for ONNX, "fp32" |
        "optimized" | "int8" | "int4" or a file name (default: the card's primary file)."""
        if options is not None and keywords:
            raise TypeError("Judge.load takes options= or keywords, not both")
        options = options if options is not None else LoadOptions.of(**keywords)
        directory, card = open_card(directory, options.model_input)
        name, loader = find_loader(directory, card, options.backend)
        if options.provider == AUTO and name != EXPORTED:  # a kind's exported form resolves it from the card
            options = options.with_(provider="cpu")
        return loader(directory, card, options)

    # -- what subclasses provide --------------------------------------------------------------------------
    def raw_outputs(self, records: Sequence[PairRecord | PointRecord]) -> np.ndarray:
        """One row of raw model outputs per record (what calibration is fitted on)."""
        raise NotImplementedError

    def pair_outputs(self, raw: np.ndarray) -> PairOutputs:
        raise NotImplementedError

    def point_scores(self, raw: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def sequence_lengths(self, records: Sequence[PairRecord | PointRecord]) -> list[list[int]] | None:
        """Per record, the token lengths of the sequences one pass of ``raw_outputs`` reads for it (what a token
        budget counts); None when this judge cannot tell without running (the server then counts items only)."""
        return None

    # -- public API ---------------------------------------------------------------------------------------
    def warm_up(self, max_items: int | None = None) -> int:
        """Judge made-up inputs once, shaped like the biggest call this judge takes: as many long answers as its
        token budget holds (one without a budget; at most ``max_items`` items, default ``batch_size``), then four
        answers to one question. What loads lazily (an ONNX session, a decoder reader's shared-prefix graphs) then
        loads here, and the runtime grows its memory for its biggest batch here, not inside the first requests: a
        server started cold paid 1-2 s of it inside its first batched calls (text-embeddings-inference warms up
        the same way). Returns the number of items judged."""
        task = "compare" if "compare" in self.tasks else "score"
        long = (WARM_UP_TEXT * (WARM_UP_CHARS // len(WARM_UP_TEXT) + 1))[:WARM_UP_CHARS]

        def item(question: str, k: int, text: str) -> dict[str, str]:  # distinct texts: no cache answers
            if task == "compare":
                return {"question": question, "answer_a": f"{k}a. {text}", "answer_b": f"{k}b. {text}"}
            return {"question": question, "answer": f"{k}. {text}"}

        run = self.compare_batch if task == "compare" else self.score_batch
        probe = item("Warm-up question 0.", 0, long)
        lengths = self.sequence_lengths([as_pair(probe) if task == "compare" else as_point(probe)])
        rows = 1
        if lengths and self.budget.max_batch_tokens:
            rows = max(1, self.budget.max_batch_tokens // (max(lengths[0]) * len(lengths[0])))
        rows = min(rows, max_items or self.batch_size)
        biggest = [item(f"Warm-up question {k}.", k, long) for k in range(rows)]
        shared = [item("Warm-up question.", k, WARM_UP_TEXT) for k in range(2 if task == "compare" else 4)]
        with self.scratch():  # made-up texts: kept neither in memory nor in a disk cache
            run(biggest)
            run(shared)
        return len(biggest) + len(shared)

    def self_test(self) -> None:
        """Judge one short made-up item for real (the smallest call): what loads lazily (an ONNX session, a
        tokenizer file, a reader's graphs) loads here, so that a judge that loads but cannot score fails now, and
        not on each input that follows."""
        with self.scratch():
            if "compare" in self.tasks:
                self.compare_batch([{"question": "Self-test question.", "answer_a": "One.", "answer_b": "Two."}])
            else:
                self.score_batch([{"question": "Self-test question.", "answer": "One."}])

    def batch_tolerance(self) -> tuple[str, float] | None:
        """(run, tolerance): how far a row's numbers may move when it is judged in another batch, as the exported
        card states it for the run this judge is (``runtime.onnx.batch_tolerance``, keyed as the parity report
        names a run); None where the card states none."""
        choice = self.runtime_choice
        if not choice.get("file"):
            return None
        run = gate_key(choice["file"], choice["provider"])
        stated = (self.card.runtime.get("onnx") or {}).get("batch_tolerance") or {}
        return (run, stated[run]) if run in stated else None

    def scratch(self) -> contextlib.AbstractContextManager:
        """A context whose judgements leave no trace (a judge that caches readings forgets the ones made inside)."""
        return contextlib.nullcontext()

    def require(self, task: str) -> None:
        if task not in self.tasks:
            can = " / ".join(sorted(self.tasks))
            if TASK_OF_ARITY.get(self.card.arity) == task:  # the card says it can
                raise ValueError(f"this {self.card.name} judge cannot {task}: its card's arity is {self.card.arity!r} "
                                 f"but its head and scheme ({self.card.scheme!r}) {can} only; the card contradicts "
                                 "itself (fix its arity or its scheme)")
            raise ValueError(f"this {self.card.name} judge ({self.card.arity}) cannot {task}; it can {can}")

    def compare_batch(self, items: Sequence[PairInput], symmetric: bool = False) -> list[Comparison]:
        self.require("compare")
        records = [read_item(item, Loc(BATCH, i), "pair") for i, item in enumerate(items, start=1)]
        if not records:
            return []
        outputs = self.pair_outputs(self.raw_outputs(records))
        if symmetric and not self.position_invariant:
            outputs = symmetrize(outputs, self.pair_outputs(self.raw_outputs([r.swapped() for r in records])))
        verdicts = self.calibration.verdicts(outputs)
        margins = outputs.margin if outputs.margin is not None else [None] * len(records)
        return [Comparison(float(a), float(t), float(b), v, None if m is None else float(m))
                for a, t, b, v, m in zip(outputs.p_a, outputs.p_tie, outputs.p_b, verdicts, margins)]

    def compare(self, question: Text, a: Text, b: Text, rubric: str | None = None, reference: str | None = None,
                symmetric: bool = False) -> Comparison:
        """One pair (``compare_batch``): a question and answers as text or chat messages."""
        item = {"question": question, "answer_a": a, "answer_b": b, "rubric": rubric, "reference": reference}
        return self.compare_batch([item], symmetric=symmetric)[0]

    def score_batch(self, items: Sequence[PointInput]) -> list[Score]:
        self.require("score")
        records = [read_item(item, Loc(BATCH, i), "point") for i, item in enumerate(items, start=1)]
        if not records:
            return []
        return [Score(float(s)) for s in self.point_scores(self.raw_outputs(records))]

    def score(self, question: Text, answer: Text, rubric: str | None = None, reference: str | None = None) -> Score:
        """One answer (``score_batch``): a question and an answer as text or chat messages."""
        item = {"question": question, "answer": answer, "rubric": rubric, "reference": reference}
        return self.score_batch([item])[0]

    def rank(self, question: str, answers: Sequence[str]) -> list[float]:
        """One score per answer, higher = better: a judge that scores answers scores each once (a decoder judge
        reads the question once for all of them); a pairwise judge plays every pair in both orders and scores
        an answer by its mean P(win) - P(loss). A generative judge's output that did not parse is no score
        (NaN) and no game (left out of the mean; NaN for an answer with no parsed game)."""
        if not answers:
            raise ValueError("rank needs at least one answer")
        if "score" in self.tasks:
            return [s.value for s in self.score_batch([{"question": question, "answer": a} for a in answers])]
        from itertools import combinations

        pairs = list(combinations(range(len(answers)), 2))
        results = self.compare_batch([{"question": question, "answer_a": answers[i], "answer_b": answers[k]}
                                      for i, k in pairs], symmetric=True)
        total, played = np.zeros(len(answers)), np.zeros(len(answers))
        for (i, k), c in zip(pairs, results):
            if not c.parsed:
                continue
            total[i] += c.p_a - c.p_b
            total[k] += c.p_b - c.p_a
            played[[i, k]] += 1
        if len(answers) == 1:
            return [0.0]
        return [float(t / n) if n else math.nan for t, n in zip(total, played)]


# -- loaders ----------------------------------------------------------------------------------------------

class JudgeError(Exception):
    """A judge that cannot be loaded or cannot score (a missing, broken or tampered directory, a runtime that fails
    on it): the judge's fault, not its inputs' (``clfjudge`` exits 3 naming the directory and the reason)."""

    def __init__(self, directory: str | Path, reason: BaseException | str) -> None:
        # clfjudge's own errors are written for users; another library's need their type to be understood
        plain = isinstance(reason, (str, ValueError, OSError))
        why = f"{reason}" if plain else f"{type(reason).__name__}: {reason}"
        super().__init__(f"judge {directory} cannot be used: {why}")
        self.directory = str(directory)


def load_ready(directory: str | Path, options: LoadOptions | None = None, **keywords: Any) -> Judge:
    """``Judge.load(directory, options)``, then one real judgement (``Judge.self_test``): a judge ready to score,
    or a ``JudgeError`` naming the directory and the reason, raised before any input is read (options that are wrong
    in themselves stay ``ValueError``s / ``TypeError``s: a bad budget, an unknown backend)."""
    if options is not None and keywords:
        raise TypeError("load_ready takes options= or keywords, not both")
    options = options if options is not None else LoadOptions.of(**keywords)
    try:
        judge = Judge.load(directory, options)
        judge.self_test()
    except UnknownBackend:  # an option wrong in itself (``kinds.find_loader`` names the known ones)
        raise
    except Exception as exc:  # noqa: BLE001 - whatever fails in loading or the first forward pass is the judge's
        raise JudgeError(directory, exc) from exc
    return judge


Loader = Callable[[Path, JudgeCard, LoadOptions], "Judge"]
PROCESSORS = {"cpu": "the CPU", "cuda": "CUDA"}  # where a judge runs in this process, as a refusal names it


def loads(*, providers: Collection[str] | None = ("cpu",), readings: bool = False) -> Callable[[Loader], Loader]:
    """The prologue every built-in loader ``(directory, card, options)`` shares, declared where it is defined: the
    load options a judge cannot honour are refused before anything loads, and the ones every judge honours alike are
    applied here. ``providers``: where a judge that runs in this process (PyTorch) runs ("cpu", "cuda"): a ``variant``
    (an ONNX file) is refused, so is a provider outside ``providers`` or CUDA where torch sees none, and ``threads``
    set (PyTorch's are process-wide); None: an ONNX judge, which resolves its provider and variant from its card and
    hands ``threads`` to each session. ``readings``: the judge's reader keeps readings in memory, bounded by
    ``memory_items`` once it is loaded (``Judge.keep_readings``); without it ``memory_items`` is refused, not
    ignored."""

    def wrap(load: Loader) -> Loader:
        @functools.wraps(load)
        def opened(directory: Path, card: JudgeCard, options: LoadOptions) -> Judge:
            if not readings:
                options.refuse_memory(f"a {card.name} judge")
            if providers is not None:
                in_process(card, options, providers)
            judge = load(directory, card, options)
            if readings and options.memory_items is not None:
                judge.keep_readings(options.memory_items)
            return judge

        return opened

    return wrap


def in_process(card: JudgeCard, options: LoadOptions, providers: Collection[str]) -> None:
    """``loads(providers=...)``: what a judge run in this process refuses of ``options``, and its threads set."""
    if options.variant is not None:
        raise ValueError(f"variant {options.variant!r} applies to ONNX judges; this {card.name} judge runs in this "
                         "process (an exported judge directory holds the ONNX files)")
    if options.provider not in providers:
        where = " or on ".join(PROCESSORS[p] for p in providers)
        raise ValueError(f"provider {options.provider!r}: a {card.name} judge runs on {where} here (the other "
                         "providers run the ONNX files clfjudge export writes)")
    if options.provider == "cuda":
        from ..machine import probe

        if not (cuda := probe().cuda()):
            raise ValueError(f"provider 'cuda' does not run on this machine: {cuda.why}")
    if options.threads:
        import torch

        torch.set_num_threads(options.threads)  # process-wide in PyTorch


# A directory without judge_card.json: a model clfjudge did not write, described by the foreign kind.
DESCRIBE_FOREIGN = "clfjudge.judges.foreign:describe"


def open_card(spec: str | Path, model_input: str | None = None) -> tuple[Path, JudgeCard]:
    """The directory a judge spec names and its card: judge_card.json, or for a model without one
    (``DESCRIBE_FOREIGN``) the card that describes it. Either way the directory is checked first
    (``untrusted.check_directory``): nothing in it resolves outside it, no JSON file past the limits."""
    directory = Path(spec)
    if not (directory / CARD_NAME).is_file():
        return resolve(DESCRIBE_FOREIGN)(spec, model_input)
    check_directory(directory)
    if model_input is not None:
        raise ValueError(f"{directory}: model_input applies to a model without a judge card; this judge's card "
                         f"fixes its input ({directory / CARD_NAME})")
    return directory, JudgeCard.load(directory)


def open_judge(spec: str | Path, model_input: str | None = None) -> tuple[Path, JudgeCard]:
    """``open_card`` for a command that goes on to load the judge elsewhere (an export, Ray actors): a directory that
    cannot be opened is a ``JudgeError``."""
    try:
        return open_card(spec, model_input)
    except (ValueError, OSError) as exc:
        raise JudgeError(spec, exc) from exc
