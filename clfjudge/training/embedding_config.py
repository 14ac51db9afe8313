"""``head: embedding`` options, under the recipe key ``embedding`` (the embedding kind's trainer:
``training/embedding.py``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..batching import Budget
from .fields import described, options_from_dict


@dataclass(frozen=True)
class EmbeddingOptions:
    """``head: embedding`` options, under the recipe key ``embedding`` (training/embedding.py). The reader's options
    (``layer`` to ``device``) left None are the embedder's own defaults and are not passed to it (a sentence
    encoder takes none of the decoder's)."""

    arity: str = described("pair (verdicts) or point (scores)", "pair")
    head: str | None = described("logreg | gbdt (pairs), ridge | gbdt (points); None: logreg / ridge")
    features: list[str] | None = described("feature groups (judges.embedding.PAIR_FEATURES / POINT_FEATURES); None: "
                                           "the judge's")
    use_length: bool = described("add the length feature groups", True)
    head_params: dict[str, Any] | None = described("scikit-learn parameters of the head; None: {C: auto} for logreg")
    weighting: list[str] = described("training weights: [length] balances longer- and shorter-answer wins per source, "
                                     "[source] the sources (judges.embedding.training_weights)", factory=list)
    length_at_prediction: float = described("factor on the fitted length coefficients at prediction (0: removed)", 1.0)
    layer: int | None = described("decoder backbones: the layer whose states are pooled; None: the middle one")
    max_prompt_tokens: int | None = described("decoder backbones: prompt (template + question) budget")
    max_answer_tokens: int | None = described("decoder backbones: answer budget")
    stats: bool | None = described("decoder backbones: also compute token statistics (PMI with the question; feature "
                                   "group token_stats)")
    stats_tokens: int | None = described("decoder backbones: token statistics over each answer's first N tokens; "
                                         "None: all")
    precision: str | None = described("decoder backbones: fp32 | bf16 | auto (bf16 where the CPU has AMX / "
                                      "AVX512-BF16)")
    batch_size: int | None = described("embedding batch size")
    device: str | None = described("where the backbone reads: cpu (default) | cuda")
    verdict: dict[str, Any] | None = described("a chat model whose verdict on each answer is a feature (feature group "
                                               "verdict_diff / verdict): {backbone, questions [, precision, "
                                               "max_question_tokens, max_answer_tokens, batch_size]} (judges.verdict; "
                                               "the stacked judge)")

    READER = ("layer", "max_prompt_tokens", "max_answer_tokens", "stats", "stats_tokens", "precision", "batch_size",
              "device")

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "embedding") -> EmbeddingOptions:
        """From the recipe's ``embedding`` mapping, each value coerced to its field's type; an unknown key is
        refused naming ``where`` (file: embedding) and every known key with its help."""
        return options_from_dict(cls, data, where)

    def reader_options(self) -> dict[str, Any]:
        """The options given for the reader (``embedders.make_embedder``), ``batch_size`` as its budget's rows."""
        options = {k: getattr(self, k) for k in self.READER if getattr(self, k) is not None}
        if "batch_size" in options:
            options["budget"] = Budget(options.pop("batch_size"))
        return options
