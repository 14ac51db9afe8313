"""Fine-tune a classifier judge with the HF Trainer and write a judge directory.

Flow: ``TrainConfig`` (YAML + ``--set key=value`` overrides over an optional Table 7 preset) -> records from
the train sources, kept or excluded (counted) by the head -> grouped held-out fold (optional) -> removal of
training questions that also occur in any evaluation data -> grouped dev split -> cap -> reference drop and
swap augmentation -> ``Encoder`` (the same encoding inference uses) -> HF ``Trainer`` with the head's loss,
early stopping on the dev metric, optional DeepSpeed ZeRO-2 -> post-hoc calibration on dev -> held-out and
eval-source metrics (with the majority-class and longer-answer baselines) -> ``save_pretrained`` +
``judge_card.json``.
"""
from __future__ import annotations

import logging
import os
import random
import shutil
import time
import types
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from .configs import config_path
from .heads import HEADS, Head, PairOutputs
from .paths import REPO_ROOT
from .records import PairRecord, Record, RecordError
from .registry import Registry

log = logging.getLogger(__name__)

DEEPSPEED_MODES = ("off", "auto", "force")
PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass
class TrainConfig:
    """Everything one training run needs. ``batch_size`` is per device: the global batch is
    batch_size x grad_accum x number of processes (Table 7's 128 is a global batch)."""

    backbone: str = "minilm"
    head: str = "cls3"  # a name in heads.HEADS, "generative" (the LM-head baseline, generative.py) or
    # "embedding" (frozen encoder + scikit-learn head, embedding_training.py)
    scheme: str | None = None  # default: "<backbone family>-<head's suffix>", e.g. encoder-pair
    sources: list[str] = field(default_factory=list)  # train sources; "name" or "name:N" (N records sampled)
    eval_sources: list[str] = field(default_factory=list)  # scored after training (and decontaminated against)
    # mixed into the training split only (never dev or test), decontaminated against test, dev and eval sources
    extra_train_sources: list[str] = field(default_factory=list)
    decontaminate_against: list[str] = field(default_factory=list)  # further sources whose questions are removed
    test_fraction: float = 0.0  # grouped held-out fold of the train sources, scored after training
    cv_folds: int = 0  # > 1: hold out fold ``cv_fold`` of a grouped k-fold split (splits.group_kfold) instead
    cv_fold: int = 0
    cv_seed: int = 0  # the folds' seed (bench/embedding_judge_cv.py uses 0): the same folds as other benches
    dev_fraction: float = 0.1  # grouped (by question) validation split for early stopping and calibration
    max_train_records: int | None = None
    max_dev_records: int | None = None  # cap on the dev split (sampled), which is scored at every evaluation
    swap_aug: float = 0.0  # fraction of training pairs added again with answers and label swapped
    # LLMBar-style hard negatives from the training split (embedding_judge.neighbour_negatives): copies added
    neighbour_negatives: int = 0
    neighbour_encoder: str = "minilm"  # the sentence encoder that finds each question's nearest neighbour
    neighbour_limit: int | None = None  # at most this many training questions get a hard negative (sampled)
    neighbour_candidates: int = 1  # > 1: the rejected answer is the one closest in length among these neighbours
    randomize_order: bool = False  # swap a seeded random half of the train sources' pairs before any split
    ref_drop: float = 1.0  # fraction of references dropped in training (1.0: never shown, as in the study)
    max_length: int = 512
    length_hint: bool = False  # show each answer's (untruncated) length bucket in its input (encoding.py)
    length_covariate: bool = False  # reward head: add beta * log(1 + chars) to each reward (heads.py)
    embedding: dict[str, Any] = field(default_factory=dict)  # head "embedding": embedding_training.OPTIONS
    budgets: dict[str, float] = field(default_factory=dict)  # truncation budgets per field (truncation.py)
    head_fraction: float = 0.5  # share of a cut field kept from its head (the rest from its tail)
    lr: float = 2e-5
    epochs: float = 3.0
    max_steps: int = -1  # > 0 overrides epochs
    batch_size: int = 16
    eval_batch_size: int | None = None
    grad_accum: int = 1
    warmup_ratio: float = 0.003
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    scheduler: str = "cosine"
    precision: str = "fp32"  # fp16 / bf16 apply on CUDA only; CPU runs are fp32
    tf32: bool = False
    gradient_checkpointing: bool = False
    seed: int = 42
    early_stopping_patience: int | None = 2  # evaluations without improvement; None or 0: off
    eval_every: int | None = None  # steps between dev evaluations; None: once per epoch
    metric_for_best: str | None = None  # default: the head's (accuracy / pearson)
    logging_steps: int = 10
    group_by_length: bool = True  # batches of similar length: far less padding, which dominates CPU time
    deepspeed: str = "off"  # off | auto (only when CUDA is available) | force (e.g. the CPU test)
    deepspeed_config: str | None = None  # None: the bundled ZeRO-2 config (clfjudge/configs/ds_zero2.json)
    output_dir: str = "runs/judge"
    preset: str | None = None  # a name in PRESETS, applied under the file's own values

    def __post_init__(self) -> None:
        checks = [
            (self.deepspeed in DEEPSPEED_MODES, f"deepspeed must be one of {DEEPSPEED_MODES}"),
            (self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}"),
            (0.0 <= self.test_fraction < 1.0, "test_fraction must be in [0, 1)"),
            (0.0 <= self.dev_fraction < 1.0, "dev_fraction must be in [0, 1)"),
            (0.0 <= self.swap_aug <= 1.0, "swap_aug must be in [0, 1]"),
            (self.neighbour_negatives >= 0, "neighbour_negatives must be a number of copies >= 0"),
            (0.0 <= self.ref_drop <= 1.0, "ref_drop must be in [0, 1]"),
            (0.0 <= self.warmup_ratio < 1.0, "warmup_ratio must be in [0, 1)"),
            (self.batch_size > 0 and self.grad_accum > 0, "batch_size and grad_accum must be positive"),
            (self.cv_folds == 0 or 0 <= self.cv_fold < self.cv_folds, "cv_fold must be in [0, cv_folds)"),
            (self.cv_folds != 1 and self.cv_folds >= 0, "cv_folds must be 0 (off) or at least 2"),
            (not (self.cv_folds and self.test_fraction), "use either cv_folds or test_fraction, not both"),
            (bool(self.sources), "sources must name at least one train source"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"train config: {message}")
        if self.head not in HEADS and self.head not in OTHER_TRAINERS:
            HEADS.get(self.head)  # raises with the known names
        if self.length_covariate and not (self.head in HEADS and HEADS.get(self.head).supports_length_covariate):
            raise ValueError(f"train config: length_covariate is a reward-head option, not one of head {self.head!r}")

    # -- loading ----------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "<config>") -> TrainConfig:
        """Build from raw values (YAML or --set strings), applying the named preset underneath."""
        data = dict(data)
        preset = data.get("preset")
        try:
            merged = {**PRESETS.get(str(preset)), **data} if preset not in (None, "", "none", "null") else data
        except KeyError as exc:
            raise KeyError(f"{where}: preset: {exc.args[0]}") from None
        hints = get_type_hints(cls)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(merged) - known)
        if unknown:
            raise ValueError(f"{where}: unknown config key(s) {unknown}; known: {sorted(known)}")
        values = {k: _coerce(v, hints[k], f"{where}: {k}") for k, v in merged.items()}
        try:
            return cls(**values)
        except (ValueError, KeyError) as exc:  # the checks of __post_init__ (and the head registry): name the file
            raise type(exc)(f"{where}: {exc.args[0]}") from None

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as exc:
            raise RecordError(str(path), None, None, f"not valid UTF-8: {exc.reason} at byte {exc.start}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise RecordError(str(path), mark.line + 1 if mark else None, None, f"not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise RecordError(str(path), None, None,
                              f"a recipe must be a mapping of config keys, got {type(data).__name__}")
        return cls.from_dict(apply_overrides(data, overrides), where=str(path))

    def with_overrides(self, overrides: Sequence[str]) -> TrainConfig:
        return TrainConfig.from_dict(apply_overrides(asdict(self), overrides), where="--set")


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``key=value`` strings onto a raw config dict; ``key.sub=value`` sets one entry of a dict field."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected key=value")
        top, dot, sub = key.partition(".")
        if dot:
            current = data.get(top) or {}
            if not isinstance(current, dict):
                raise ValueError(f"--set {item!r}: {top} is not a mapping")
            # an entry of a free-form mapping (embedding: ...) has no declared type to coerce to: read it as YAML
            data[top] = {**current, sub: _yaml_value(value)}
        else:
            data[key] = value
    return data


