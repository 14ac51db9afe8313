"""The fine-tuned verdict student (``clfjudge distill`` with ``head: verdict`` and ``verdict.lora``): a small chat
model taught to give the teacher's verdict itself, read as the zero-shot verdict judge reads it.

The student asks one question (the recipe's ``verdict.questions``, else the teacher's card's first, else
``correct``) and its reward is the log-odds of its own verdict tokens at the reply's first token
(``judges.verdict.verdict_module``), each answer's prompt built and cut by ``VerdictReader.prompt`` as at scoring
time, to the recipe's token budgets, else the teacher card's (the student reads what the teacher read). A LoRA
adapter (peft) on the decoder learns, in the HF ``Trainer`` loop (the recipe's lr, epochs, max_steps, batch_size in
pairs, grad_accum, warmup, scheduler, gradient_checkpointing, seed), so that those log-odds match the teacher's,
then is merged into the weights: the judge directory holds a plain model directory (``model/``) and a
verdict card that names it, so it loads, scores, calibrates and exports exactly as a zero-shot verdict judge does.

The loss (per pair, soft targets) is

    KL(p || sigmoid(r_A - r_B))  +  pointwise_weight * mean((r - s * t)^2 over the pair's two answers)

with ``p`` the teacher's P(A) and ``s * t`` its reward scaled by its calibration (``LabelSet.rewards``, so that
p = sigmoid(s * t_A - s * t_B)). The pairwise term is the one a comparison depends on; it holds for every teacher
(a pointwise label directory, a pairwise one, a judge, a predictions file), reads a soft target as the probability
it is (a confident teacher pulls harder, a 0.5 pulls the margin to 0), and leaves the per-question level of the
reward free, which a small student need not spend capacity on. The pointwise term, where a pointwise label
directory gives per-answer rewards, anchors that level (weakly, by default) so the student's ``score`` reads on
the teacher's scale. KL is the cross-entropy less the target's entropy: 0 where the student matches.
"""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..batching import Budget
from ..data.records import PairRecord, PointRecord
from .labels import TEACHER_REWARDS

if TYPE_CHECKING:
    from .config import TrainConfig
    from .verdict_config import LoraOptions, VerdictOptions

MODEL_DIR = "model"  # the merged model, inside the judge directory (the card's backbone, relative to it)


def peft_config(lora: LoraOptions):
    """peft's ``LoraConfig`` of the recipe's ``verdict.lora``."""
    from peft import LoraConfig, TaskType

    targets = "all-linear" if lora.target_modules == ["all-linear"] else list(lora.target_modules)
    return LoraConfig(task_type=TaskType.CAUSAL_LM, r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=targets, bias="none")


def student_question(options: VerdictOptions, teacher_card: Mapping[str, Any] | None, where: str):
    """The one question the student learns: the recipe's, else the teacher's card's first, else the default."""
    from ..judges.verdict import DEFAULT_QUESTION, VERDICT, questions_from

    named = options.questions
    # the card as the labels recorded it: "kind" (its layout since version 3) or "head" (before)
    verdict_teacher = teacher_card is not None and VERDICT in (teacher_card.get("kind"), teacher_card.get("head"))
    teacher_questions = (teacher_card.get("runtime") or {}).get("questions") if verdict_teacher else None
    spec = named if named else (list(teacher_questions[:1]) if teacher_questions else [DEFAULT_QUESTION])
    questions = questions_from(spec, f"{where} verdict.questions" if named else f"{where} (the teacher's question)")
    if len(questions) > 1:
        raise ValueError(f"{where} verdict.questions: a fine-tuned verdict student learns one question; got "
                         f"{[q.name for q in questions]}")
    if questions[0].pairwise:
        raise ValueError(f"{where} verdict.questions: {questions[0].name!r} is pairwise; a fine-tuned verdict student "
                         "asks a pointwise question (name one, e.g. correct)")
    return questions[0]


