"""Fine-tune a classifier judge with the HF Trainer and write a judge directory.

Flow: ``TrainConfig`` (YAML + ``--set key=value`` overrides over an optional Table 7 preset) -> records from
the train sources, kept or excluded (counted) by the head -> grouped held-out fold (optional) -> removal of
training questions that also occur in any evaluation data -> grouped dev split -> cap -> reference drop and
swap augmentation -> ``Encoder`` (the same encoding inference uses) -> HF ``Trainer`` with the head's loss,
early stopping on the dev metric, optional DeepSpeed ZeRO-2 -> post-hoc calibration on dev -> held-out and
eval-source metrics (with the majority-class and longer-answer baselines) -> ``save_pretrained`` +
``judge_card.json``.

The config lives in ``config.py`` and the data pipeline, shared with the other trainers, in ``data.py``; heads
trained by another loop (generative, embedding) are dispatched through ``config.TRAINERS``.
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.records import Record
from ..machine import default_ds_accelerator
from ..metrics import pair_baselines
from ..models.heads import FINE_TUNED, HEADS, Head, PairOutputs
from .config import TRAINERS, TrainConfig, save_arguments, training_arguments
from .data import Splits, build_splits

if TYPE_CHECKING:
    from ..models.backbones import BackboneInfo


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


# -- trainer wiring ---------------------------------------------------------------------------------------

def in_order_eval(trainer_cls):
    """``trainer_cls`` with a sequential eval sampler. Under ``train_sampling_strategy="group_by_length"``
    transformers (>= 4.45) also length-groups *evaluation* with a shuffling sampler and returns predictions in
    that order, unmatched to the records: early stopping, calibration and every validation metric would score
    noise. We sort eval sets by length ourselves (``_by_length``) and keep the order."""
    from torch.utils.data import SequentialSampler

    class InOrderEvalTrainer(trainer_cls):
        def _get_eval_sampler(self, eval_dataset):
            if eval_dataset is None:
                return None
            # distributed: None lets accelerate shard sequentially and gather back in order
            return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None

    return InOrderEvalTrainer


def _encode(head: Head, encoder, records: Sequence[Record]):
    import datasets

    features = [head.features(r, encoder) for r in records]
    for f in features:  # the longest sequence of the record: what padding costs (group_by_length)
        f["length"] = max(len(ids) for ids in f["input_ids"])
    return datasets.Dataset.from_list(features)


def _by_length(dataset):
    """The dataset sorted by length (little padding at prediction) and the sorting permutation."""
    import numpy as np

    order = np.argsort(np.asarray(dataset["length"]), kind="stable")
    return dataset.select(order), order


def _predict(trainer, head: Head, encoder, records: Sequence[Record]):
    """Logits in record order (the eval sampler is sequential: see ``InOrderEvalTrainer``)."""
    import numpy as np

    dataset, order = _by_length(_encode(head, encoder, records))
    logits = trainer.predict(dataset).predictions
    logits = logits[0] if isinstance(logits, tuple) else logits
    return head.adjust(logits.reshape(len(records), -1)[np.argsort(order)].reshape(logits.shape), records)


def _score(trainer, head: Head, encoder, records: Sequence[Record]) -> dict[str, Any]:
    """Metrics on a labelled set; for pairs also in swapped order (position consistency) and baselines."""
    outputs = head.outputs(_predict(trainer, head, encoder, records))
    if not isinstance(outputs, PairOutputs):
        return head.evaluate(outputs, records)
    swapped = head.outputs(_predict(trainer, head, encoder, [r.swapped() for r in records]))
    return {**head.evaluate(outputs, records, swapped), "baselines": pair_baselines(records)}


def _per_record_logits(logits, labels):
    """One row per record before the Trainer gathers predictions: it trims the last batch to the dataset's
    length in rows, which for heads with k sequences per record (the reward head) would cut real records."""
    logits = logits[0] if isinstance(logits, tuple) else logits
    return logits if labels is None else logits.reshape(labels.shape[0], -1)


@dataclass
class _Run:
    """What a fine-tuning run builds before its trainer; the steps of ``train`` read it."""

    cfg: TrainConfig
    head: Head
    info: BackboneInfo
    scheme: str
    splits: Splits
    tokenizer: Any
    model: Any
    encoders: dict[str, Any]  # split or eval-source name -> its ``Encoder`` (each with its truncation report)


def _prepare(cfg: TrainConfig) -> _Run:
    """Seed, head, scheme, the splits, the backbone with the head's labels and one encoder per split."""
    from transformers import set_seed

    from ..models.backbones import load_seq_cls, load_tokenizer, resolve_backbone
    from ..prompts.encoding import Encoder
    from ..prompts.schemes import SCHEMES
    from ..prompts.truncation import TruncationPolicy, TruncationReport

    default_ds_accelerator()
    set_seed(cfg.seed)
    head = HEADS.get(cfg.head)()
    head.length_covariate = cfg.length_covariate
    info = resolve_backbone(cfg.backbone)
    scheme = cfg.scheme or head.default_scheme(info.family)
    SCHEMES.get(scheme)  # fail early on an unknown scheme name
    splits = build_splits(cfg, head)

    tokenizer = load_tokenizer(info)
    model = load_seq_cls(info, head.num_labels, head.problem_type, tokenizer=tokenizer)
    model.config.id2label = head.id2label()
    model.config.label2id = {v: k for k, v in head.id2label().items()}
    policy = TruncationPolicy(max_length=cfg.max_length, budgets=dict(cfg.budgets), head_fraction=cfg.head_fraction)
    encoders = {name: Encoder(tokenizer, scheme, policy, use_reference=cfg.ref_drop < 1.0,
                              length_hint=cfg.length_hint, report=TruncationReport())
                for name in ("train", "dev", "test", *splits.evals)}
    return _Run(cfg, head, info, scheme, splits, tokenizer, model, encoders)


