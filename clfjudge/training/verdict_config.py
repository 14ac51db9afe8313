"""``head: verdict`` options, under the recipe key ``verdict`` (the verdict kind's trainer: ``training/verdict.py``);
the backbone is the recipe's ``backbone``. A verdict judge fits nothing in its model, so it trains without sources
(``needs_sources``): zero-shot, or calibrated where the recipe names them. ``lora`` and ``pointwise_weight`` are a
fine-tuned student's (``clfjudge distill``: ``training/verdict_student.py``)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from ..batching import DEFAULT_BATCH_SIZE
from .fields import described, options_from_dict

# the output layer's verdict rows are read as frozen copies (judges.verdict.verdict_module), and with tied embeddings
# the input embeddings are the output layer: an adapter there would train what the judge never reads
NOT_ADAPTED = ("lm_head", "embed_tokens", "wte", "embed_out", "output_layer")


@dataclass(frozen=True)
class LoraOptions:
    """The recipe's ``verdict.lora``: the LoRA adapter (peft's ``LoraConfig``) a verdict student is fine-tuned
    with."""

    r: int = described("the adapter's rank", 16)
    alpha: float = described("the adapter's scale numerator (its update is scaled by alpha / r)", 32.0)
    dropout: float = described("dropout on the adapter's input, in [0, 1)", 0.05)
    target_modules: list[str] = described("the decoder's modules adapted (e.g. [q_proj, v_proj]); [all-linear]: "
                                          "every linear layer but the output layer", factory=lambda: ["all-linear"])

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "lora") -> LoraOptions:
        """From the recipe's ``verdict.lora`` mapping; a value out of range is refused naming ``where.key``."""
        out = options_from_dict(cls, data, where)
        checks = [(out.r > 0, "r", "a positive integer"), (out.alpha > 0, "alpha", "a positive number"),
                  (0 <= out.dropout < 1, "dropout", "a number in [0, 1)"),
                  (bool(out.target_modules) and all(out.target_modules), "target_modules", "a list of module names")]
        for ok, key, what in checks:
            if not ok:
                raise ValueError(f"{where}.{key}: expected {what}, got {getattr(out, key)!r}")
        frozen = [m for m in out.target_modules if m in NOT_ADAPTED]
        if frozen:
            raise ValueError(f"{where}.target_modules: {frozen[0]!r} is the output layer or the embeddings, which "
                             "the verdict reads frozen; adapt the decoder's layers (e.g. q_proj, v_proj, or "
                             "all-linear)")
        return out


@dataclass(frozen=True)
class VerdictOptions:
    """What the chat model is asked and how it reads (``judges.verdict``)."""

    needs_sources: ClassVar[bool] = False  # a verdict judge can be zero-shot

    questions: list[Any] | None = described(
        "what the model is asked: names in clfjudge/configs/verdict.yaml (correct, on-topic, harmless: pointwise; "
        "better: pairwise) or mappings with name, user, positive, negative [, system]; the first one decides; None: "
        "[correct]")
    precision: str = described("fp32 | bf16 | auto (bf16 where the machine computes in it)", "auto")
    max_question_tokens: int | None = described("question budget (first and last tokens kept); None: 384")
    max_answer_tokens: int | None = described("budget of each answer (first and last tokens kept); None: 512")
    batch_size: int = described("prompts per forward pass", DEFAULT_BATCH_SIZE)
    calibrate: bool = described("fit Davidson's tie model on the training split (where sources are given)", True)
    lora: LoraOptions | None = described(
        "clfjudge distill only: fine-tune the model until its own verdict matches the teacher's, with a LoRA adapter "
        "(peft) merged into the weights: {r, alpha, dropout, target_modules} (verdict_config.LoraOptions; {}: its "
        "defaults); lr, epochs, batch_size (pairs), grad_accum are the recipe's")
    pointwise_weight: float = described(
        "clfjudge distill with lora: weight of the per-answer term (the student's log-odds against the teacher's "
        "scaled reward, where a pointwise label directory gives it) beside the pairwise one", 0.1)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "verdict") -> VerdictOptions:
        """From the recipe's ``verdict`` mapping, each value coerced to its field's type; an unknown key is refused
        naming ``where`` (file: verdict) and every known key with its help."""
        out = options_from_dict(cls, data, where)
        if not (math.isfinite(out.pointwise_weight) and out.pointwise_weight >= 0):
            raise ValueError(f"{where}.pointwise_weight: expected a number >= 0, got {out.pointwise_weight!r}")
        return out
