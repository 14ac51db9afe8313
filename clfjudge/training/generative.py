"""Training of the generative baseline (``train_generative``, reached through ``clfjudge train`` with ``head:
generative``): the same decoder, prompt and hyperparameters as a classifier head, but the LM head learns to write
the judgement. The prompt is the scheme's rendering of the record (``decoder-pair-gen`` / ``decoder-point-gen``,
UnlimitedJudge's "[INST]" input ending in "[Feedback]"), the target is ``schemes.target`` (e.g. "1" / "2" / "Tie") plus
EOS, and the loss covers only the target tokens (prompt positions are labelled -100). Splits, decontamination,
swap augmentation and truncation are the classifier trainer's, so the two kinds see the same data. Dev, held-out
and eval sources are then judged greedily (``judges.generative.GenerativeReader``) and scored by ``evaluate``.
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.conversation import FLATTENING
from ..data.records import Record
from ..judges.generative import DEFAULT_SCHEME, GENERATIVE, GenerativeReader, PromptEncoder, _tokenizer
from ..machine import default_ds_accelerator
from ..models.heads import Head
from ..prompts.schemes import SCHEMES, RenderError, target
from ..prompts.truncation import TruncationPolicy

if TYPE_CHECKING:
    from .config import TrainConfig
    from .data import Splits


class GenerativeHead(Head):
    """The data side of a head for the shared split builder: a record is usable when the scheme can write its
    label as a target that its parser reads back."""

    name = GENERATIVE
    num_labels = 0
    problem_type = ""
    scheme_suffix = "pair-gen"
    best_metric = "loss"

    def __init__(self, scheme: str = DEFAULT_SCHEME) -> None:
        self.scheme = scheme
        self.arity = SCHEMES.get(scheme).arity  # type: ignore[misc]

    def _unusable(self, record: Record) -> str | None:
        if record.arity != self.arity:
            return f"{record.arity} record (scheme {self.scheme} judges {self.arity}s)"
        try:
            target(record, self.scheme)
        except RenderError:
            return f"label not writable as a {self.scheme} target"
        return None


def max_target_tokens(tokenizer, scheme: str, records: Sequence[Record]) -> int:
    """The longest target in tokens, plus EOS: the generation budget and the room the prompt leaves."""
    return 1 + max(len(tokenizer(target(r, scheme), add_special_tokens=False)["input_ids"]) for r in records)


def evaluate(judge: GenerativeReader, records: Sequence[Record]) -> dict[str, Any]:
    """``metrics``' evaluation of a labelled set; a parse failure counts as a wrong verdict (pairs) or is left out
    and counted (scores). Pairs are also judged swapped (Auto-J agreement and position consistency)."""
    from ..metrics import evaluate_pairs, evaluate_points

    before = judge.stats.total(judge.parser.name)
    if judge.scheme.arity == "pair":
        forward = judge.verdicts(records)
        swapped = judge.verdicts([r.swapped() for r in records])
        out = evaluate_pairs(records, forward, swapped, failures="count_wrong")
    else:  # fewer than two parsed scores: correlations reported as missing, not as zero
        out = evaluate_points(records, judge.scores(records), failures="exclude")
    out["outputs"] = judge.stats.total(judge.parser.name) - before
    return out


def _lm_trainer(cfg: TrainConfig, head: GenerativeHead, model, tokenizer, prompts: PromptEncoder,
                records: Sequence[Record], ckpt_dir: Path):
    """The HF ``Trainer`` of the LM head on the training records (prompt + target, the prompt's labels -100)."""
    import datasets
    from transformers import DataCollatorForSeq2Seq, Trainer

    from .config import training_arguments

    rows = [prompts.example(r) for r in records]
    for row in rows:
        row["length"] = len(row["input_ids"])
    args = training_arguments(cfg, head, ckpt_dir, has_dev=False)  # dev is scored by generation afterwards
    return Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                   data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, padding=True),
                   processing_class=tokenizer)


