"""The judge runtime: ``Judge.load(dir)`` -> a judge that takes a batch and returns typed results.

The directory says what it is (judge_card.json): a fine-tuned head served by PyTorch (model.safetensors)
or onnxruntime (model.onnx and its variants, written by ``clfjudge export``), an embedding judge (a
scikit-learn head over a frozen encoder), or a generative judge (a causal LM that writes its verdict, read by
the scheme's parser; ``GenerateJudge``). Every classifier backend goes through the same steps:

records (or dicts) -> the judge's own encoding (``Encoder.from_card``: truncation policy + scheme, exactly as
in training) -> length-bucketed batches (sorted by token length so little padding is computed, order
restored) -> raw outputs (logits) -> head mapping with the card's calibration -> ``Comparison`` / ``Score``.

``compare(..., symmetric=True)`` judges both answer orders and averages P(A) of (A, B) with P(B) of (B, A)
(and P(TIE) over both), which makes the result independent of the answer order; judges that are
position-invariant by construction (reward heads, embedding judges) skip the second pass.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .calibration import Calibration
from .card import JudgeCard
from .data.records import CLASS_OF_VERDICT, Loc, PairRecord, PointRecord, Verdict
from .models.heads import HEADS, Cls3Head, Head, PairOutputs, RewardHead
from .models.onnx_session import PROVIDERS, inference_session
from .registry import Registry

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from .embedding_judge import EmbeddingJudge
    from .generative import GenerativeJudge
    from .prompts.parsers import Parsed

DEFAULT_BATCH_SIZE = 16
# ONNX files in an exported judge directory, named as optimum's ORTModel* expect them.
ONNX_VARIANTS = {"fp32": "model.onnx", "optimized": "model_optimized.onnx", "int8": "model_quantized.onnx"}
TORCH_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")

BATCH = "<batch item>"  # input errors of compare_batch / score_batch name the item's index in the batch
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


def _pick(item: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {k: item[k] for k in names if item.get(k) is not None}


def as_pair(item: PairInput, loc: Loc = Loc()) -> PairRecord:
    """A pair record from a record or a dict with question / answer_a / answer_b [/ rubric / reference / id];
    bad input raises ``RecordError`` naming ``loc`` and the field."""
    if isinstance(item, PairRecord):
        return item
    if not isinstance(item, Mapping):
        raise loc.error(None, f"expected a pair (a mapping or a PairRecord), got {type(item).__name__}")
    return PairRecord.build(loc, **_pick(item, _PAIR_FIELDS), unlabelled=True, allow_empty_answers=True)


def as_point(item: PointInput, loc: Loc = Loc()) -> PointRecord:
    """A point record from a record or a dict with question / answer [/ rubric / reference / id]."""
    if isinstance(item, PointRecord):
        return item
    if not isinstance(item, Mapping):
        raise loc.error(None, f"expected an answer to score (a mapping or a PointRecord), got {type(item).__name__}")
    return PointRecord.build(loc, **_pick(item, _POINT_FIELDS), unlabelled=True, allow_empty_answers=True)


# -- backends: padded numpy batch -> logits ------------------------------------------------------------------

Backend = Callable[[Mapping[str, np.ndarray]], np.ndarray]


class TorchBackend:
    """A HF sequence-classification model in eval mode (``device`` "cpu" or "cuda")."""

    name = "torch"

    def __init__(self, directory: str | Path, device: str = "cpu", threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("provider 'cuda' asked for, but torch sees no CUDA device")
        if threads:
            torch.set_num_threads(threads)  # process-wide in PyTorch
        self.device = device
        model = AutoModelForSequenceClassification.from_pretrained(directory, dtype=torch.float32)
        self.model = model.to(device).eval()
        self.inputs = tuple(inspect.signature(self.model.forward).parameters)

    def __call__(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        import torch

        feed = {k: torch.from_numpy(np.asarray(v)).to(self.device) for k, v in batch.items() if k in self.inputs}
        with torch.inference_mode():
            return self.model(**feed).logits.float().cpu().numpy()


class OnnxBackend:
    """An onnxruntime session on one ONNX file (CPUExecutionProvider or CUDAExecutionProvider)."""

    name = "onnx"

    def __init__(self, model_path: str | Path, provider: str = "cpu", threads: int | None = None) -> None:
        import onnxruntime as ort

        if provider not in PROVIDERS:
            raise ValueError(f"unknown provider {provider!r}; known: {sorted(PROVIDERS)}")
        wanted = PROVIDERS[provider][0]
        if wanted not in ort.get_available_providers():
            raise ValueError(f"provider {provider!r} needs onnxruntime's {wanted}, which this onnxruntime build "
                             f"lacks (available: {ort.get_available_providers()}; for CUDA install onnxruntime-gpu)")
        self.path = Path(model_path)
        self.session = inference_session(self.path, provider, threads)
        self.inputs = tuple(i.name for i in self.session.get_inputs())
        self.output = self.session.get_outputs()[0].name

    def __call__(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        missing = [name for name in self.inputs if name not in batch]
        if missing:
            raise ValueError(f"{self.path}: the model takes inputs {list(self.inputs)}, the tokenizer gave "
                             f"{sorted(batch)} (missing {missing})")
        feed = {name: np.asarray(batch[name], dtype=np.int64) for name in self.inputs}
        return self.session.run([self.output], feed)[0]


# -- judges -----------------------------------------------------------------------------------------------

def symmetrize(forward: PairOutputs, reversed_: PairOutputs) -> PairOutputs:
    """Combine a pair judged in both orders: P(A) = mean(P(A | A,B), P(B | B,A)), likewise P(B), P(TIE)."""
    margin = None if forward.margin is None else (forward.margin - reversed_.margin) / 2
    return PairOutputs(p_a=(forward.p_a + reversed_.p_b) / 2, p_tie=(forward.p_tie + reversed_.p_tie) / 2,
                       p_b=(forward.p_b + reversed_.p_a) / 2, margin=margin)


class Judge:
    """A loaded judge. ``compare*`` for pair judges, ``score*`` for point judges (and reward heads, whose score
    is the raw reward of one answer). Subclasses provide ``raw_outputs``, ``pair_outputs`` and ``point_scores``."""

    backend_name: str
    position_invariant: bool = False

    def __init__(self, card: JudgeCard, tasks: Iterable[str], batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.card = card
        self.tasks = frozenset(tasks)
        self.batch_size = batch_size
        self.calibration = Calibration.from_card(card)

    # -- loading ------------------------------------------------------------------------------------------
    @staticmethod
    def load(directory: str | Path, backend: str = "auto", provider: str = "cpu", variant: str | None = None,
             threads: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE, trust_pickle: bool = False) -> Judge:
        """Load a judge directory. ``backend``: "auto" (from what the directory holds), "torch", "onnx",
        "sklearn" (embedding judges) or "generate" (generative judges); ``provider``: "cpu" | "cuda";
        ``variant``: for ONNX, "fp32" | "optimized" | "int8" or a file name (default: the card's primary file);
        ``threads``: intra-op threads;
        ``trust_pickle``: allow a head stored as a pickle by an older clfjudge (runs code from the directory)."""
        directory = Path(directory)
        card = JudgeCard.load(directory)
        name = detect_backend(directory, card) if backend == "auto" else backend
        return LOADERS.get(name)(directory, card, provider=provider, variant=variant, threads=threads,
                                 batch_size=batch_size, trust_pickle=trust_pickle)

    # -- what subclasses provide --------------------------------------------------------------------------
    def raw_outputs(self, records: Sequence[PairRecord | PointRecord]) -> np.ndarray:
        """One row of raw model outputs per record (what calibration is fitted on)."""
        raise NotImplementedError

    def pair_outputs(self, raw: np.ndarray) -> PairOutputs:
        raise NotImplementedError

    def point_scores(self, raw: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # -- public API ---------------------------------------------------------------------------------------
    def require(self, task: str) -> None:
        if task not in self.tasks:
            can = " / ".join(sorted(self.tasks))
            raise ValueError(f"this {self.card.head} judge ({self.card.kind}) cannot {task}; it can {can}")

    def compare_batch(self, items: Sequence[PairInput], symmetric: bool = False) -> list[Comparison]:
        self.require("compare")
        records = [as_pair(item, Loc(BATCH, i)) for i, item in enumerate(items)]
        if not records:
            return []
        outputs = self.pair_outputs(self.raw_outputs(records))
        if symmetric and not self.position_invariant:
            outputs = symmetrize(outputs, self.pair_outputs(self.raw_outputs([r.swapped() for r in records])))
        verdicts = self.calibration.verdicts(outputs)
        margins = outputs.margin if outputs.margin is not None else [None] * len(records)
        return [Comparison(float(a), float(t), float(b), v, None if m is None else float(m))
                for a, t, b, v, m in zip(outputs.p_a, outputs.p_tie, outputs.p_b, verdicts, margins)]

    def compare(self, question: str, a: str, b: str, rubric: str | None = None, reference: str | None = None,
                symmetric: bool = False) -> Comparison:
        item = {"question": question, "answer_a": a, "answer_b": b, "rubric": rubric, "reference": reference}
        return self.compare_batch([item], symmetric=symmetric)[0]

    def score_batch(self, items: Sequence[PointInput]) -> list[Score]:
        self.require("score")
        records = [as_point(item, Loc(BATCH, i)) for i, item in enumerate(items)]
        if not records:
            return []
        return [Score(float(s)) for s in self.point_scores(self.raw_outputs(records))]

    def score(self, question: str, answer: str, rubric: str | None = None, reference: str | None = None) -> Score:
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


# What each fine-tuned head can do: a reward head also scores one answer (its reward).
HEAD_TASKS = {"cls3": ("compare",), "reward": ("compare", "score"), "regression": ("score",)}


class ModelJudge(Judge):
    """A fine-tuned sequence-classification judge on a ``TorchBackend`` or an ``OnnxBackend``."""

    def __init__(self, card: JudgeCard, tokenizer: PreTrainedTokenizerBase, backend: Backend,
                 batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        from .prompts.encoding import Encoder

        if card.head not in HEAD_TASKS:
            raise ValueError(f"judge_card.json field 'head': {card.head!r} is not a fine-tuned classifier head "
                             f"({', '.join(HEAD_TASKS)})")
        if tokenizer.pad_token_id is None:
            raise ValueError("the judge's tokenizer has no pad token: batches cannot be padded")
        super().__init__(card, HEAD_TASKS[card.head], batch_size)
        self.tokenizer = tokenizer
        self.backend = backend
        self.backend_name = getattr(backend, "name", type(backend).__name__)
        self.head: Head = HEADS.get(card.head).from_card(card)
        self.position_invariant = self.head.position_invariant
        self.encoder = Encoder.from_card(card, tokenizer)

    @property
    def truncation(self) -> dict[str, Any]:
        """How many inputs this judge had to cut, and which fields (``TruncationReport``)."""
        return self.encoder.report.to_dict()

    def encode(self, record: PairRecord | PointRecord) -> list[dict[str, list[int]]]:
        """The token ids of the sequence(s) the backbone sees for one record (the judge's own encoding)."""
        inputs = self.head.inputs(record) if isinstance(record, PairRecord) else [record]
        return [self.encoder.encode(r) for r in inputs]

    def raw_outputs(self, records: Sequence[PairRecord | PointRecord]) -> np.ndarray:
        """Logits per record, shape (records, k * num_labels) for k sequences per record. Records are
        encoded, sorted by token length, run in batches of ``batch_size`` and put back in order."""
        encoded = [self.encode(r) for r in records]
        order = sorted(range(len(records)), key=lambda i: max(len(s["input_ids"]) for s in encoded[i]))
        rows: list[np.ndarray | None] = [None] * len(records)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            seqs = [s for i in chunk for s in encoded[i]]
            batch = self.tokenizer.pad(seqs, padding=True, return_tensors="np")
            logits = np.asarray(self.backend(batch), dtype=np.float64).reshape(len(chunk), -1)
            for i, row in zip(chunk, logits):
                rows[i] = row
        return self.head.adjust(np.stack(rows), records)

    def pair_outputs(self, raw: np.ndarray) -> PairOutputs:
        return self.head.outputs(self.calibration.scale(raw))

    def point_scores(self, raw: np.ndarray) -> np.ndarray:
        if isinstance(self.head, RewardHead):
            return RewardHead.rewards(raw)
        return self.head.outputs(raw).scores


class SklearnJudge(Judge):
    """An embedding judge (frozen sentence encoder + scikit-learn head); its raw outputs for pairs are
    log-probabilities in the study's class order (TIE, A, B), so temperature calibration applies as to logits."""

    backend_name = "sklearn"
    position_invariant = True  # EmbeddingJudge.predict_proba already averages both answer orders

    def __init__(self, card: JudgeCard, judge: EmbeddingJudge, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        # a pair judge of difference features also scores one answer: its reward r(question, answer)
        tasks = ("compare", "score") if judge.decomposable else ("compare",) if judge.kind == "pair" else ("score",)
        super().__init__(card, tasks, batch_size)
        self.judge = judge
        self.judge.embedder.batch_size = batch_size

    def raw_outputs(self, records: Sequence[PairRecord | PointRecord]) -> np.ndarray:
        from .embedding_judge import PROBA_COLUMNS

        if self.judge.kind == "pair" and records and isinstance(records[0], PointRecord):
            return self.judge.rewards(records).reshape(-1, 1)
        if self.judge.kind == "point":
            return np.asarray(self.judge.predict(records), dtype=np.float64).reshape(-1, 1)
        proba = self.judge.predict_proba(records)
        column = {v: i for i, v in enumerate(PROBA_COLUMNS)}
        ordered = np.empty_like(proba)
        for verdict, cls in CLASS_OF_VERDICT.items():
            ordered[:, cls] = proba[:, column[verdict]]
        return np.log(np.clip(ordered, 1e-12, None))

    def pair_outputs(self, raw: np.ndarray) -> PairOutputs:
        return Cls3Head().outputs(self.calibration.scale(raw))

    def point_scores(self, raw: np.ndarray) -> np.ndarray:
        return raw.reshape(-1)


class GenerateJudge(Judge):
    """A generative judge (``head: generative``, or any causal LM zero-shot): ``generative.GenerativeJudge``
    writes the judgement greedily and the scheme's parser reads it. A pair scheme compares, a point scheme scores.

    A parsed verdict is certain (one-hot probabilities); ``symmetric`` also judges the swapped pair (in the same
    batches) and averages the two one-hots: the verdict both orders give, TIE when they differ. Every result
    carries the generated text(s); one the parser cannot read is ``parsed=False``, never a default verdict or
    score (a symmetric result is unparsed if either order is). ``rank`` is the base class's: point schemes score
    each answer, pair schemes play every pair in both orders, and an unparsed game counts for neither answer."""

    backend_name = "generate"

    def __init__(self, card: JudgeCard, generator: GenerativeJudge,
                 batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        super().__init__(card, ("compare",) if generator.scheme.kind == "pair" else ("score",), batch_size)
        self.generator = generator
        self.generator.batch_size = batch_size
        self.encoder = generator.prompts  # its truncation report, like ModelJudge.encoder's

    @classmethod
    def zero_shot(cls, backbone: str, scheme: str, batch_size: int = 8) -> GenerateJudge:
        """An untrained causal LM judging in ``scheme`` (one with a parser), with a card that says so."""
        from .generative import GENERATIVE, GenerativeJudge

        gen = GenerativeJudge.from_backbone(backbone, scheme, batch_size=batch_size)
        runtime = {"backend": "generate", "max_new_tokens": gen.max_new_tokens, "decoding": "greedy"}
        card = JudgeCard(head=GENERATIVE, kind=gen.scheme.kind, backbone=backbone, scheme=scheme,
                         max_length=gen.prompts.policy.max_length + gen.max_new_tokens,
                         label_map={"parser": gen.parser.name}, runtime=runtime)
        return cls(card, gen, batch_size)

    @property
    def truncation(self) -> dict[str, Any]:
        return self.encoder.report.to_dict()

    def raw_outputs(self, records: Sequence[PairRecord | PointRecord]) -> np.ndarray:
        raise ValueError(f"this {self.card.head} judge writes its verdict: it has no logits (nothing to "
                         "calibrate)")

    def compare_batch(self, items: Sequence[PairInput], symmetric: bool = False) -> list[Comparison]:
        self.require("compare")
        records = [as_pair(item, Loc(BATCH, i)) for i, item in enumerate(items)]
        if not symmetric:
            return [_written_comparison([p]) for p in self.generator.generate(records)]
        parsed = self.generator.generate(records + [r.swapped() for r in records])
        return [_written_comparison([f, b]) for f, b in zip(parsed[:len(records)], parsed[len(records):])]

    def score_batch(self, items: Sequence[PointInput]) -> list[Score]:
        self.require("score")
        records = [as_point(item, Loc(BATCH, i)) for i, item in enumerate(items)]
        return [Score(p.score if p.ok else math.nan, parsed=p.ok, generated=(p.raw,))
                for p in self.generator.generate(records)]


def _written_comparison(parsed: Sequence[Parsed]) -> Comparison:
    """A comparison from the parsed output of the pair (and of the swapped pair, second)."""
    texts = tuple(p.raw for p in parsed)
    if not all(p.ok and p.verdict is not None for p in parsed):
        return Comparison(math.nan, math.nan, math.nan, None, parsed=False, generated=texts)
    verdicts = [parsed[0].verdict, *(p.verdict.swapped() for p in parsed[1:])]
    p_a, p_tie, p_b = (sum(v is side for v in verdicts) / len(verdicts)
                       for side in (Verdict.A, Verdict.TIE, Verdict.B))
    return Comparison(p_a, p_tie, p_b, verdicts[0] if len(set(verdicts)) == 1 else Verdict.TIE, generated=texts)


# -- loaders ----------------------------------------------------------------------------------------------

def detect_backend(directory: Path, card: JudgeCard) -> str:
    """The loader the card names (every export says "onnx", a generative judge "generate", a registered kind its
    own name); else sklearn for embedding judges, generate for generative judges, onnx when the directory holds an
    export, torch for HF weights."""
    named = card.runtime.get("backend")
    if named in LOADERS.names():
        return named
    if card.head == "embedding":
        return "onnx" if card.runtime.get("backend") == "onnx" else "sklearn"
    if card.head == "generative":
        return "generate"
    if card.runtime.get("onnx") or (directory / ONNX_VARIANTS["fp32"]).exists():
        return "onnx"
    if any((directory / name).exists() for name in TORCH_WEIGHTS):
        return "torch"
    raise FileNotFoundError(f"{directory}: no model found (neither {ONNX_VARIANTS['fp32']} nor "
                            f"{' / '.join(TORCH_WEIGHTS)})")


def onnx_model_path(directory: Path, card: JudgeCard, variant: str | None) -> Path:
    """The ONNX file of ``variant`` ("fp32" | "optimized" | "int8" | a file name); default: the card's primary."""
    if variant is None:
        name = card.runtime.get("onnx", {}).get("primary", ONNX_VARIANTS["fp32"])
    else:
        name = ONNX_VARIANTS.get(variant, variant)
    path = directory / name
    if not path.exists():
        have = sorted(p.name for p in directory.glob("*.onnx"))
        raise FileNotFoundError(f"{path} does not exist "
                                f"(variant {variant!r}; this directory holds {have or 'no ONNX files'})")
    return path


def load_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def _load_torch(directory: Path, card: JudgeCard, *, provider: str, variant: str | None, threads: int | None,
                batch_size: int, trust_pickle: bool = False) -> Judge:
    if variant is not None:
        raise ValueError(f"variant {variant!r} applies to ONNX judges; the torch backend loads the HF weights")
    if not any((directory / name).exists() for name in TORCH_WEIGHTS):
        raise FileNotFoundError(f"{directory}: the torch backend needs HF weights ({' / '.join(TORCH_WEIGHTS)}); "
                                "an exported directory holds ONNX files only (use backend='onnx')")
    return ModelJudge(card, load_tokenizer(directory), TorchBackend(directory, provider, threads), batch_size)


def _load_onnx(directory: Path, card: JudgeCard, *, provider: str, variant: str | None, threads: int | None,
               batch_size: int, trust_pickle: bool = False) -> Judge:
    if card.head == "embedding":  # an exported embedding judge: the decoder reader in onnxruntime, head in NumPy
        from .embedders.onnx_reader import OnnxDecoderReader
        from .embedding_judge import EmbeddingJudge, embedder_config

        if "reader" not in card.runtime:
            raise ValueError(f"{directory}: an embedding judge that was not exported has no ONNX reader; run "
                             "clfjudge export first, or load it with backend='sklearn'")
        reader = OnnxDecoderReader(directory, card.runtime["reader"], embedder_config(card), variant=variant,
                                   provider=provider, threads=threads, batch_size=batch_size)
        judge = SklearnJudge(card, EmbeddingJudge.load(directory, embedder=reader, trust_pickle=trust_pickle),
                             batch_size)
        judge.backend_name = f"onnx ({reader.variant})"
        return judge
    backend = OnnxBackend(onnx_model_path(directory, card, variant), provider, threads)
    return ModelJudge(card, load_tokenizer(directory), backend, batch_size)


def _load_sklearn(directory: Path, card: JudgeCard, *, provider: str, variant: str | None, threads: int | None,
                  batch_size: int, trust_pickle: bool = False) -> Judge:
    from .embedding_judge import EmbeddingJudge, embedder_for_card

    if variant is not None:
        raise ValueError(f"variant {variant!r} applies to ONNX judges, not to an embedding judge")
    if threads:
        import torch

        torch.set_num_threads(threads)
    embedder = embedder_for_card(card, batch_size=batch_size, device=provider)
    return SklearnJudge(card, EmbeddingJudge.load(directory, embedder=embedder, trust_pickle=trust_pickle), batch_size)


def _load_generate(directory: Path, card: JudgeCard, *, provider: str, variant: str | None, threads: int | None,
                   batch_size: int, trust_pickle: bool = False) -> Judge:
    from .generative import GenerativeJudge

    if variant is not None:
        raise ValueError(f"variant {variant!r} applies to ONNX judges; a generative judge has no ONNX form")
    if provider != "cpu":
        raise ValueError(f"provider {provider!r}: the generate backend runs on the CPU only")
    if threads:
        import torch

        torch.set_num_threads(threads)
    return GenerateJudge(card, GenerativeJudge.load(directory, batch_size), batch_size)


LOADERS: Registry[Callable[..., Judge]] = Registry("judge backend")
LOADERS.register("torch", _load_torch)
LOADERS.register("onnx", _load_onnx)
LOADERS.register("sklearn", _load_sklearn)
LOADERS.register("generate", _load_generate)
