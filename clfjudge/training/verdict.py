"""``clfjudge train`` for ``head: verdict``: a chat model's own verdict (``judges/verdict.py``) made into a judge
directory. Nothing is fitted in the model: the card records the backbone and the questions put to it (and their
verdict tokens), and, where the recipe names training sources, Davidson's tie model is fitted on the training split
(``judges.calibration``: the scale that makes r_A - r_B a probability, and when a pair is a tie) and the judge is
scored on dev / held-out / eval sources beside the baselines, on the same splits as every other head.

Options live under the config key ``verdict`` (``verdict_config.VerdictOptions``); the backbone is the config's
``backbone``.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..batching import Budget
from ..data.records import Record
from ..models.heads import Head

if TYPE_CHECKING:
    from .config import TrainConfig

class VerdictDataHead(Head):
    """The data side of the verdict judge for the shared split builder: labelled pairs."""

    name = "verdict"
    arity = "pair"
    num_labels = 0
    problem_type = ""
    scheme_suffix = "verdict"
    best_metric = "accuracy"
    position_invariant = True  # both orders are judged where it matters: swap augmentation adds nothing

    def _unusable(self, record: Record) -> str | None:
        if record.arity != "pair":
            return f"{record.arity} record (a verdict judge is calibrated on pairs)"
        return None if record.verdict is not None else "pair without a verdict"


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
    options = cfg.verdict  # checked key by key when the recipe was read (verdict_config.VerdictOptions)
    if options.lora is not None:
        raise ValueError("train config: verdict.lora fine-tunes a student on a teacher's labels: run clfjudge distill "
                         "LABELS --recipe RECIPE --out DIR (clfjudge train writes a zero-shot verdict judge)")
    questions = questions_from(options.questions or [DEFAULT_QUESTION], "train config: verdict.questions")
    card = verdict_card(cfg.backbone, questions, precision=options.precision,
                        max_question_tokens=options.max_question_tokens or DEFAULT_MAX_QUESTION_TOKENS,
                        max_answer_tokens=options.max_answer_tokens or DEFAULT_MAX_ANSWER_TOKENS)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    training: dict[str, Any] = {"config": asdict(cfg), "fitted": "nothing: zero-shot"}
    if cfg.sources or cfg.eval_sources:
        from .data import build_splits

        splits = build_splits(cfg, VerdictDataHead())
        judge = VerdictJudge(card, open_reader(card, budget=Budget(options.batch_size)))
        if splits.train and options.calibrate:
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
