"""The study's generative baseline: the same decoder, prompt and hyperparameters as a classifier head, but the
LM head writes the judgement.

- Training (``train_generative``, reached through ``clfjudge train`` with ``head: generative``): the prompt is
  the scheme's rendering of the record (``decoder-pair-gen`` / ``decoder-point-gen``, the study's "[INST]"
  input ending in "[Feedback]"), the target is ``schemes.target`` (e.g. "1" / "2" / "Tie") plus EOS, and the
  loss covers only the target tokens (prompt positions are labelled -100). Splits, decontamination, swap
  augmentation and truncation are the classifier trainer's, so the two kinds see the same data.
- Inference (``GenerativeJudge``): greedy decoding of left-padded, length-bucketed batches; every output is
  read by the scheme's released-judge parser. A failed parse stays a failure: it is counted (``ParseStats``)
  and scored as wrong (pairs) or left out and counted (scores), never turned into a verdict or a score.
"""
from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .data.records import PairRecord, PointRecord, Record
from .models.heads import Head
from .prompts.parsers import PARSERS, Parsed, ParseStats
from .prompts.schemes import SCHEMES, RenderError, target
from .prompts.truncation import TruncationPolicy, TruncationReport

if TYPE_CHECKING:
    from .train_config import TrainConfig

GENERATIVE = "generative"  # the judge card's head name
DEFAULT_SCHEMES = {"pair": "decoder-pair-gen", "point": "decoder-point-gen"}
DEFAULT_SCHEME = DEFAULT_SCHEMES["pair"]


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
        self.kind = SCHEMES.get(scheme).kind  # type: ignore[misc]

    def _unusable(self, record: Record) -> str | None:
        if record.kind != self.kind:
            return f"{record.kind} record (scheme {self.scheme} judges {self.kind}s)"
        try:
            target(record, self.scheme)
        except RenderError:
            return f"label not writable as a {self.scheme} target"
        return None


def max_target_tokens(tokenizer, scheme: str, records: Sequence[Record]) -> int:
    """The longest target in tokens, plus EOS: the generation budget and the room the prompt leaves."""
    return 1 + max(len(tokenizer(target(r, scheme), add_special_tokens=False)["input_ids"]) for r in records)


@dataclass
class PromptEncoder:
    """Prompt ids (the classifier's truncation policy, shortened by the target budget) and, for training,
    the target ids + EOS with the prompt positions masked out of the loss."""

    tokenizer: Any
    scheme: str
    policy: TruncationPolicy
    use_reference: bool = False
    report: TruncationReport = field(default_factory=TruncationReport)

    def prompt_ids(self, record: Record) -> list[int]:
        from .prompts.encoding import Encoder

        encoder = Encoder(self.tokenizer, self.scheme, self.policy, self.use_reference, report=self.report)
        return encoder.encode(record)["input_ids"]

    def example(self, record: Record) -> dict[str, list[int]]:
        prompt = self.prompt_ids(record)
        answer = self.tokenizer(target(record, self.scheme), add_special_tokens=False)["input_ids"]
        answer = answer + [self.tokenizer.eos_token_id]
        return {"input_ids": prompt + answer, "attention_mask": [1] * (len(prompt) + len(answer)),
                "labels": [-100] * len(prompt) + answer}


class GenerativeJudge:
    """A causal LM that judges by writing: ``generate`` gives parsed outputs, ``verdicts`` verdicts (None =
    parse failure) and ``scores`` scores (None = parse failure). ``runtime.GenerateJudge`` serves it behind the
    ``Judge`` interface (``Judge.load`` of a generative judge directory)."""

    def __init__(self, model, tokenizer, scheme: str, max_length: int, max_new_tokens: int,
                 use_reference: bool = False, batch_size: int = 8, name: str = "") -> None:
        self.model, self.tokenizer, self.scheme = model.eval(), tokenizer, SCHEMES.get(scheme)
        if self.scheme.parser is None:
            raise ValueError(f"scheme {scheme!r} has no output parser: it cannot be used generatively")
        self.parser = PARSERS.get(self.scheme.parser)
        self.max_new_tokens, self.batch_size, self.name = max_new_tokens, batch_size, name or scheme
        self.prompts = PromptEncoder(tokenizer, scheme, TruncationPolicy(max_length=max_length - max_new_tokens),
                                     use_reference)
        self.stats = ParseStats()

    @classmethod
    def load(cls, directory: str | Path, batch_size: int = 8) -> GenerativeJudge:
        """A directory written by ``train_generative``."""
        from .card import JudgeCard
        from .models.backbones import load_causal_lm, resolve_backbone

        card = JudgeCard.load(directory)
        if card.head != GENERATIVE:
            raise ValueError(f"{directory}: judge_card.json field 'head' is {card.head!r}, not {GENERATIVE!r}")
        info = resolve_backbone(directory)
        tokenizer = _tokenizer(info)
        return cls(load_causal_lm(info, tokenizer=tokenizer), tokenizer, card.scheme, card.max_length,
                   card.runtime["max_new_tokens"], bool(card.truncation.get("use_reference")), batch_size,
                   name=Path(directory).name)

    @classmethod
    def from_backbone(cls, backbone: str, scheme: str, max_length: int = 1024, max_new_tokens: int = 64,
                      batch_size: int = 8) -> GenerativeJudge:
        """An untrained (zero-shot) causal LM judging in ``scheme``."""
        from .models.backbones import load_causal_lm, resolve_backbone

        info = resolve_backbone(backbone)
        tokenizer = _tokenizer(info)
        return cls(load_causal_lm(info, tokenizer=tokenizer), tokenizer, scheme, max_length, max_new_tokens,
                   batch_size=batch_size, name=f"{backbone} zero-shot")

    def generate(self, records: Sequence[Record]) -> list[Parsed]:
        import torch

        prompts = [self.prompts.prompt_ids(r) for r in records]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # length buckets: less padding
        texts: list[str] = [""] * len(prompts)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                batch = self.tokenizer.pad([{"input_ids": prompts[i]} for i in idx], padding=True,
                                           return_tensors="pt")
                out = self.model.generate(**batch, max_new_tokens=self.max_new_tokens, do_sample=False,
                                          pad_token_id=self.tokenizer.pad_token_id,
                                          eos_token_id=self.tokenizer.eos_token_id)
                new = out[:, batch["input_ids"].shape[1]:]
                for i, ids in zip(idx, new):
                    texts[i] = self.tokenizer.decode(ids, skip_special_tokens=True)
        return [self.stats.add(self.parser.name, self.parser(text)) for text in texts]

    def verdicts(self, records: Sequence[PairRecord]) -> list:
        """Verdicts (pairwise-grading schemes: the verdict their score pair implies); None = parse failure."""
        return [p.verdict if p.ok else None for p in self.generate(records)]

    def scores(self, records: Sequence[PointRecord]) -> list[float | None]:
        return [p.score if p.ok else None for p in self.generate(records)]


