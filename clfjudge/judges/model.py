"""Fine-tuned classifier judges: a sequence-classification model (``TorchBackend``) or its ONNX export
(``OnnxBackend``) behind ``FineTunedJudge``, which encodes records the way the judge was trained, runs them in
length-bucketed batches and maps the logits through the head and the card's calibration; and the fine-tuned
kind's ``torch`` / ``onnx`` loaders of ``Judge.load`` and how it tells them apart (``detect_backend``)."""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import progress
from ..batching import Budget
from ..card import JudgeCard
from ..data.records import PairRecord, PointRecord
from ..models.heads import HEADS, Head, PairOutputs, RewardHead
from ..models.onnx_session import check_gated, inference_session, resolve_provider
from ..options import LoadOptions
from ..untrusted import inside, read_json
from .base import DEFAULT_BATCH_SIZE, ONNX_VARIANTS, TORCH_WEIGHTS, Judge, loads

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# -- backends: padded numpy batch -> logits ------------------------------------------------------------------

Backend = Callable[[Mapping[str, np.ndarray]], np.ndarray]


class TorchBackend:
    """A HF sequence-classification model in eval mode (``device`` "cpu" or "cuda")."""

    name = "torch"

    def __init__(self, directory: str | Path, device: str = "cpu", trust_pickle: bool = False) -> None:
        import pickle

        import torch
        from transformers import AutoModelForSequenceClassification

        from ..machine import default_ds_accelerator

        self.device = device
        default_ds_accelerator()
        # A judge directory may come from anyone: no code from it runs, and a pickled checkpoint is read with
        # torch.load(weights_only=True) (tensors only) unless the caller trusts the directory.
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                directory, dtype=torch.float32, trust_remote_code=False, weights_only=not trust_pickle)
        except pickle.UnpicklingError as exc:
            raise ValueError(pickle_refusal(Path(directory), exc)) from None
        self.model = model.to(device).eval()
        self.inputs = tuple(inspect.signature(self.model.forward).parameters)

    def release(self) -> None:
        """Drop the model's weights (an export's reference, once read: the gate's sessions need the memory)."""
        self.model = None

    def __call__(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        import torch

        feed = {k: torch.from_numpy(np.asarray(v)).to(self.device) for k, v in batch.items() if k in self.inputs}
        with torch.inference_mode():
            return self.model(**feed).logits.float().cpu().numpy()


class OnnxBackend:
    """A session on one ONNX file: onnxruntime (CPU or CUDA) or OpenVINO (``runtimes.PROVIDERS``)."""

    name = "onnx"

    def __init__(self, model_path: str | Path, provider: str = "cpu", threads: int | None = None) -> None:
        self.path = Path(model_path)
        try:
            self.session = inference_session(self.path, provider, threads)
        except ValueError as exc:
            raise ValueError(exc if "unknown provider" in str(exc) else f"provider {provider!r}: {exc}") from None
        if provider != "cpu":
            self.name = f"onnx ({provider})"
        self.inputs = tuple(i.name for i in self.session.get_inputs())
        self.output = self.session.get_outputs()[0].name

    def __call__(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        missing = [name for name in self.inputs if name not in batch]
        if missing:
            raise ValueError(f"{self.path}: the model takes inputs {list(self.inputs)}, the tokenizer gave "
                             f"{sorted(batch)} (missing {missing})")
        feed = {name: np.asarray(batch[name], dtype=np.int64) for name in self.inputs}
        return self.session.run([self.output], feed)[0]


class FineTunedJudge(Judge):
    """A fine-tuned sequence-classification judge on a ``TorchBackend`` or an ``OnnxBackend``."""

    def __init__(self, card: JudgeCard, tokenizer: PreTrainedTokenizerBase, backend: Backend,
                 budget: Budget | int = DEFAULT_BATCH_SIZE) -> None:
        from ..prompts.encoding import Encoder

        if card.head not in HEADS:
            raise ValueError(f"judge_card.json field 'head': {card.head!r} is not a fine-tuned classifier head "
                             f"({', '.join(HEADS.names())})")
        if tokenizer.pad_token_id is None:
            raise ValueError("the judge's tokenizer has no pad token: batches cannot be padded")
        super().__init__(card, HEADS.get(card.head).tasks, budget)
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
        return [self.encoder.encode(r) for r in self._inputs(record)]

    def raw_outputs(self, records: Sequence[PairRecord | PointRecord]) -> np.ndarray:
        """Logits per record, shape (records, k * num_labels) for k sequences per record. The sequences are
        encoded, sorted by token length, run in batches within the judge's ``budget`` (``batching.Budget``: rows
        per record counted) and put back in order."""
        encoded = [self.encode(r) for r in records]
        seqs = [s for e in encoded for s in e]
        per_record = max(len(e) for e in encoded)
        rows: list[np.ndarray | None] = [None] * len(seqs)
        for chunk in self.budget.batches([len(s["input_ids"]) for s in seqs], per_record):
            batch = self.tokenizer.pad([seqs[i] for i in chunk], padding=True, return_tensors="np")
            logits = np.asarray(self.backend(batch), dtype=np.float64).reshape(len(chunk), -1)
            for i, row in zip(chunk, logits):
                rows[i] = row
            progress.advance(len(chunk), sum(len(seqs[i]["input_ids"]) for i in chunk))
        starts = np.cumsum([0] + [len(e) for e in encoded])
        return self.head.adjust(np.stack([np.concatenate(rows[a:b]) for a, b in zip(starts[:-1], starts[1:])]),
                                records)

    def sequence_lengths(self, records: Sequence[PairRecord | PointRecord]) -> list[list[int]]:
        return [[len(self.encoder.encode(r, count=False)["input_ids"]) for r in self._inputs(record)]
                for record in records]

    def _inputs(self, record: PairRecord | PointRecord) -> list[PairRecord | PointRecord]:
        return self.head.inputs(record) if isinstance(record, PairRecord) else [record]

    def pair_outputs(self, raw: np.ndarray) -> PairOutputs:
        return self.head.outputs(self.calibration.scale(raw))

    def point_scores(self, raw: np.ndarray) -> np.ndarray:
        if isinstance(self.head, RewardHead):
            return RewardHead.rewards(raw)
        return self.head.outputs(raw).scores


# -- loaders ----------------------------------------------------------------------------------------------

def onnx_model_path(directory: Path, card: JudgeCard, variant: str | None) -> Path:
    """The ONNX file of ``variant`` ("fp32" | "optimized" | "int8" | a file name); default: the card's primary.
    Every file the card names must lie inside the directory, the ones not run too (a card naming a file elsewhere
    has been tampered with)."""
    onnx = card.runtime.get("onnx", {})
    where = f"{directory / 'judge_card.json'} field 'runtime.onnx'"
    for named in [onnx.get("primary", ONNX_VARIANTS["fp32"]), *onnx.get("files", {})]:
        inside(directory, named, where)
    name = onnx.get("primary", ONNX_VARIANTS["fp32"]) if variant is None else ONNX_VARIANTS.get(variant, variant)
    path = inside(directory, name, f"{where} or variant")
    if not path.exists():
        have = sorted(p.name for p in directory.glob("*.onnx"))
        raise FileNotFoundError(f"{path} does not exist "
                                f"(variant {variant!r}; this directory holds {have or 'no ONNX files'})")
    return path


def load_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """The judge's tokenizer, padding on the right (a decoder's classifier reads the last token that is not pad;
    left padding would also shift its positions). A model without a pad token in its tokenizer but one in its
    config (TRL's RewardTrainer sets the config's) pads with that."""
    from ..machine import default_ds_accelerator

    default_ds_accelerator()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False)
    tokenizer.padding_side = "right"
    if tokenizer.pad_token_id is None and (directory / "config.json").is_file():
        pad = read_json(directory / "config.json").get("pad_token_id")
        if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < len(tokenizer):
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
    return tokenizer


def pickle_refusal(directory: Path, exc: Exception) -> str:
    """One line for a pickled checkpoint that holds more than tensors: the file, what it names, the opt-in."""
    files = sorted(p.name for p in directory.glob("pytorch_model*.bin")) or ["pytorch_model.bin"]
    named = next((line.strip() for line in str(exc).splitlines() if "Unsupported global" in line), "")
    return (f"{directory / files[0]}: a pickle that holds more than tensors, refused by "
            f"torch.load(weights_only=True){f' ({named})' if named else ''}; unpickling it runs whatever code it "
            "holds: only for a directory you trust, pass --trust-pickle (trust_pickle=True), or convert the weights "
            "to model.safetensors")


@loads(providers=("cpu", "cuda"))
def _load_torch(directory: Path, card: JudgeCard, options: LoadOptions) -> Judge:
    if not any((directory / name).exists() for name in TORCH_WEIGHTS):
        raise FileNotFoundError(f"{directory}: the torch backend needs HF weights ({' / '.join(TORCH_WEIGHTS)}); "
                                "an exported directory holds ONNX files only (use backend='onnx')")
    backend = TorchBackend(directory, options.provider, options.trust_pickle)
    return FineTunedJudge(card, load_tokenizer(directory), backend, options.budget)


@loads(providers=None)
def _load_onnx(directory: Path, card: JudgeCard, options: LoadOptions) -> Judge:
    variant, provider, why = resolve_provider(options, card.runtime.get("onnx", {}))
    path = onnx_model_path(directory, card, variant)
    check_gated(directory, card.runtime.get("onnx", {}), path.name, provider)
    backend = OnnxBackend(path, provider, options.threads)
    judge = FineTunedJudge(card, load_tokenizer(directory), backend, options.budget)
    judge.runtime_choice = {"provider": provider, "file": path.name, "why": why}
    return judge


def detect_backend(directory: Path, card: JudgeCard) -> str:
    """The fine-tuned kind's backend for a card that names none: onnx when the directory holds an export, torch
    for HF weights."""
    if card.runtime.get("onnx") or (directory / ONNX_VARIANTS["fp32"]).exists():
        return "onnx"
    if any((directory / name).exists() for name in TORCH_WEIGHTS):
        return "torch"
    raise FileNotFoundError(f"{directory}: no model found (neither {ONNX_VARIANTS['fp32']} nor "
                            f"{' / '.join(TORCH_WEIGHTS)})")
