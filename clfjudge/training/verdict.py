"""``clfjudge train`` for ``head: verdict``: a chat model's own verdict (``judges/verdict.py``) made into a judge
directory. Nothing is fitted in the model: the card records the backbone and the questions put to it (and their
verdict tokens), and, where the recipe names training sources, Davidson's tie model is fitted on the training split
(``judges.calibration``: the scale that makes r_A - r_B a probability, and when a pair is a tie) and the judge is
scored on dev / held-out / eval sources beside the baselines, on the same splits as every other head.

Options live under the config key ``verdict`` (see ``OPTIONS``); the backbone is the config's ``backbone``.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.records import Record
from ..models.heads import Head

if TYPE_CHECKING:
    from .config import TrainConfig

# option -> what it does (unknown options are refused, naming these)
OPTIONS = {
    "questions": "what the model is asked: names in clfjudge/configs/verdict.yaml (correct, on-topic, harmless: "
                 "pointwise; better: pairwise) or mappings with name, user, positive, negative [, system]; the "
                 "first one decides; default [correct]",
    "precision": "fp32 | bf16 | auto (bf16 where the machine computes in it); default auto",
    "max_question_tokens": "question budget (first and last tokens kept); default 384",
    "max_answer_tokens": "budget of each answer (first and last tokens kept); default 512",
    "batch_size": "prompts per forward pass; default 8",
    "calibrate": "fit Davidson's tie model on the training split (true where sources are given); default true",
}


class VerdictDataHead(Head):
    """The data side of the verdict judge for the shared split builder: labelled pairs."""

    name = "verdict"
    kind = "pair"
    num_labels = 0
    problem_type = ""
    scheme_suffix = "verdict"
    best_metric = "accuracy"
    position_invariant = True  # both orders are judged where it matters: swap augmentation adds nothing

    def _unusable(self, record: Record) -> str | None:
        if record.kind != "pair":
            return f"{record.kind} record (a verdict judge is calibrated on pairs)"
        return None if record.verdict is not None else "pair without a verdict"


def options_of(cfg: TrainConfig) -> dict[str, Any]:
    options = dict(cfg.verdict)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"train config: verdict: unknown option(s) {unknown}; known: "
                         + "; ".join(f"{k}: {v}" for k, v in OPTIONS.items()))
    return options


def train_verdict(cfg: TrainConfig) -> Path:
    """Write the verdict judge's directory: its card, calibrated and scored where the recipe names sources."""
    from ..judges.verdict import (
        DEFAULT_MAX_ANSWER_TOKENS,
        DEFAULT_MAX_QUESTION_TOKENS,
        DEFAULT_QUESTION,
        VerdictJudge,
        open_reader,
        questions_from,
        verdict_card,
    )

    start = time.monotonic()
    options = options_of(cfg)
    questions = questions_from(options.get("questions", [DEFAULT_QUESTION]), "train config: verdict.questions")
    card = verdict_card(cfg.backbone, questions, precision=options.get("precision", "auto"),
                        max_question_tokens=int(options.get("max_question_tokens", DEFAULT_MAX_QUESTION_TOKENS)),
                        max_answer_tokens=int(options.get("max_answer_tokens", DEFAULT_MAX_ANSWER_TOKENS)))
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    training: dict[str, Any] = {"config": asdict(cfg), "fitted": "nothing: zero-shot"}
    if cfg.sources or cfg.eval_sources:
        from .data import build_splits

        splits = build_splits(cfg, VerdictDataHead())
        judge = VerdictJudge(card, open_reader(card, batch_size=int(options.get("batch_size", 8))))
        if splits.train and options.get("calibrate", True):
            card.calibration = _calibrate(judge, splits.train)
            judge = VerdictJudge(card, judge.reader)
            training["fitted"] = f"Davidson's tie model on {len(splits.train)} training pairs"
        card.validation = {name: _evaluate(judge, records)
                           for name, records in [("dev", splits.dev), ("test", splits.test),
                                                 *((f"eval:{n}", r) for n, r in splits.evals.items())] if records}
        training |= {"sources": splits.sources, "split": splits.counts, "content": splits.content}
    card.training = training | {"wall_time_s": round(time.monotonic() - start, 1)}
    card.save(out)
    return out


def _calibrate(judge, records) -> dict[str, Any]:
    from ..judges.calibration import fit_calibration

    forward = judge.raw_outputs(records)
    reverse = forward[:, ::-1] if judge.position_invariant else judge.raw_outputs([r.swapped() for r in records])
    return fit_calibration("verdict", forward, reverse, [r.verdict for r in records])


def _evaluate(judge, records) -> dict[str, Any]:
    from ..metrics import evaluate_pairs

    forward = [c.verdict for c in judge.compare_batch(records)]
    swapped = [c.verdict for c in judge.compare_batch([r.swapped() for r in records])]
    return evaluate_pairs(records, forward, swapped, baselines=True)