def _yaml_value(value: Any) -> Any:
    import yaml

    if not isinstance(value, str):
        return value
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Coerce a YAML value or a --set string to the field's declared type (YAML reads 2e-5 as a string)."""
    import yaml

    if tp is Any:
        return value
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "~")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE | _FALSE:
                return text in _TRUE
            raise ValueError
        if tp is int:
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not number.is_integer():
                raise ValueError
            return int(number)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tp is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
        if origin is list:
            if isinstance(value, str):
                text = value.strip()
                value = (yaml.safe_load(text) if text.startswith("[")
                         else [v.strip() for v in text.split(",") if v.strip()])
            if not isinstance(value, list):
                raise ValueError
            return [_coerce(v, args[0], where) for v in value]
        if origin is dict:
            if isinstance(value, str):
                value = yaml.safe_load(value)
            if not isinstance(value, dict):
                raise ValueError
            return {str(k): _coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    except (TypeError, ValueError, yaml.YAMLError):
        raise ValueError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}") from None
    raise TypeError(f"{where}: unsupported config type {tp}")


# Table 7 of the empirical study. Global batch 128 = per-device batch x grad_accum x GPUs (DeBERTa: 2 GPUs,
# Vicuna: 8 GPUs). Warmup 0.003 is the printed value; the authors' train.sh uses 0.03 (likely a typo).
PRESETS: Registry[dict[str, Any]] = Registry("preset")
_TABLE7 = dict(lr=2e-5, scheduler="cosine", weight_decay=0.0, epochs=3, adam_beta1=0.9, warmup_ratio=0.003)
PRESETS.register("deberta-table7", {**_TABLE7, "max_length": 512, "adam_beta2": 0.98, "precision": "fp16",
                                    "batch_size": 16, "grad_accum": 4, "deepspeed": "off"})
