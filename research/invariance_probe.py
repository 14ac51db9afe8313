"""Does a head fitted for invariance across sources generalize better than one fitted on the pooled sources?

Domain generalization on the default judge's features (the cross probe's ``first`` reading: SmolLM2 layer 8, the
answer's mean state after its question, plus information length). The pooled head (the default's) fits every
training source at once; the variants here keep only what holds in each of them:

- ``ensemble``: one head per training source, their margins standardised and averaged;
- ``sign agreement``: per-source heads vote on the sign of each embedding weight; the pooled head is refitted on
  the dimensions where all (or all but one) sources agree;
- ``pca k``: the pooled head on the top ``k`` principal directions of the training differences;
- ``group DRO``: the pooled head refitted with source weights exp(eta * loss) (the worst-fitted source counts most);
- ``+ Auto-J ratings``: the pooled head with Auto-J's pointwise training data (960 answers, GPT-4 1-10 ratings) as
  one more source: same-question pairs with different ratings and, within a scenario, cross-question pairs whose
  ratings differ by at least ``--gap`` (each answer read after its own question, as a reward model reads them).

On the reader probe's protocol (``reader_probe.py``: leave one pool source out, LLMBar case studies as dev, points
above longer-answer-wins on the same non-tie pairs; the evaluation sets with ``--test``, for the record, choosing
nothing). Readings come from the cross probe's cache (read if missing) and, for the Auto-J answers, the library's
embedding cache.

    OMP_NUM_THREADS=2 .venv/bin/python research/invariance_probe.py [--per-source 500] [--gap 5]
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cross_probe  # noqa: E402
import reader_probe as rp  # noqa: E402
from common import write  # noqa: E402

C = 0.03
Margin = Callable[[cross_probe.Pairs], np.ndarray]


def _scale(train: list) -> dict:
    return {"first": np.vstack([p.first for p in train]).std(0) + 1e-6,
            "info": np.concatenate([p.info for p in train]).std()}


def _x(p, scale: dict) -> np.ndarray:
    """The default's design: the embedding difference over sqrt(width), information length beside it."""
    return np.hstack([p.first / scale["first"] / np.sqrt(p.first.shape[1]), p.info[:, None] / scale["info"]])


def _logreg(x: np.ndarray, y: np.ndarray, w: np.ndarray, c: float = C) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    w = w * len(w) / w.sum()
    model = LogisticRegression(C=c, fit_intercept=False, max_iter=5000)
    model.fit(np.vstack([x, -x]), np.concatenate([y, 1 - y]), sample_weight=np.concatenate([w, w]))
    return model.coef_[0]


def pooled(train: list, balanced: bool, source_weights: np.ndarray | None = None, mask=None) -> Margin:
    scale = _scale(train)
    keep = np.ones(train[0].first.shape[1] + 1, bool) if mask is None else mask
    sw = np.ones(len(train)) if source_weights is None else source_weights
    coef = _logreg(np.vstack([_x(p, scale)[:, keep] for p in train]), np.concatenate([p.y for p in train]),
                   np.concatenate([rp.pair_weights(p, balanced) * s for p, s in zip(train, sw)]))
    return lambda p: _x(p, scale)[:, keep] @ coef


def _per_source(train: list, balanced: bool, scale: dict) -> np.ndarray:
    # each source alone has 1/len(train) of the data: the same regularisation per pair as the pooled head
    return np.array([_logreg(_x(p, scale), p.y, rp.pair_weights(p, balanced), C * len(train)) for p in train])


def ensemble(train: list, balanced: bool) -> Margin:
    scale = _scale(train)
    coefs = _per_source(train, balanced, scale)
    coef = np.mean([c / (_x(p, scale) @ c).std() for c, p in zip(coefs, train)], axis=0)
    return lambda p: _x(p, scale) @ coef


def sign_agreement(train: list, balanced: bool, dissent: int) -> Margin:
    coefs = _per_source(train, balanced, _scale(train))
    agree = np.maximum((coefs > 0).sum(0), (coefs < 0).sum(0)) >= len(train) - dissent
    agree[-1] = True  # information length stays
    return pooled(train, balanced, mask=agree)


def pca(train: list, balanced: bool, k: int) -> Margin:
    scale = _scale(train)
    emb = np.vstack([_x(p, scale)[:, :-1] for p in train])
    _, _, vt = np.linalg.svd(np.vstack([emb, -emb]), full_matrices=False)  # both orders: centred by symmetry
    proj = vt[:k].T

    def z(p) -> np.ndarray:
        x = _x(p, scale)
        return np.hstack([x[:, :-1] @ proj, x[:, -1:]])
    sd = np.vstack([z(p) for p in train]).std(0) + 1e-9
    coef = _logreg(np.vstack([z(p) / sd for p in train]), np.concatenate([p.y for p in train]),
                   np.concatenate([rp.pair_weights(p, balanced) for p in train]))
    return lambda p: z(p) / sd @ coef


