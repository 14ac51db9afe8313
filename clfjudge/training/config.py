"""What one training run is: ``TrainConfig`` (YAML + ``--set key=value`` overrides over an optional Table 7
preset), the trainers of heads that ``trainer.py``'s loop does not train (``TRAINERS``), and what a config means
to the HF ``Trainer`` (``training_arguments``, DeepSpeed ZeRO-2 through ``resolve_deepspeed``).

Shared by every trainer: ``trainer.py`` (classifier heads), ``generative.py`` and ``embedding.py``.
"""
from __future__ import annotations

import difflib
import logging
import os
import textwrap
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from ..configs import config_path
from ..data.records import RecordError
from ..kinds import TRAINERS  # heads another loop trains (clfjudge/kinds.py)
from ..models.heads import HEADS, Head
from ..paths import REPO_ROOT
from ..registry import Registry
from .embedding_config import EmbeddingOptions
from .fields import coerce
from .verdict_config import VerdictOptions

log = logging.getLogger(__name__)

DEEPSPEED_MODES = ("off", "auto", "force")
PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass
class TrainConfig:
    """Everything one training run needs. ``batch_size`` is per device: the global batch is
    batch_size x grad_accum x number of processes (Table 7's 128 is a global batch). Each field's
    ``metadata["help"]`` says what it means: ``clfjudge train --help`` lists them (``keys_help``) and an unknown
    key's error names the closest known ones with theirs."""

    backbone: str = field(default="minilm", metadata={"help": "offline alias (minilm, mpnet, smollm2), hub id or "
                                                              "local model directory (models/backbones.py)"})
    head: str = field(default="cls3", metadata={"help": "a name in models.heads.HEADS, 'generative' (the LM-head "
                                                        "baseline, training/generative.py), 'embedding' (frozen "
                                                        "encoder + scikit-learn head, training/embedding.py) or "
                                                        "'verdict' (a chat model's own verdict, training/verdict.py)"})
    scheme: str | None = field(default=None, metadata={"help": "input scheme; None: '<backbone family>-<head's "
                                                                 "suffix>', e.g. encoder-pair"})
    sources: list[str] = field(default_factory=list, metadata={"help": "train sources: 'name' or 'name:N' (N "
                                                                         "records sampled)"})
    eval_sources: list[str] = field(default_factory=list, metadata={"help": "scored after training (and "
                                                                              "decontaminated against)"})
    extra_train_sources: list[str] = field(default_factory=list, metadata={
        "help": "mixed into the training split only (never dev or test), decontaminated against test, dev and eval "
                "sources"})
    decontaminate_against: list[str] = field(default_factory=list, metadata={
        "help": "further sources whose questions are removed from training"})
    format: str | None = field(default=None, metadata={
        "help": "format of the user data files named as sources (trl, pairwise, clfjudge, pointwise; "
                "data.formats.FORMATS); None: detected from the columns"})
    columns: dict[str, str] = field(default_factory=dict, metadata={
        "help": "user data files: field -> column where the data names it differently, e.g. {question: prompt}"})
    scale: list[float] | None = field(default=None, metadata={
        "help": "user data files in the pointwise format: the score scale [low, high] (None: a 'scale' column, "
                "else [1, 5])"})
    test_fraction: float = field(default=0.0, metadata={"help": "grouped held-out fold of the train sources, scored "
                                                                  "after training"})
    cv_folds: int = field(default=0, metadata={"help": "> 1: hold out fold cv_fold of a grouped k-fold split "
                                                         "(splits.group_kfold) instead of test_fraction"})
    cv_fold: int = field(default=0, metadata={"help": "the fold held out when cv_folds > 1, in [0, cv_folds)"})
    cv_seed: int = field(default=0, metadata={"help": "the folds' seed: the same seed, the same folds"
                                                        " across recipes"})
    dev_fraction: float = field(default=0.1, metadata={"help": "grouped (by question) validation split for early "
                                                                 "stopping and calibration"})
    max_train_records: int | None = field(default=None, metadata={"help": "cap on the training split, extra train "
                                                                            "sources included (sampled); None: all"})
    max_dev_records: int | None = field(default=None, metadata={"help": "cap on the dev split (sampled), which is "
                                                                          "scored at every evaluation"})
    swap_aug: float = field(default=0.0, metadata={"help": "fraction of training pairs added again with answers and "
                                                             "label swapped"})
    neighbour_negatives: int = field(default=0, metadata={
        "help": "copies of LLMBar-style hard negatives added from the training split "
                "(judges.embedding.neighbour_negatives)"})
    neighbour_encoder: str = field(default="minilm", metadata={"help": "the sentence encoder that finds each "
                                                                         "question's nearest neighbour"})
    neighbour_limit: int | None = field(default=None, metadata={"help": "at most this many training questions get "
                                                                          "a hard negative (sampled)"})
    neighbour_candidates: int = field(default=1, metadata={"help": "> 1: the rejected answer is the one closest in "
                                                                     "length among these neighbours"})
    randomize_order: bool = field(default=False, metadata={"help": "swap a seeded random half of the train sources' "
                                                                     "pairs before any split"})
    ref_drop: float = field(default=1.0, metadata={"help": "fraction of references dropped in training (1.0: never "
                                                             "shown, as in the Empirical Study)"})
    max_length: int = field(default=512, metadata={"help": "tokens per model input"})
    length_hint: bool = field(default=False, metadata={"help": "show each answer's (untruncated) length bucket in "
                                                                 "its input (prompts/encoding.py)"})
    length_covariate: bool = field(default=False, metadata={"help": "reward head: add beta * log(1 + chars) to each "
                                                                      "reward (models/heads.py)"})
    # a judge kind's own options: the block named after it, a dataclass beside its trainer (<kind>_config.py)
    embedding: EmbeddingOptions = field(default_factory=EmbeddingOptions, metadata={
        "help": "head 'embedding' options (training.embedding_config.EmbeddingOptions), the keys below"})
    verdict: VerdictOptions = field(default_factory=VerdictOptions, metadata={
        "help": "head 'verdict' options (training.verdict_config.VerdictOptions), the keys below"})
    budgets: dict[str, float] = field(default_factory=dict, metadata={"help": "truncation budgets per field "
                                                                                "(prompts/truncation.py)"})
    head_fraction: float = field(default=0.5, metadata={"help": "share of a cut field kept from its head (the rest "
                                                                  "from its tail)"})
    lr: float = field(default=2e-5, metadata={"help": "peak learning rate (AdamW)"})
    epochs: float = field(default=3.0, metadata={"help": "training epochs (fractions allowed)"})
    max_steps: int = field(default=-1, metadata={"help": "> 0: train this many optimizer steps, overriding epochs"})
    batch_size: int = field(default=16, metadata={"help": "per-device train batch; global batch = batch_size x "
                                                            "grad_accum x processes"})
    eval_batch_size: int | None = field(default=None, metadata={"help": "per-device evaluation batch; None: "
                                                                          "batch_size"})
    grad_accum: int = field(default=1, metadata={"help": "gradient accumulation steps"})
    warmup_ratio: float = field(default=0.003, metadata={"help": "share of the total steps spent warming up the "
                                                                   "learning rate, in [0, 1)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2"})
    scheduler: str = field(default="cosine", metadata={"help": "learning-rate schedule (HF lr_scheduler_type, e.g. "
                                                                 "cosine, linear)"})
    precision: str = field(default="fp32", metadata={"help": "fp32 | fp16 | bf16; fp16 / bf16 apply on CUDA only "
                                                               "(CPU runs are fp32)"})
    tf32: bool = field(default=False, metadata={"help": "allow TF32 matmuls (CUDA only)"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute activations in the backward "
                                                                            "pass to save memory"})
    seed: int = field(default=42, metadata={"help": "seed of the splits, sampling and the HF Trainer"})
    early_stopping_patience: int | None = field(default=2, metadata={"help": "evaluations without improvement; "
                                                                               "None or 0: off"})
    eval_every: int | None = field(default=None, metadata={"help": "steps between dev evaluations; None: once per "
                                                                     "epoch"})
    metric_for_best: str | None = field(default=None, metadata={"help": "dev metric that picks the best checkpoint; "
                                                                          "None: the head's (accuracy / pearson)"})
    logging_steps: int = field(default=10, metadata={"help": "steps between training-loss log entries"})
    group_by_length: bool = field(default=True, metadata={"help": "batches of similar length: far less padding, "
                                                                    "which dominates CPU time"})
    deepspeed: str = field(default="off", metadata={"help": "off | auto (only when CUDA is available) | force (e.g. "
                                                              "the CPU test)"})
    deepspeed_config: str | None = field(default=None, metadata={"help": "DeepSpeed JSON; None: the bundled ZeRO-2 "
                                                                           "config (clfjudge/configs/ds_zero2.json)"})
    output_dir: str = field(default="runs/judge", metadata={"help": "the judge directory written (model, tokenizer, "
                                                                      "judge_card.json)"})
    preset: str | None = field(default=None, metadata={"help": "a name in PRESETS (deberta-table7, vicuna-table7), "
                                                                 "applied under the file's own values"})

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
            (bool(self.sources) or not getattr(self.kind_options(), "needs_sources", True),
             "sources must name at least one train source"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"train config: {message}")
        if self.head not in HEADS and self.head not in TRAINERS:
            HEADS.get(self.head)  # raises with the known names
        if self.head in HEADS and not HEADS.get(self.head).trainable:
            raise ValueError(f"train config: head {self.head!r} reads released models and is not trained here")
        if self.length_covariate and not (self.head in HEADS and HEADS.get(self.head).supports_length_covariate):
            raise ValueError(f"train config: length_covariate is a reward-head option, not one of head {self.head!r}")

    def kind_options(self) -> Any | None:
        """The options block of the head's kind (the block named after it, e.g. ``verdict``), if it has one."""
        return getattr(self, self.head) if self.head in _blocks() else None

    def read_options(self):
        """How the user data files among the sources are read (``format``, ``columns``, ``scale``)."""
        from ..data.formats import ReadOptions

        return ReadOptions.make(self.format, self.columns, self.scale)

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
            raise ValueError(f"{where}: unknown config key(s) {unknown}; {_suggest(unknown)}")
        values = {k: coerce(v, hints[k], f"{where}: {k}") for k, v in merged.items()}
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


