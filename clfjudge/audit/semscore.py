"""SemScore (Aynedinov & Akbik, "SemScore: Automated Evaluation of Instruction-Tuned LLMs based on Semantic
Textual Similarity"): cosine similarity between the embeddings of a response and a reference response, with
all-mpnet-base-v2 (mean pooling, L2-normalised) as the embedding model, read by the library's ``TextEmbedder``.

Two uses:
- a reference-based pointwise judge (``SemScore.score_records``) on data with references;
- a system-level metric (``system_level``): per-system means, then |Kendall tau| and |Pearson r| against
  human or GPT-4 system scores, as in the paper's Table 3.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..batching import DEFAULT_BATCH_SIZE, Budget
from ..data.records import PointRecord

DEFAULT_MODEL = "mpnet"  # offline alias of sentence-transformers/all-mpnet-base-v2


class SemScore:
    """Embeds each distinct text once and returns cosine similarities."""

    def __init__(self, model: str = DEFAULT_MODEL, batch_size: int = DEFAULT_BATCH_SIZE, device: str = "cpu",
                 precision: str = "auto") -> None:
        from ..embedders.sentence import TextEmbedder

        self.model_spec = model
        # bf16 autocast on AMX / AVX512-BF16 CPUs and GPUs, cosines within ~1e-3 of fp32
        self.embedder = TextEmbedder(model, budget=Budget(batch_size), device=device, precision=precision)

    @property
    def precision(self) -> str:
        return self.embedder.precision

    def similarity(self, responses: Sequence[str], references: Sequence[str],
                   show_progress: bool = False) -> np.ndarray:
        if len(responses) != len(references):
            raise ValueError(f"{len(responses)} responses but {len(references)} references")
        unique = list(dict.fromkeys([*responses, *references]))
        emb = self.embed(unique, show_progress)
        index = {text: i for i, text in enumerate(unique)}
        a = emb[[index[t] for t in responses]]
        b = emb[[index[t] for t in references]]
        return np.sum(a * b, axis=1)

    def embed(self, texts: Sequence[str], show_progress: bool = False) -> np.ndarray:
        """L2-normalised float32 embeddings of ``texts``."""
        self.embedder.show_progress = show_progress
        return self.embedder.embed(texts)

    def score_records(self, records: Sequence[PointRecord], show_progress: bool = False) -> np.ndarray:
        missing = [r.id for r in records if not r.reference]
        if missing:
            raise ValueError(f"SemScore needs a reference answer; {len(missing)} records have none "
                             f"(first: {missing[0]})")
        return self.similarity([r.answer for r in records], [r.reference for r in records], show_progress)


@dataclass
class SystemLevel:
    systems: list[str]
    metric_means: list[float]
    gold_means: list[float]
    kendall_tau: float  # |tau| and |r|, the paper's protocol
    pearson_r: float
    n_per_system: dict[str, int]
    kendall_tau_signed: float  # the same with their sign: a judge that ranks the systems backwards is negative
    pearson_r_signed: float


def system_level(systems: Sequence[str], metric: Sequence[float], gold: Sequence[float]) -> SystemLevel:
    """Average metric and gold per system, then |Kendall tau| and |Pearson r| across systems (paper §4), and both
    with their sign."""
    from scipy.stats import kendalltau, pearsonr

    by_sys: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s, m, g in zip(systems, metric, gold, strict=True):
        by_sys[s].append((m, g))
    names = sorted(by_sys)
    if len(names) < 3:
        raise ValueError(f"system-level correlation needs at least 3 systems, got {names}")
    m_means = [float(np.mean([m for m, _ in by_sys[s]])) for s in names]
    g_means = [float(np.mean([g for _, g in by_sys[s]])) for s in names]
    tau = float(kendalltau(m_means, g_means).statistic)
    r = float(pearsonr(m_means, g_means).statistic)
    return SystemLevel(systems=names, metric_means=m_means, gold_means=g_means, kendall_tau=abs(tau), pearson_r=abs(r),
                       n_per_system={s: len(by_sys[s]) for s in names}, kendall_tau_signed=tau, pearson_r_signed=r)