def _hf_trainer(run: _Run, ckpt_dir: Path):
    """The HF ``Trainer`` with the head's loss, early stopping and calibration on the dev split."""
    import torch
    from transformers import EarlyStoppingCallback, Trainer

    from ..prompts.encoding import collate

    cfg, head, splits, tokenizer = run.cfg, run.head, run.splits, run.tokenizer
    train_ds = _encode(head, run.encoders["train"], splits.train)
    dev_ds, dev_records = None, list(splits.dev)
    if splits.dev:  # evaluated in this (length-sorted) order: compute_metrics pairs logits with dev_records
        dev_ds, order = _by_length(_encode(head, run.encoders["dev"], splits.dev))
        dev_records = [splits.dev[i] for i in order]

    def compute_metrics(pred) -> dict[str, float]:
        logits = pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions
        logits = head.adjust(logits, dev_records)
        head.calibrate(logits, dev_records)
        return _floats(head.evaluate(head.outputs(logits), dev_records))

    label_dtype = torch.float32 if head.label_is_float else torch.long
    return in_order_eval(Trainer)(
        model=run.model,
        args=training_arguments(cfg, head, ckpt_dir, has_dev=dev_ds is not None),
        data_collator=lambda feats: collate(tokenizer, feats, label_dtype),
        train_dataset=train_ds,
        eval_dataset=dev_ds,
        processing_class=tokenizer,
        compute_metrics=compute_metrics if dev_ds is not None else None,
        compute_loss_func=head.loss,
        preprocess_logits_for_metrics=_per_record_logits,
        callbacks=[EarlyStoppingCallback(cfg.early_stopping_patience)]
        if dev_ds is not None and cfg.early_stopping_patience else None,
    )


def _validate(run: _Run, trainer) -> dict[str, Any]:
    """Calibration on dev, then the metrics of dev, the held-out fold and every eval source."""
    head, splits, encoders = run.head, run.splits, run.encoders
    validation: dict[str, Any] = {}
    if splits.dev:
        head.calibrate(_predict(trainer, head, encoders["dev"], splits.dev), splits.dev)
        validation["dev"] = _score(trainer, head, encoders["dev"], splits.dev)
    if splits.test:
        validation["test"] = _score(trainer, head, encoders["test"], splits.test)
    for name, recs in splits.evals.items():
        validation[f"eval:{name}"] = _score(trainer, head, encoders[name], recs)
    return validation


def _save_judge(run: _Run, trainer, result, validation: dict[str, Any], wall: float, out_dir: Path) -> None:
    """The tokenizer (carrying the prompt), ``judge_card.json`` and the training arguments beside the model."""
    from ..card import JudgeCard
    from ..prompts.chat_template import carry_prompt
    from ..prompts.schemes import SCHEMES

    cfg, head, encoders, splits = run.cfg, run.head, run.encoders, run.splits
    carry_prompt(run.tokenizer, run.scheme, encoders["train"].length_hint)  # transformers / TRL then read our text
    run.tokenizer.save_pretrained(str(out_dir))
    card = JudgeCard(
        kind=FINE_TUNED, head=head.name, arity=head.arity, backbone=cfg.backbone, scheme=run.scheme,
        max_length=cfg.max_length,
        truncation={**encoders["train"].card_entry(),
                    "report": {k: e.report.to_dict() for k, e in encoders.items()}},
        template=getattr(SCHEMES.get(run.scheme), "template", ""),
        training={
            "sources": splits.sources, "split": splits.counts, "config": asdict(cfg),
            "content": splits.content,
            "backbone": asdict(run.info), "global_steps": result.global_step,
            "train_loss": result.training_loss, "best_checkpoint": trainer.state.best_model_checkpoint,
            "log_history": trainer.state.log_history, "wall_time_s": round(wall, 1),
            "deepspeed": trainer.args.deepspeed, "device": str(trainer.args.device),
            "precision": "fp16" if trainer.args.fp16 else "bf16" if trainer.args.bf16 else "fp32",
        },
        validation=validation,
        **head.card_fields(),
    )
    card.save(out_dir)
    save_arguments(trainer, out_dir)


def train(cfg: TrainConfig) -> Path:
    """Run one training and return the judge directory (HF model + tokenizer + judge_card.json)."""
    if cfg.head in TRAINERS:
        return TRAINERS.get(cfg.head)(cfg)
    start = time.monotonic()
    run = _prepare(cfg)
    out_dir = Path(cfg.output_dir)
    ckpt_dir = out_dir / "checkpoints"
    trainer = _hf_trainer(run, ckpt_dir)
    result = trainer.train()
    trainer.compute_metrics = None  # it scores the dev split; the predictions below are of other record sets
    validation = _validate(run, trainer)
    wall = time.monotonic() - start

    trainer.save_model(str(out_dir))
    if trainer.is_world_process_zero():
        _save_judge(run, trainer, result, validation, wall, out_dir)
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return out_dir