def _validate(judge: GenerativeReader, head: GenerativeHead, splits: Splits) -> dict[str, Any]:
    """Greedy judgements of dev, the held-out fold and every eval source, scored (pairs beside the baselines)."""
    from ..metrics import pair_baselines

    validation: dict[str, Any] = {}
    for name, records in [("dev", splits.dev), ("test", splits.test),
                          *((f"eval:{n}", r) for n, r in splits.evals.items())]:
        if records:
            validation[name] = evaluate(judge, records)
            if head.arity == "pair":
                validation[name]["baselines"] = pair_baselines(records)
    return validation


def train_generative(cfg: TrainConfig) -> Path:
    """``clfjudge train`` for ``head: generative``: LM-head fine-tuning on the judgement tokens, then greedy
    evaluation on dev / test / eval sources. Returns the judge directory (HF causal LM + judge card)."""
    from transformers import set_seed

    from ..card import JudgeCard
    from ..models.backbones import load_causal_lm, resolve_backbone
    from .config import save_arguments
    from .data import build_splits

    start = time.monotonic()
    default_ds_accelerator()
    set_seed(cfg.seed)
    scheme = cfg.scheme or DEFAULT_SCHEME
    head = GenerativeHead(scheme)
    info = resolve_backbone(cfg.backbone)
    if info.family != "decoder":
        raise ValueError(f"backbone {cfg.backbone!r} is an {info.family}: the generative baseline needs a decoder")
    splits = build_splits(cfg, head)
    tokenizer = _tokenizer(info)
    tokenizer.padding_side = "right"  # training pads after the target (the labels are -100 there)
    model = load_causal_lm(info, tokenizer=tokenizer)
    budget = max_target_tokens(tokenizer, scheme, splits.train + splits.dev)
    prompts = PromptEncoder(tokenizer, scheme, TruncationPolicy(max_length=cfg.max_length - budget,
                                                                budgets=dict(cfg.budgets),
                                                                head_fraction=cfg.head_fraction),
                            use_reference=cfg.ref_drop < 1.0)

    out_dir = Path(cfg.output_dir)
    ckpt_dir = out_dir / "checkpoints"
    trainer = _lm_trainer(cfg, head, model, tokenizer, prompts, splits.train, ckpt_dir)
    result = trainer.train()

    tokenizer.padding_side = "left"
    judge = GenerativeReader(model, tokenizer, scheme, cfg.max_length, budget, cfg.ref_drop < 1.0,
                            batch_size=cfg.eval_batch_size or cfg.batch_size)
    validation = _validate(judge, head, splits)
    wall = time.monotonic() - start

    trainer.save_model(str(out_dir))
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(out_dir))
        card = JudgeCard(
            kind=GENERATIVE, arity=head.arity, backbone=cfg.backbone, scheme=scheme, max_length=cfg.max_length,
            truncation={"policy": asdict(prompts.policy), "use_reference": prompts.use_reference,
                        "conversation": FLATTENING,
                        "report": {"train": prompts.report.to_dict(), "eval": judge.prompts.report.to_dict()}},
            template=getattr(SCHEMES.get(scheme), "template", ""),
            label_map={"parser": SCHEMES.get(scheme).parser},
            training={
                "sources": splits.sources, "split": splits.counts, "config": asdict(cfg),
                "content": splits.content,
                "backbone": asdict(info), "global_steps": result.global_step,
                "train_loss": result.training_loss, "log_history": trainer.state.log_history,
                "wall_time_s": round(wall, 1), "device": str(trainer.args.device),
                "loss": "causal LM cross-entropy on the target tokens only",
            },
            validation=validation,
            runtime={"backend": "generate", "max_new_tokens": budget, "decoding": "greedy",
                     "parse_stats": judge.stats.to_dict()},
        )
        card.save(out_dir)
        save_arguments(trainer, out_dir)
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return out_dir
