"""Information length by the language model: how many nats does the answer carry after its question?

Information length (zlib-compressed bytes) is the one feature that beats "longer answer wins" on PandaLM with a CI
clear of zero, and beat character length on every pool source held out. zlib only sees redundancy inside the
answer. A language model also knows what is predictable in general (boilerplate, restating the question, filler
phrases), so the answer's total surprisal after its question, sum over its tokens of -log p(token | question,
answer so far), is a better estimate of how much it says. The whole SmolLM2 reads each answer in the default
judge's frame (its chat template, the reader's token limits) and keeps, per answer, the total and the mean
negative log-likelihood of the answer's tokens and their count.

Features (differences A - B): ``lm_info`` = log total nats, ``lm_mean`` = mean nats per token, beside ``info``
(zlib information length) and the default judge's layer-8 state (``first``: the cross probe's cached reading),
logistic regression with C = 0.03 on the reader probe's protocol (leave one pool source out, LLMBar case studies as
dev; points above longer-answer-wins on the same non-tie pairs; the evaluation sets with ``--test``, for the
record, choosing nothing). Readings cached as ``.npz`` per set under ``--cache``.

    OMP_NUM_THREADS=2 .venv/bin/python research/surprisal_probe.py [--per-source 500] [--test]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reader_probe as rp  # noqa: E402
from common import write  # noqa: E402


def read(spec: str, name: str, records: list, cache: Path, precision: str) -> Path:
    """Per distinct (question, answer): total and mean NLL (nats) of the answer's tokens after the question."""
    path = cache / f"surprisal-{spec}" / f"{name}.npz"
    if path.exists():
        return path
    started = time.monotonic()
    entries, pad = rp.answer_items(spec, records)
    nll = rp.token_nll(spec, entries, pad, precision)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, keys=np.array([e[0] for e in entries]), total=np.array([x.sum() for x in nll], np.float32),
             mean=np.array([x.mean() if x.size else 0.0 for x in nll], np.float32))
    print(f"[surprisal {spec}] {name}: {len(entries)} answers in {time.monotonic() - started:.0f} s", flush=True)
    return path


FIELDS = {"lm_info": ("total", np.log1p), "lm_mean": ("mean", float)}  # feature -> (cached field, transform)


def rule(p: rp.ScalarPairs) -> float:
    """Untrained: the answer that carries more nats wins (an information-length rule)."""
    return 100 * np.mean(np.where(p.lm_info == 0, 0.5, (p.lm_info > 0) == (p.y == 1))) - p.longer


def main() -> int:
    p = rp.probe_parser(__doc__)
    args = p.parse_args()
    started = time.monotonic()
    named = rp.probe_sets(args.per_source, args.test)
    cross = args.cache / "cross-smollm2-8"
    data = {n: rp.ScalarPairs(recs, np.load(read(args.reader, n, recs, args.cache, args.precision)), FIELDS,
                                 np.load(cross / f"{n}.npz") if (cross / f"{n}.npz").exists() else None)
            for n, recs in named.items()}
    variants = {"more nats wins (untrained)": None, "info": ("info",), "lm_info": ("lm_info",),
                "lm_info + lm_mean": ("lm_info", "lm_mean"), "info + lm_info": ("info", "lm_info")}
    if all(hasattr(d, "first") for d in data.values()):
        variants |= {"layer 8 + info (the default's features)": ("first", "info"),
                     "layer 8 + lm_info": ("first", "lm_info"),
                     "layer 8 + info + lm_info": ("first", "info", "lm_info")}
    rows = {f"{name}{', length-balanced' if balanced else ''}": rp.group_probe(data, groups, balanced, rule)
            for balanced in (False, True) for name, groups in variants.items() if groups or not balanced}
    result = rp.probe_result(args, started, rows)
    print(f"wrote {write('surprisal_probe', result, markdown(result))}")
    return 0


def markdown(result: dict) -> str:
    return rp.group_markdown(result, "Surprisal probe", "`lm_info`: log of the answer's total negative "
                             "log-likelihood (nats) after its question under the whole reader; `lm_mean`: nats per "
                             "token; `info`: zlib information length; `layer 8`: the default judge's state.")


if __name__ == "__main__":
    sys.exit(main())
