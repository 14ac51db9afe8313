"""Deterministic, question-grouped splits and the training-data contamination filter.

Records that share a normalized instruction are one group: a group never straddles train and test (the
same question with other answers would leak the label's context). Groups are shuffled with the given seed,
so a seed always gives the same split.

Contamination keys are stricter than the grouping key: a question matches when its normalized text is equal
*or* its set of normalized non-empty lines is equal. The second key catches the same prompt written with its
parts in another order, e.g. PandaLM's "input\\ninstruction" (UnlimitedJudge's question format) against
AlpacaEval's "instruction\\n\\ninput": 29 of PandaLM's 170 test prompts match AlpacaEval exactly, 168 do by
line set.
"""
from __future__ import annotations

import hashlib
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from itertools import permutations

import numpy as np
from sklearn.model_selection import GroupKFold, GroupShuffleSplit, StratifiedGroupKFold

from .records import CLASS_OF_VERDICT, PairRecord, Record


def _is_edge(char: str) -> bool:
    return char.isspace() or unicodedata.category(char).startswith("P")


def normalize_instruction(text: str) -> str:
    """Lowercase, collapse whitespace, strip punctuation (and space) at both ends."""
    text = " ".join(text.lower().split())
    start, end = 0, len(text)
    while start < end and _is_edge(text[start]):
        start += 1
    while end > start and _is_edge(text[end - 1]):
        end -= 1
    return text[start:end]


def line_set_key(text: str) -> str:
    """The sorted, normalized non-empty lines: equal for the same parts in another order."""
    return "\n".join(sorted({line for line in map(normalize_instruction, text.splitlines()) if line}))


def contamination_keys(text: str) -> frozenset[str]:
    return frozenset(key for key in (normalize_instruction(text), line_set_key(text)) if key)


CONTENT_KEY = "sha256(normalized question, answers stripped and sorted)[:16]"  # what content_key computes


def content_key(record: Record) -> str:
    """A record's content, whatever its id, file or answer order: the same pairs (or rated answers) under another
    name have the same keys (``CONTENT_KEY``; the judge card lists its training split's, the audit compares)."""
    answers = sorted(a.strip() for a in ((record.answer_a, record.answer_b) if isinstance(record, PairRecord)
                                         else (record.answer,)))
    text = "\0".join([normalize_instruction(record.question), *answers])
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:16]


def group_ids(records: Sequence[Record]) -> np.ndarray:
    """One integer per record: equal for records whose normalized questions are equal."""
    codes: dict[str, int] = {}
    return np.array([codes.setdefault(normalize_instruction(r.question), len(codes)) for r in records])


def _labels(records: Sequence[Record]) -> np.ndarray | None:
    """Stratification labels (3-way class for pairs, rounded score for points), or None if unlabelled."""
    labels = []
    for r in records:
        if isinstance(r, PairRecord):
            label = CLASS_OF_VERDICT[r.verdict] if r.verdict is not None else None
        else:
            label = round(r.score) if r.score is not None else None
        if label is None:
            return None
        labels.append(label)
    return np.array(labels)


def group_kfold(records: Sequence[Record], k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``k`` (train_idx, test_idx) folds, grouped by normalized question, groups shuffled with ``seed``.

    Folds are stratified by label (sklearn ``StratifiedGroupKFold``) when every record is labelled and there
    are at least two classes, else plain ``GroupKFold``.
    """
    if k < 2:
        raise ValueError(f"group_kfold needs k >= 2, got {k}")
    groups, labels = group_ids(records), _labels(records)
    if labels is not None and len(np.unique(labels)) > 1:
        splitter = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    else:
        splitter, labels = GroupKFold(n_splits=k, shuffle=True, random_state=seed), None
    placeholder = np.zeros(len(records))
    return [(train, test) for train, test in splitter.split(placeholder, labels, groups)]


def train_dev_split(records: Sequence[Record], dev_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, dev_idx), grouped by normalized question. ``dev_fraction`` is the share of *questions*
    (groups) held out, so the share of records is close to it but not exact."""
    if not 0.0 < dev_fraction < 1.0:
        raise ValueError(f"dev_fraction must be in (0, 1), got {dev_fraction}")
    splitter = GroupShuffleSplit(n_splits=1, test_size=dev_fraction, random_state=seed)
    train, dev = next(splitter.split(np.zeros(len(records)), groups=group_ids(records)))
    return np.sort(train), np.sort(dev)


def _by_source(eval_records: Mapping[str, Iterable[Record]] | Iterable[Record]) -> dict[str, list[Record]]:
    if isinstance(eval_records, Mapping):
        return {name: list(records) for name, records in eval_records.items()}
    grouped: dict[str, list[Record]] = defaultdict(list)
    for record in eval_records:
        grouped[record.source].append(record)
    return dict(grouped)


def decontaminate(
    train_records: Iterable[Record],
    eval_records: Mapping[str, Iterable[Record]] | Iterable[Record],
) -> tuple[list[Record], int, dict[str, int]]:
    """Drop training records whose question appears in any evaluation set in use.

    ``eval_records``: {eval set name: records}, or records (grouped by their ``source``). Returns the kept
    records, how many were removed, and how many removals each evaluation set caused (a record whose
    question is in two sets counts for both).
    """
    owners: dict[str, set[str]] = defaultdict(set)
    evals = _by_source(eval_records)
    for name, records in evals.items():
        for record in records:
            for key in contamination_keys(record.question):
                owners[key].add(name)
    kept: list[Record] = []
    report = dict.fromkeys(sorted(evals), 0)
    removed = 0
    for record in train_records:
        hits = set().union(*(owners.get(key, ()) for key in contamination_keys(record.question)))
        if not hits:
            kept.append(record)
            continue
        removed += 1
        for name in hits:
            report[name] += 1
    return kept, removed, report


def question_overlaps(named: Mapping[str, Sequence[Record]]) -> dict[tuple[str, str], tuple[int, int]]:
    """For each ordered pair (a, b) of sets sharing questions: (distinct questions of b found in a by exact
    normalized match, ... by either contamination key)."""
    keys = {  # set name -> {normalized question: its contamination keys}
        name: {normalize_instruction(r.question): contamination_keys(r.question) for r in records}
        for name, records in named.items()
    }
    pool = {name: set().union(*questions.values()) for name, questions in keys.items()}
    overlaps = {}
    for a, b in permutations(named, 2):
        n_exact = sum(1 for question in keys[b] if question and question in keys[a])
        n_loose = sum(1 for question_keys in keys[b].values() if question_keys & pool[a])
        if n_loose:
            overlaps[(a, b)] = (n_exact, n_loose)
    return overlaps
