"""``head: verdict`` options, under the recipe key ``verdict`` (the verdict kind's trainer: ``training/verdict.py``);
the backbone is the recipe's ``backbone``. A verdict judge fits nothing in its model, so it trains without sources
(``needs_sources``): zero-shot, or calibrated where the recipe names them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .fields import described, options_from_dict


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
    batch_size: int = described("prompts per forward pass", 8)
    calibrate: bool = described("fit Davidson's tie model on the training split (where sources are given)", True)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "verdict") -> VerdictOptions:
        """From the recipe's ``verdict`` mapping, each value coerced to its field's type; an unknown key is refused
        naming ``where`` (file: verdict) and every known key with its help."""
        return options_from_dict(cls, data, where)
