"""The data of one training run, shared by every trainer (``trainer.py``, ``generative.py``,
``embedding.py``): records from the train sources, kept or excluded (counted) by the head -> grouped
held-out fold (optional) -> removal of training questions that also occur in any evaluation data -> grouped dev
split -> mixed-in sources -> cap -> hard negatives, reference drop and swap augmentation (``build_splits``). What a
trained judge is scored with on those splits is ``metrics.evaluate_pairs`` / ``evaluate_points``.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..data.records import PairRecord, Record
from ..data.sources import describe, load_usable, parse_source
from ..models.heads import Head
from .config import TrainConfig


def load_source_records(spec: str, head: Head, rng: random.Random,
                        cfg: TrainConfig | None = None) -> tuple[list[Record], dict[str, Any]]:
    """Records of one source that the head can learn from, and the counts of everything else (and, for the user's
    own data, what the card records of it: path, content hash, format)."""
    options = cfg.read_options() if cfg is not None else None
    source = load_usable(spec, head.select, *([options] if options else []))
    usable, excluded, limit = source.records, source.excluded, source.limit
    if not usable:
        raise ValueError(f"source {source.name!r}: none of its {len(source.loaded.records)} records suits a "
                         f"{head.name} head (excluded: {dict(excluded)})")
    # one draw per source whatever its cap, and a permutation of its own: a smaller N samples a prefix of what a
    # larger N samples (a pool grown or shrunk keeps its other records, and their cached embeddings)
    permutation = random.Random(rng.random()).sample(range(len(usable)), len(usable))
    if limit is not None and len(usable) > limit:
        excluded[f"beyond the sample of {limit}"] += len(usable) - limit
        usable = [usable[i] for i in permutation[:limit]]
    stats = {"loaded": len(source.loaded.records), "excluded_by_loader": dict(source.loaded.excluded),
             "first_excluded": source.loaded.account()["first_excluded"], "excluded_for_head": dict(excluded),
             "used": len(usable)}
    data = describe(source.name, *([options] if options else []))
    if data is not None:
        stats["data"] = data
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
    from ..data import sources as source_registry

    names = (parse_source(s)[0] for s in (*cfg.sources, *cfg.extra_train_sources))
    fixed = [n for n in names if source_registry.resolve(n, cfg.read_options()).fixed_order]
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
    content: dict[str, str] | None = None  # the training split's records as content keys (the audit's trained-on)


def _grouped_split(records: list[Record], fraction: float, seed: int) -> tuple[list[Record], list[Record]]:
    """(kept, held out): ``fraction`` of the questions held out, grouped by normalized question."""
    from ..data.splits import train_dev_split

    if not fraction:
        return records, []
    kept, held = train_dev_split(records, fraction, seed)
    return [records[i] for i in kept], [records[i] for i in held]


def _held_out(records: list[Record], cfg: TrainConfig) -> tuple[list[Record], list[Record]]:
    """(kept, held out): fold ``cv_fold`` of a grouped k-fold split, or a grouped ``test_fraction``."""
    from ..data.splits import group_kfold

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
    from ..data.splits import decontaminate

    if not cfg.extra_train_sources:
        return [], {}
    rng = random.Random(f"extra-train:{cfg.seed}")
    records = []
    for spec in cfg.extra_train_sources:
        recs, stats[parse_source(spec)[0]] = load_source_records(spec, head, rng, cfg)
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
    from ..embedders.sentence import TextEmbedder
    from ..judges.embedding import neighbour_negatives

    pairs = [r for r in train if isinstance(r, PairRecord)]
    embedder = TextEmbedder(cfg.neighbour_encoder)
    return [replace(r, id=f"{r.id}:{copy}") for copy in range(cfg.neighbour_negatives)
            for r in neighbour_negatives(pairs, embedder, seed=cfg.seed + copy, limit=cfg.neighbour_limit,
                                         candidates=cfg.neighbour_candidates)]


def build_splits(cfg: TrainConfig, head: Head) -> Splits:
    from ..data import sources as source_registry
    from ..data.splits import CONTENT_KEY, content_key, decontaminate

    check_order_shortcut(cfg, head)
    rng = random.Random(cfg.seed)
    records, stats = [], {}
    for spec in cfg.sources:
        recs, stats[parse_source(spec)[0]] = load_source_records(spec, head, rng, cfg)
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
        evals[name], eval_stats[name] = load_source_records(spec, head, rng, cfg)
    against = list(test) + [r for recs in evals.values() for r in recs]
    for name in cfg.decontaminate_against:
        against += source_registry.load(name, options=cfg.read_options()).records
    before = len(pool)
    pool, _, removed_by_set = decontaminate(pool, against) if against else (pool, 0, {})
    train, dev = _grouped_split(pool, cfg.dev_fraction, cfg.seed)
    extra, extra_counts = _extra_train(cfg, head, against + dev, stats)
    train, capped = _cap(train + extra, cfg.max_train_records, rng)
    dev, dev_capped = _cap(dev, cfg.max_dev_records, rng)
    head.fit(train)  # before the hard negatives: the length covariate is fitted on real pairs only
    content = {"key": CONTENT_KEY, "train": " ".join(sorted({content_key(r) for r in train}))}
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
    return Splits(train, dev, test, evals, counts, {"train": stats, "eval": eval_stats}, content)