PRESETS.register("vicuna-table7", {**_TABLE7, "max_length": 2048, "adam_beta2": 0.999, "precision": "bf16",
                                   "tf32": True, "batch_size": 4, "grad_accum": 4, "deepspeed": "auto",
                                   "gradient_checkpointing": True})


# -- data -------------------------------------------------------------------------------------------------

def parse_source(spec: str) -> tuple[str, int | None]:
    """``"name"`` or ``"name:N"`` (a seeded sample of N usable records; nested: N < M samples a prefix of M's)."""
    name, sep, limit = spec.partition(":")
    if not sep:
        return name, None
    if not limit.isdigit() or int(limit) <= 0:
        raise ValueError(f"source {spec!r}: expected name or name:N with N a positive integer")
    return name, int(limit)


def load_source_records(spec: str, head: Head, rng: random.Random) -> tuple[list[Record], dict[str, Any]]:
    """Records of one source that the head can learn from, and the counts of everything else."""
    from . import sources

    name, limit = parse_source(spec)
    result = sources.load(name)
    usable, excluded = head.select(result.records)
    if not usable:
        raise ValueError(f"source {name!r}: none of its {len(result.records)} records suits a {head.name} head "
                         f"(excluded: {dict(excluded)})")
    # one draw per source whatever its cap, and a permutation of its own: a smaller N samples a prefix of what a
    # larger N samples (a pool grown or shrunk keeps its other records, and their cached embeddings)
    permutation = random.Random(rng.random()).sample(range(len(usable)), len(usable))
    if limit is not None and len(usable) > limit:
        excluded[f"beyond the sample of {limit}"] += len(usable) - limit
        usable = [usable[i] for i in permutation[:limit]]
    stats = {"loaded": len(result.records), "excluded_by_loader": dict(result.excluded),
             "excluded_for_head": dict(excluded), "used": len(usable)}
    return usable, stats