def _field_help(f) -> str:
    default = f.default_factory() if f.default_factory is not MISSING else f.default
    return f"{f.metadata['help']} (default: {default})"


def key_help(name: str) -> str:
    """One recipe key's help text and default: ``help (default: value)``; ``block.key`` for a key of a nested
    options block (``embedding.layer``)."""
    top, _, sub = name.partition(".")
    f = {f.name: f for f in fields(TrainConfig)}[top]
    if sub:
        return _field_help({g.name: g for g in fields(_nested(top))}[sub])
    return f.metadata["help"] if _nested(top) else _field_help(f)


def _blocks() -> list[str]:
    """The nested options blocks of TrainConfig: one per judge kind that has options."""
    return [f.name for f in fields(TrainConfig) if _nested(f.name)]


def _nested(name: str) -> type | None:
    """The options class of a nested block of TrainConfig (``embedding``), else None."""
    tp = get_type_hints(TrainConfig)[name]
    return tp if is_dataclass(tp) else None


def keys_help(names: Sequence[str] | None = None, width: int = 100) -> str:
    """``key: help (default: value)`` lines for the given recipe keys (default: all, in field order, a nested
    block's keys as ``block.key``), wrapped to ``width`` (for ``clfjudge train --help`` and unknown-key errors)."""
    if names is None:
        names = []
        for f in fields(TrainConfig):
            block = _nested(f.name)
            names += [f.name, *(f"{f.name}.{g.name}" for g in (fields(block) if block else ()))]
    return "\n".join(textwrap.fill(f"{name}: {key_help(name)}", width, initial_indent="  ",
                                   subsequent_indent="      ") for name in names)