class VerdictStudent:
    """A verdict judge whose chat model (the recipe's ``backbone``) is fine-tuned on a teacher's soft targets (the
    distill loop's student: ``fit``, ``p_a``, ``save``). Before ``fit`` it is the zero-shot verdict judge of the
    same backbone and question."""

    def __init__(self, cfg: TrainConfig, teacher_card: Mapping[str, Any] | None = None,
                 where: str = "student recipe") -> None:
        from ..judges.verdict import DEFAULT_MAX_ANSWER_TOKENS, DEFAULT_MAX_QUESTION_TOKENS
        from ..machine import decoder_precision
        from ..models.backbones import load_causal_lm, load_tokenizer, resolve_backbone

        where = f"{where}:"
        options = cfg.verdict  # checked key by key when the recipe was read (verdict_config.VerdictOptions)
        if options.lora is None:
            raise ValueError(f"{where} a verdict student is fine-tuned: give verdict.lora (e.g. lora: {{r: 16, alpha: "
                             "32}}); a zero-shot verdict judge is written by clfjudge train")
        self.cfg, self.lora, self.pointwise_weight = cfg, options.lora, options.pointwise_weight
        self.question = student_question(options, teacher_card, where)
        self.precision, self.batch_size = options.precision, options.batch_size
        decoder_precision(self.precision)  # an unknown one refused now, not after training
        read = (teacher_card or {}).get("truncation") or {}
        self.budgets = {"max_question_tokens": options.max_question_tokens or int(read.get(
                            "max_question_tokens", DEFAULT_MAX_QUESTION_TOKENS)),
                        "max_answer_tokens": options.max_answer_tokens or int(read.get(
                            "max_answer_tokens", DEFAULT_MAX_ANSWER_TOKENS))}
        info = resolve_backbone(cfg.backbone)
        if info.family != "decoder":
            raise ValueError(f"{where} backbone {cfg.backbone!r} is an {info.family}: a verdict student is a chat "
                             "model (a decoder)")
        self.tokenizer = load_tokenizer(info, padding_side="right")
        self.model = load_causal_lm(info, tokenizer=self.tokenizer)
        self.trained: dict[str, Any] = {}
        self.device = "cpu"  # where the model is: the trainer's device once trained
        self._reading = None

    # -- reading ------------------------------------------------------------------------------------------------
    def reader(self, precision: str = "fp32"):
        """A ``VerdictReader`` over the student's model as it is now (bf16 reads a copy: the reader casts its
        model, and the weights stay fp32 to be trained and saved)."""
        from ..judges.verdict import VerdictReader
        from ..machine import decoder_precision

        model = self.model if decoder_precision(precision, self.device)[0] == "fp32" else copy.deepcopy(self.model)
        return VerdictReader(model, self.tokenizer, [self.question], precision=precision,
                             budget=Budget(self.batch_size), device=self.device, **self.budgets)

    def rewards(self, records: Sequence[PairRecord]) -> np.ndarray:
        """(pairs, 2): the student's reward of each pair's answers, in the card's precision."""
        if self._reading is None:
            self._reading = self.reader(self.precision)
        points = [p for r in records for p in _answers(r)]
        return self._reading.log_odds(points)[:, 0].reshape(len(records), 2)

    def p_a(self, records: Sequence[PairRecord]) -> np.ndarray:
        from scipy.special import expit

        rewards = self.rewards(records)
        return expit(rewards[:, 0] - rewards[:, 1])

    # -- training -----------------------------------------------------------------------------------------------
    def _rows(self, reader, records: Sequence[PairRecord]) -> list[dict[str, Any]]:
        from ..judges.embedding import SOFT_TARGET

        rows = []
        for r in records:
            a, b = (reader.prompt_ids(self.question, p) for p in _answers(r))
            rewards = r.meta.get(TEACHER_REWARDS)
            rows.append({"a": a, "b": b, "p_a": float(r.meta[SOFT_TARGET]),
                         "rewards": [float(x) for x in rewards] if rewards else [math.nan, math.nan],
                         "length": len(a) + len(b)})
        return rows

    def fit(self, records: Sequence[PairRecord]) -> VerdictStudent:
        """Fine-tune the adapter on the pairs' soft targets (``meta[SOFT_TARGET]``, and the teacher's per-answer
        rewards where ``meta[TEACHER_REWARDS]`` holds them), then merge it into the model."""
        import tempfile

        import datasets
        from peft import get_peft_model
        from transformers import set_seed

        from ..machine import decoder_precision, default_ds_accelerator
        from .config import training_arguments
        from .verdict import VerdictDataHead

        start = time.monotonic()
        default_ds_accelerator()
        set_seed(self.cfg.seed)
        reader = self.reader("fp32")  # the prompts, and the log-odds graph over the decoder being adapted
        rows = self._rows(reader, records)
        pointwise = sum(not math.isnan(row["rewards"][0]) for row in rows)
        adapted = get_peft_model(self.model, peft_config(self.lora))
        trainable, total = adapted.get_nb_trainable_parameters()
        with tempfile.TemporaryDirectory(prefix="verdict-student-") as scratch:  # no checkpoint is kept
            args = training_arguments(self.cfg, VerdictDataHead(), Path(scratch), has_dev=False)
            precision, why = decoder_precision(self.precision, args.device.type)
            trainer = _trainer(log_odds=reader.modules[0], precision=precision,
                               pointwise_weight=float(self.pointwise_weight), model=adapted, args=args,
                               train_dataset=datasets.Dataset.from_list(rows),
                               data_collator=_Collator(self.tokenizer.pad_token_id or 0))
            result = trainer.train()
        self.model = adapted.merge_and_unload().eval()
        self.device, self._reading = args.device.type, None
        self.trained = {
            "method": "LoRA (peft), merged into the weights", "lora": asdict(self.lora),
            "loss": "KL(teacher P(A) || sigmoid(r_A - r_B)) + pointwise_weight * MSE(r, teacher's scaled reward)",
            "pointwise_weight": self.pointwise_weight, "pairs": len(rows), "pairs_with_rewards": pointwise,
            "trainable_parameters": trainable, "parameters": total, "precision": precision, "precision_why": why,
            "steps": result.global_step, "train_loss": result.training_loss,
            "prompt_tokens_per_epoch": sum(row["length"] for row in rows),
            "log_history": trainer.state.log_history, "wall_time_s": round(time.monotonic() - start, 1)}
        return self

    # -- the judge directory ------------------------------------------------------------------------------------
    def save(self, directory: str | Path, training: dict[str, Any]) -> Path:
        """The judge directory: ``model/`` (the merged model and its tokenizer) and a verdict card naming it."""
        from ..judges.verdict import verdict_card

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory / MODEL_DIR)
        self.tokenizer.save_pretrained(directory / MODEL_DIR)
        card = verdict_card(MODEL_DIR, [self.question], precision=self.precision,
                            training={**training, "fine_tuned": {**self.trained, "backbone": self.cfg.backbone}},
                            **self.budgets)
        card.save(directory)
        return directory