def swap_augment(records: Sequence[Record], ratio: float, rng: random.Random) -> list[Record]:
    """Add ``ratio`` of the pairs again with the answers (and the verdict / score pair) swapped."""
    pairs = [r for r in records if isinstance(r, PairRecord)]
    chosen = rng.sample(pairs, round(ratio * len(pairs)))
    return list(records) + [p.swapped() for p in chosen]


def randomize_order(records: Sequence[Record], seed: int) -> tuple[list[Record], int]:
    """Swap the answers (and label) of a random half of the pairs; its own RNG, so that turning it on
    leaves every other sample of the run unchanged. Returns the records and how many were swapped."""
    rng = random.Random(f"randomize-order:{seed}")
    out = [r.swapped() if isinstance(r, PairRecord) and rng.random() < 0.5 else r for r in records]
    return out, sum(a is not b for a, b in zip(records, out))


def check_order_shortcut(cfg: TrainConfig, head: Head) -> None:
    """Refuse to train an order-sensitive head on a source whose answer order gives the label away."""
    from . import sources as source_registry

    names = (parse_source(s)[0] for s in (*cfg.sources, *cfg.extra_train_sources))
    fixed = [n for n in names if source_registry.SOURCES.get(n).fixed_order]
    if fixed and not head.position_invariant and not cfg.randomize_order:
        raise ValueError(f"train config: {fixed} always put the same baseline model first, so the answer order "
                         f"predicts the label; a {head.name} head would learn that shortcut. Set "
                         "randomize_order: true (or train a position-invariant head such as reward)")


def drop_references(records: Sequence[Record], ratio: float, rng: random.Random) -> tuple[list[Record], int]:
    """Remove the reference answer from ``ratio`` of the records that have one."""
    out, dropped = [], 0
    for rec in records:
        if rec.reference is not None and rng.random() < ratio:
            rec, dropped = replace(rec, reference=None), dropped + 1
        out.append(rec)
    return out, dropped


@dataclass
class Splits:
    train: list[Record]
    dev: list[Record]
    test: list[Record]
    evals: dict[str, list[Record]]
    counts: dict[str, Any]
    sources: dict[str, Any]


def _grouped_split(records: list[Record], fraction: float, seed: int) -> tuple[list[Record], list[Record]]:
    """(kept, held out): ``fraction`` of the questions held out, grouped by normalized question."""
    from .splits import train_dev_split

    if not fraction:
        return records, []
    kept, held = train_dev_split(records, fraction, seed)
    return [records[i] for i in kept], [records[i] for i in held]


def _held_out(records: list[Record], cfg: TrainConfig) -> tuple[list[Record], list[Record]]:
    """(kept, held out): fold ``cv_fold`` of a grouped k-fold split, or a grouped ``test_fraction``."""
    from .splits import group_kfold

    if not cfg.cv_folds:
        return _grouped_split(records, cfg.test_fraction, cfg.seed)
    kept, held = group_kfold(records, cfg.cv_folds, cfg.cv_seed)[cfg.cv_fold]
    return [records[i] for i in kept], [records[i] for i in held]


def _cap(records: list[Record], limit: int | None, rng: random.Random) -> tuple[list[Record], int]:
    """A random sample of at most ``limit`` records, and how many were left out."""
    if limit is None or len(records) <= limit:
        return records, 0
    return rng.sample(records, limit), len(records) - limit