# HF TrainingArguments names a recipe may borrow -> the TrainConfig key that means the same
_HF_NAMES = {"learning_rate": "lr", "num_train_epochs": "epochs", "per_device_train_batch_size": "batch_size",
             "per_device_eval_batch_size": "eval_batch_size", "gradient_accumulation_steps": "grad_accum",
             "lr_scheduler_type": "scheduler", "model_name_or_path": "backbone", "eval_steps": "eval_every",
             "metric_for_best_model": "metric_for_best", "warmup_steps": "warmup_ratio"}


def _close_keys(key: str, known: Sequence[str]) -> list[str]:
    """The known keys a misspelt ``key`` most likely meant: its HF TrainingArguments equivalent or a known key
    that is one of its ``_``-separated words (lr_rate -> lr), else difflib's closest spellings."""
    exact = [k for k in (_HF_NAMES.get(key), *key.split("_")) if k in known]
    return list(dict.fromkeys(exact)) or difflib.get_close_matches(key, known, n=3)


def _suggest(unknown: Sequence[str]) -> str:
    """What an unknown-key error adds: the closest known keys with their help, else a pointer to all of them."""
    known = [f.name for f in fields(TrainConfig)]
    close = list(dict.fromkeys(m for key in unknown for m in _close_keys(key, known)))
    if not close:
        return "`clfjudge train --help` lists the known keys"
    return "did you mean:\n" + keys_help(close)


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