def group_dro(train: list, balanced: bool, eta: float, rounds: int = 5) -> Margin:
    sw = np.ones(len(train))
    for _ in range(rounds):
        margin = pooled(train, balanced, sw)
        loss = np.array([np.mean(np.logaddexp(0, -(2 * p.y - 1) * margin(p))) for p in train])
        sw = np.exp(eta * (loss - loss.max()))
        sw /= sw.mean()
    return pooled(train, balanced, sw)


def with_source(train: list, balanced: bool, extra) -> Margin:
    return pooled([*train, extra], balanced)


def trained(train: list, make: Callable, balanced: bool) -> Callable:
    """The head ``make`` fits on ``train``, as its points above longer-answer-wins on a set."""
    margin = make(train, balanced)
    return lambda p: 100 * np.mean((margin(p) > 0) == (p.y == 1)) - p.longer


class RatedPairs:
    """Pairs of Auto-J's rated single answers, with the Pairs fields the heads use (answer order seeded)."""

    def __init__(self, vectors: np.ndarray, info: np.ndarray, chars: np.ndarray, rating: np.ndarray,
                 pairs: list[tuple[int, int]], seed: int = 0) -> None:
        i, j = np.array(pairs).T
        swap = np.random.default_rng(seed).random(len(i)) < 0.5
        i, j = np.where(swap, j, i), np.where(swap, i, j)
        self.first, self.info, self.chars = vectors[i] - vectors[j], info[i] - info[j], chars[i] - chars[j]
        self.y = (rating[i] > rating[j]).astype(float)
        self.longer = 100 * np.mean(np.where(self.chars == 0, 0.5, (self.chars > 0) == (self.y == 1)))


def autoj_ratings(gap: float, precision: str, cap: int = 1500, seed: int = 0) -> RatedPairs:
    from clfjudge.data.sources import load
    from clfjudge.embedders.decoder import DecoderEmbedder
    from clfjudge.judges.features import information_lengths

    recs = load("autoj-single-train").records
    reader = DecoderEmbedder("smollm2", layer=8, max_prompt_tokens=rp.MAX_PROMPT, max_answer_tokens=rp.MAX_ANSWER,
                             precision=precision, show_progress=True)  # the library's reading: the cross probe's
    vectors = reader.embed_answers([r.question for r in recs], [r.answer for r in recs])
    rating = np.array([float(r.score) for r in recs])
    same = [(a, b) for a in range(len(recs)) for b in range(a + 1, len(recs))
            if recs[a].question == recs[b].question and rating[a] != rating[b]]
    cross = [(a, b) for a in range(len(recs)) for b in range(a + 1, len(recs))
             if recs[a].scenario == recs[b].scenario and recs[a].question != recs[b].question
             and abs(rating[a] - rating[b]) >= gap]
    rng = np.random.default_rng(seed)
    cross = [cross[k] for k in rng.choice(len(cross), size=min(cap, len(cross)), replace=False)]
    answers = [r.answer for r in recs]
    return RatedPairs(vectors, np.log1p(information_lengths(answers)), np.log1p([len(t) for t in answers]),
                      rating, same + cross, seed)


def main() -> int:
    p = rp.probe_parser(__doc__)
    p.add_argument("--gap", type=float, default=5.0, help="rating gap of the Auto-J cross-question pairs")
    args = p.parse_args()
    started = time.monotonic()
    named = rp.probe_sets(args.per_source, args.test)
    data = {n: cross_probe.Pairs(recs, np.load(cross_probe.read(args.reader, 8, n, recs, args.cache,
                                                                args.precision)))
            for n, recs in named.items()}
    extra = autoj_ratings(args.gap, args.precision)
    variants = {"pooled (the default's head)": pooled,
                "ensemble of per-source heads": ensemble,
                "sign agreement, all sources": partial(sign_agreement, dissent=0),
                "sign agreement, all but one": partial(sign_agreement, dissent=1),
                **{f"pca {k}": partial(pca, k=k) for k in (8, 32, 128)},
                **{f"group DRO, eta {e:g}": partial(group_dro, eta=e) for e in (2.0, 5.0)},
                f"+ Auto-J ratings (gap {args.gap:g}, {len(extra.y)} pairs)": partial(with_source, extra=extra)}
    rows = {f"{name}{', length-balanced' if balanced else ''}":
            rp.group_probe(data, None, balanced, fit=partial(trained, make=make, balanced=balanced))
            for balanced in (False, True) for name, make in variants.items()}
    result = rp.probe_result(args, started, rows, f"{args.reader}:8", gap=args.gap,
                          autoj_pairs={"n": len(extra.y), "longer_wins": extra.longer})
    print(f"wrote {write('invariance_probe', result, markdown(result))}")
    return 0


def markdown(result: dict) -> str:
    return rp.group_markdown(result, "Invariance probe", "Heads on the default's features (layer-8 mean state + "
                             "information length, C = 0.03) fitted for what holds across sources rather than on the "
                             "pooled sources.")


if __name__ == "__main__":
    sys.exit(main())