def _extra_train(cfg: TrainConfig, head: Head, against: list[Record],
                 stats: dict[str, Any]) -> tuple[list[Record], dict[str, Any]]:
    """The extra_train sources' records, with questions of the held-out, dev and evaluation records removed
    (so mixing never leaks an evaluated question into training). Their own RNG: adding them leaves every other
    sample of the run unchanged. Their load stats join ``stats`` (the card's training sources)."""
    from .splits import decontaminate

    if not cfg.extra_train_sources:
        return [], {}
    rng = random.Random(f"extra-train:{cfg.seed}")
    records = []
    for spec in cfg.extra_train_sources:
        recs, stats[parse_source(spec)[0]] = load_source_records(spec, head, rng)
        stats[parse_source(spec)[0]]["role"] = "extra_train (training split only)"
        records += recs
    if cfg.randomize_order:
        records, _ = randomize_order(records, cfg.seed)
    kept, removed, by_set = decontaminate(records, against) if against else (records, 0, {})
    return kept, {"extra_train": len(kept), "extra_decontaminated": removed, "extra_decontaminated_by_set": by_set}


def _neighbour_negatives(cfg: TrainConfig, train: Sequence[Record]) -> list[Record]:
    """``cfg.neighbour_negatives`` seeded draws of LLMBar-style hard negatives built from the training pairs."""
    if not cfg.neighbour_negatives:
        return []
    from .embedding_judge import TextEmbedder, neighbour_negatives

    pairs = [r for r in train if isinstance(r, PairRecord)]
    embedder = TextEmbedder(cfg.neighbour_encoder)
    return [replace(r, id=f"{r.id}:{copy}") for copy in range(cfg.neighbour_negatives)
            for r in neighbour_negatives(pairs, embedder, seed=cfg.seed + copy, limit=cfg.neighbour_limit,
                                         candidates=cfg.neighbour_candidates)]


def build_splits(cfg: TrainConfig, head: Head) -> Splits:
    from . import sources as source_registry
    from .splits import decontaminate

    check_order_shortcut(cfg, head)
    rng = random.Random(cfg.seed)
    records, stats = [], {}
    for spec in cfg.sources:
        recs, stats[parse_source(spec)[0]] = load_source_records(spec, head, rng)
        records += recs
    order_swapped = 0
    if cfg.randomize_order:  # before the splits: the dev and test folds lose the shortcut too
        records, order_swapped = randomize_order(records, cfg.seed)
    pool, test = _held_out(records, cfg)

    train_names = {parse_source(s)[0] for s in cfg.sources}
    extra_names = {parse_source(s)[0] for s in cfg.extra_train_sources}
    scored_names = {parse_source(s)[0] for s in cfg.eval_sources} | set(cfg.decontaminate_against)
    for clash, what in ((train_names & scored_names, "both train and evaluation sources: every training record "
                         "would be removed as contaminated; use test_fraction for a held-out fold instead"),
                        (extra_names & train_names, "both train and extra_train sources: name each once"),
                        (extra_names & scored_names, "both extra_train and evaluation sources: every extra "
                         "record would be removed as contaminated")):
        if clash:
            raise ValueError(f"{sorted(clash)} are {what}")
    evals, eval_stats = {}, {}
    for spec in cfg.eval_sources:
        name = parse_source(spec)[0]
        evals[name], eval_stats[name] = load_source_records(spec, head, rng)
    against = list(test) + [r for recs in evals.values() for r in recs]
    for name in cfg.decontaminate_against:
        against += source_registry.load(name).records
    before = len(pool)
    pool, _, removed_by_set = decontaminate(pool, against) if against else (pool, 0, {})
    train, dev = _grouped_split(pool, cfg.dev_fraction, cfg.seed)
    extra, extra_counts = _extra_train(cfg, head, against + dev, stats)
    train, capped = _cap(train + extra, cfg.max_train_records, rng)
    dev, dev_capped = _cap(dev, cfg.max_dev_records, rng)
    head.fit(train)  # before the hard negatives: the length covariate is fitted on real pairs only
    negatives = _neighbour_negatives(cfg, train)
    train += negatives
    ref_dropped = 0
    if 0.0 < cfg.ref_drop < 1.0:  # at 1.0 the encoder never shows references, at 0.0 it always does
        train, ref_dropped = drop_references(train, cfg.ref_drop, rng)
    n_before_aug = len(train)
    if cfg.swap_aug and not head.position_invariant:
        train = swap_augment(train, cfg.swap_aug, rng)
    counts = {
        "test": len(test), "decontaminated": before - len(pool), "decontaminated_by_set": removed_by_set,
        "dev": len(dev), "capped": capped, "dev_capped": dev_capped,
        "train": n_before_aug, "swap_aug_added": len(train) - n_before_aug, "references_dropped": ref_dropped,
        "swap_aug_skipped": bool(cfg.swap_aug and head.position_invariant),  # invariant by construction
        "order_swapped": order_swapped, "neighbour_negatives_added": len(negatives), **extra_counts,
    }
    if not train:
        raise ValueError(f"no training records left after the splits: {counts}")
    return Splits(train, dev, test, evals, counts, {"train": stats, "eval": eval_stats})