# Table 7 of the empirical study. Global batch 128 = per-device batch x grad_accum x GPUs (DeBERTa: 2 GPUs,
# Vicuna: 8 GPUs). Warmup 0.003 is the printed value; the authors' train.sh uses 0.03 (likely a typo).
PRESETS: Registry[dict[str, Any]] = Registry("preset")
_TABLE7 = dict(lr=2e-5, scheduler="cosine", weight_decay=0.0, epochs=3, adam_beta1=0.9, warmup_ratio=0.003)
PRESETS.register("deberta-table7", {**_TABLE7, "max_length": 512, "adam_beta2": 0.98, "precision": "fp16",
                                    "batch_size": 16, "grad_accum": 4, "deepspeed": "off"})
PRESETS.register("vicuna-table7", {**_TABLE7, "max_length": 2048, "adam_beta2": 0.999, "precision": "bf16",
                                   "tf32": True, "batch_size": 4, "grad_accum": 4, "deepspeed": "auto",
                                   "gradient_checkpointing": True})


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


TRAINING_ARGS_JSON = "training_args.json"


def save_arguments(trainer, out_dir: Path) -> Path:
    """The HF training arguments as JSON in the judge directory, in place of the ``training_args.bin`` pickle
    ``Trainer.save_model`` writes (a judge directory holds no pickle)."""
    (out_dir / "training_args.bin").unlink(missing_ok=True)
    path = out_dir / TRAINING_ARGS_JSON
    path.write_text(trainer.args.to_json_string())
    return path


def training_arguments(cfg: TrainConfig, head: Head, ckpt_dir: Path, has_dev: bool):
    from transformers import TrainingArguments

    from ..machine import probe, training_precision

    cuda = bool(probe().cuda())
    ds_config = resolve_deepspeed(cfg, cuda)
    precision, why = training_precision(cfg.precision)
    if precision != cfg.precision:
        log.warning("precision %s: trains in %s here (%s)", cfg.precision, precision, why)
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
        use_cpu=not cuda and ds_config is None,  # DeepSpeed on CPU needs use_cpu=False: it picks its own accelerator
        fp16=precision == "fp16",
        bf16=precision == "bf16",
        tf32=cfg.tf32 if cuda else None,
        gradient_checkpointing=cfg.gradient_checkpointing,
        deepspeed=ds_config,
        remove_unused_columns=False,
        train_sampling_strategy="group_by_length" if cfg.group_by_length else "random",
        length_column_name="length",
        **kw,
    )