def _tokenizer(info):
    from .models.backbones import load_tokenizer

    return load_tokenizer(info, padding_side="left")  # generation continues every prompt at its end


def evaluate(judge: GenerativeJudge, records: Sequence[Record]) -> dict[str, Any]:
    """The study's metrics on a labelled set; a parse failure counts as a wrong verdict (pairs) or is left out
    and counted (scores). Pairs are also judged swapped (Auto-J agreement and position consistency)."""
    from .metrics import autoj_agreement, correlations, pairwise_metrics

    before = judge.stats.total(judge.parser.name)
    if judge.scheme.kind == "pair":
        gold = [r.verdict for r in records]
        forward = judge.verdicts(records)
        swapped = judge.verdicts([r.swapped() for r in records])
        out = pairwise_metrics(gold, forward, failures="count_wrong").as_dict()
        both = autoj_agreement(gold, forward, swapped, failures="count_wrong")
        out.update(agreement=both.agreement, consistency=both.consistency)
    else:
        scores = judge.scores(records)
        n_failed = sum(s is None for s in scores)
        if len(scores) - n_failed >= 2:
            out = asdict(correlations([r.score for r in records], scores, failures="exclude"))
        else:  # nothing to correlate: reported as missing, not as zero
            out = {"n": len(scores), "n_scored": len(scores) - n_failed, "n_failed": n_failed,
                   "pearson": None, "kendall": None, "spearman": None}
    out["outputs"] = judge.stats.total(judge.parser.name) - before
    return out


def train_generative(cfg: TrainConfig) -> Path:
    """``clfjudge train`` for ``head: generative``: LM-head fine-tuning on the judgement tokens, then greedy
    evaluation on dev / test / eval sources. Returns the judge directory (HF causal LM + judge card)."""
    import torch
    from transformers import DataCollatorForSeq2Seq, Trainer, set_seed

    from .card import JudgeCard
    from .models.backbones import load_causal_lm, resolve_backbone
    from .train_config import training_arguments
    from .train_data import build_splits, pair_baselines

    start = time.monotonic()
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
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

    import datasets

    def dataset(records: Sequence[Record]):
        rows = [prompts.example(r) for r in records]
        for row in rows:
            row["length"] = len(row["input_ids"])
        return datasets.Dataset.from_list(rows)

    out_dir = Path(cfg.output_dir)
    ckpt_dir = out_dir / "checkpoints"
    args = training_arguments(cfg, head, ckpt_dir, has_dev=False)  # dev is scored by generation afterwards
    trainer = Trainer(model=model, args=args, train_dataset=dataset(splits.train),
                      data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, padding=True),
                      processing_class=tokenizer)
    result = trainer.train()

    tokenizer.padding_side = "left"
    judge = GenerativeJudge(model, tokenizer, scheme, cfg.max_length, budget, cfg.ref_drop < 1.0,
                            batch_size=cfg.eval_batch_size or cfg.batch_size)
    validation: dict[str, Any] = {}
    for name, records in [("dev", splits.dev), ("test", splits.test),
                          *((f"eval:{n}", r) for n, r in splits.evals.items())]:
        if records:
            validation[name] = evaluate(judge, records)
            if head.kind == "pair":
                validation[name]["baselines"] = pair_baselines(records)
    wall = time.monotonic() - start

    trainer.save_model(str(out_dir))
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(out_dir))
        card = JudgeCard(
            head=GENERATIVE, kind=head.kind, backbone=cfg.backbone, scheme=scheme, max_length=cfg.max_length,
            truncation={"policy": asdict(prompts.policy), "use_reference": prompts.use_reference,
                        "report": {"train": prompts.report.to_dict(), "eval": judge.prompts.report.to_dict()}},
            template=getattr(SCHEMES.get(scheme), "template", ""),
            label_map={"parser": SCHEMES.get(scheme).parser},
            training={
                "sources": splits.sources, "split": splits.counts, "config": asdict(cfg),
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
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return out_dir