# -- baselines on labelled pairs --------------------------------------------------------------------------

def pair_baselines(records: Sequence[PairRecord]) -> dict[str, dict[str, float]]:
    """Accuracy and macro F1 of the registered baselines (majority class of the set, longer answer wins)."""
    from .metrics import BASELINES, pairwise_metrics

    gold = [r.verdict for r in records]
    scored = {name: pairwise_metrics(gold, fn(records)) for name, fn in BASELINES.items()}
    return {name: {"accuracy": m.accuracy, "f1": m.f1} for name, m in scored.items()}


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


# -- trainer wiring ---------------------------------------------------------------------------------------

def resolve_deepspeed(cfg: TrainConfig, cuda: bool) -> str | None:
    """The DeepSpeed config path to use, or None: off, auto (CUDA only) or force."""
    if cfg.deepspeed == "off" or (cfg.deepspeed == "auto" and not cuda):
        return None
    if cfg.deepspeed_config is None:
        path = config_path("ds_zero2.json")
    else:  # relative: from the working directory, else from the repository root
        path = Path(cfg.deepspeed_config)
        if not path.is_absolute() and not path.exists():
            path = REPO_ROOT / path
        if not path.exists():
            raise FileNotFoundError(f"deepspeed_config {cfg.deepspeed_config} does not exist (leave it unset for "
                                    "the bundled ZeRO-2 config)")
    if "RANK" not in os.environ and "LOCAL_RANK" not in os.environ:
        raise ValueError("DeepSpeed needs a distributed launcher: run under `torchrun --nproc_per_node=N` "
                         "or the `deepspeed` launcher (see train/launch_multi_gpu.sh)")
    return str(path)


def training_arguments(cfg: TrainConfig, head: Head, ckpt_dir: Path, has_dev: bool):
    import torch
    from transformers import TrainingArguments

    cuda = torch.cuda.is_available()
    ds_config = resolve_deepspeed(cfg, cuda)
    if not cuda and cfg.precision != "fp32":
        log.warning("precision %s needs CUDA; this CPU run trains in fp32", cfg.precision)
    strategy = "steps" if cfg.eval_every else "epoch"
    kw: dict[str, Any] = {}
    if has_dev:
        kw = dict(eval_strategy=strategy, eval_steps=cfg.eval_every, load_best_model_at_end=True,
                  metric_for_best_model=cfg.metric_for_best or head.best_metric, greater_is_better=True,
                  save_total_limit=1)
    return TrainingArguments(
        output_dir=str(ckpt_dir),
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.eval_batch_size or cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.lr,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        lr_scheduler_type=cfg.scheduler,
        warmup_steps=cfg.warmup_ratio,  # transformers 5: a value below 1 is a ratio of the total steps
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_beta1,
        adam_beta2=cfg.adam_beta2,
        optim="adamw_torch",
        save_strategy=strategy if has_dev else "no",
        save_steps=cfg.eval_every,
        save_only_model=ds_config is None,  # DeepSpeed's best-checkpoint reload needs its full state
        logging_steps=cfg.logging_steps,
        report_to="none",
        disable_tqdm=False,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=not cuda and ds_config is None,  # DeepSpeed on CPU runs with use_cpu=False (stack.md)
        fp16=cuda and cfg.precision == "fp16",
        bf16=cuda and cfg.precision == "bf16",
        tf32=cfg.tf32 if cuda else None,
        gradient_checkpointing=cfg.gradient_checkpointing,
        deepspeed=ds_config,
        remove_unused_columns=False,
        train_sampling_strategy="group_by_length" if cfg.group_by_length else "random",
        length_column_name="length",
        **kw,
    )


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