def _answers(record: PairRecord) -> tuple[PointRecord, PointRecord]:
    """A pair's two answers as the records a pointwise verdict reads (their prompts hold question and answer)."""
    return tuple(PointRecord(id=f"{record.id}:{side}", question=record.question, answer=answer, score=None,
                             meta=record.meta) for side, answer in (("a", record.answer_a), ("b", record.answer_b)))


class _Collator:
    """A batch of pairs as one right-padded batch of prompts: every pair's answer A, then every answer B."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        prompts = [row["a"] for row in rows] + [row["b"] for row in rows]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, :len(p)], mask[i, :len(p)] = torch.tensor(p), 1
        return {"input_ids": ids, "attention_mask": mask, "p_a": torch.tensor([row["p_a"] for row in rows]),
                "rewards": torch.tensor([row["rewards"] for row in rows])}


def _trainer(**kw: Any):
    """The HF Trainer with the student's loss (the class is built here: transformers loads only when a student
    trains)."""
    from transformers import Trainer

    class LogOddsTrainer(Trainer):
        """The HF Trainer with the student's loss: the verdict log-odds of both answers of each pair (``log_odds``:
        ``verdict_module`` over the adapted decoder) against the teacher's P(A) and rewards."""

        def __init__(self, *, log_odds, precision: str, pointwise_weight: float, **kw: Any) -> None:
            super().__init__(**kw)
            self.log_odds, self.precision, self.pointwise_weight = log_odds, precision, pointwise_weight

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            import torch
            import torch.nn.functional as F

            from ..embedders.decoder import autocast

            ids = inputs["input_ids"]
            if self.log_odds.weight.device != ids.device:
                self.log_odds.to(ids.device)
            with autocast(self.precision, ids.device.type):
                values = self.log_odds(ids, inputs["attention_mask"]).float()
            n = ids.shape[0] // 2
            p = inputs["p_a"].float().clamp(1e-6, 1 - 1e-6)
            entropy = -(p * p.log() + (1 - p) * (1 - p).log())
            loss = (F.binary_cross_entropy_with_logits(values[:n] - values[n:], p, reduction="none") - entropy).mean()
            target = inputs["rewards"].float()
            known = ~torch.isnan(target)
            if self.pointwise_weight and known.any():
                mine = torch.stack([values[:n], values[n:]], dim=1)
                loss = loss + self.pointwise_weight * ((mine - target.nan_to_num()) ** 2)[known].mean()
            return (loss, values) if return_outputs else loss

    return LogOddsTrainer(**kw)