def _train_generative(cfg: TrainConfig) -> Path:
    from .generative import train_generative

    return train_generative(cfg)


def _train_embedding(cfg: TrainConfig) -> Path:
    from .embedding_training import train_embedding

    return train_embedding(cfg)


# heads trained by another loop than the sequence-classification one below
OTHER_TRAINERS = {"generative": _train_generative, "embedding": _train_embedding}


def train(cfg: TrainConfig) -> Path:
    """Run one training and return the judge directory (HF model + tokenizer + judge_card.json)."""
    if cfg.head in OTHER_TRAINERS:
        return OTHER_TRAINERS[cfg.head](cfg)
    import torch
    from transformers import EarlyStoppingCallback, Trainer, set_seed

    from .backbones import load_seq_cls, load_tokenizer, resolve_backbone
    from .card import JudgeCard
    from .encoding import Encoder, collate
    from .schemes import SCHEMES
    from .truncation import TruncationPolicy, TruncationReport

    start = time.monotonic()
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
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
    train_ds = _encode(head, encoders["train"], splits.train)
    dev_ds, dev_records = None, list(splits.dev)
    if splits.dev:  # evaluated in this (length-sorted) order: compute_metrics pairs logits with dev_records
        dev_ds, order = _by_length(_encode(head, encoders["dev"], splits.dev))
        dev_records = [splits.dev[i] for i in order]

    def compute_metrics(pred) -> dict[str, float]:
        logits = pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions
        logits = head.adjust(logits, dev_records)
        head.calibrate(logits, dev_records)
        return _floats(head.evaluate(head.outputs(logits), dev_records))

    out_dir = Path(cfg.output_dir)
    ckpt_dir = out_dir / "checkpoints"
    label_dtype = torch.float32 if head.label_is_float else torch.long
    trainer = in_order_eval(Trainer)(
        model=model,
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
    result = trainer.train()
    trainer.compute_metrics = None  # it scores the dev split; the predictions below are of other record sets

    validation: dict[str, Any] = {}
    if splits.dev:
        head.calibrate(_predict(trainer, head, encoders["dev"], splits.dev), splits.dev)
        validation["dev"] = _score(trainer, head, encoders["dev"], splits.dev)
    if splits.test:
        validation["test"] = _score(trainer, head, encoders["test"], splits.test)
    for name, recs in splits.evals.items():
        validation[f"eval:{name}"] = _score(trainer, head, encoders[name], recs)
    wall = time.monotonic() - start

    trainer.save_model(str(out_dir))
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(out_dir))
        card = JudgeCard(
            head=head.name, kind=head.kind, backbone=cfg.backbone, scheme=scheme, max_length=cfg.max_length,
            truncation={**encoders["train"].card_entry(),
                        "report": {k: e.report.to_dict() for k, e in encoders.items()}},
            template=getattr(SCHEMES.get(scheme), "template", ""),
            training={
                "sources": splits.sources, "split": splits.counts, "config": asdict(cfg),
                "backbone": asdict(info), "global_steps": result.global_step,
                "train_loss": result.training_loss, "best_checkpoint": trainer.state.best_model_checkpoint,
                "log_history": trainer.state.log_history, "wall_time_s": round(wall, 1),
                "deepspeed": trainer.args.deepspeed, "device": str(trainer.args.device),
                "precision": "fp16" if trainer.args.fp16 else "bf16" if trainer.args.bf16 else "fp32",
            },
            validation=validation,
            **head.card_fields(),
        )
        card.save(out_dir)
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return out_dir
