"""Does the answer explain its question? A backward-likelihood probe (MMI reranking, Li et al. 2016; instruction
backtranslation, Li et al. 2023).

Every judge so far reads the answer *after* the question: its features say what the answer is like, and how
well the question predicts it (PMI, the forward direction, which a long fluent answer wins by length alone). Here
the decoder reads the answer first and then scores the question: the mean log-probability of the question's
tokens given the answer, in the reader's chat template (user: the answer and a request for the instruction it
was written for; assistant: the question). Both answers of a pair are scored on the *same* target tokens, so the
difference is not a length of the thing scored; an answer to a neighbouring question (LLMBar's Neighbor and
GPTInst) or one that ignores a constraint should predict the question worse.

Features (differences A - B): ``bwd`` = that mean log-probability; with information length (``info``) and the
default judge's layer-8 mean state (``first``: the cross probe's cached first reading), logistic regression with
C = 0.03 on the reader probe's protocol (leave one pool source out, LLMBar case studies as dev; points above
longer-answer-wins on the same non-tie pairs; the evaluation sets with ``--test``, for the record, choosing
nothing). Readings cached as ``.npz`` per set under ``--cache``.

    OMP_NUM_THREADS=2 .venv/bin/python research/backward_probe.py [--per-source 500] [--test]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reader_probe as rp  # noqa: E402
from common import write  # noqa: E402

ASK = "Here is a response:\n\n{answer}\n\nWrite the instruction it responds to."


def read(spec: str, name: str, records: list, cache: Path, precision: str) -> Path:
    """Mean log-probability of each record's question given each of its answers (one entry per distinct text)."""
    path = cache / f"backward-{spec}" / f"{name}.npz"
    if path.exists():
        return path
    from clfjudge.models.backbones import load_tokenizer, resolve_backbone

    tok = load_tokenizer(resolve_backbone(spec))
    ids = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    entries = {}
    for r in records:
        question = ids(r.question)
        if len(question) > rp.MAX_PROMPT:  # keep both ends of a long instruction, as the reader's prompt does
            question = question[:rp.MAX_PROMPT // 2] + question[-rp.MAX_PROMPT // 2:]
        target = question + [tok.eos_token_id]
        for answer in (r.answer_a, r.answer_b):
            key = rp.text_key(r.question, answer)
            if key not in entries:
                body = tok.decode(ids(answer)[:rp.MAX_ANSWER])
                prefix = ids(tok.apply_chat_template([{"role": "user", "content": ASK.format(answer=body)}],
                                                     tokenize=False, add_generation_prompt=True))
                entries[key] = (key, prefix, target)
    started = time.monotonic()
    nll = rp.token_nll(spec, list(entries.values()), tok.eos_token_id, precision)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, keys=np.array(list(entries)), bwd=np.array([-x.mean() for x in nll], np.float32))
    print(f"[backward {spec}] {name}: {len(entries)} answers in {time.monotonic() - started:.0f} s", flush=True)
    return path


FIELDS = {"bwd": ("bwd", float)}  # feature -> (cached field, transform)


def rule(p: rp.ScalarPairs) -> float:
    """The backward likelihood alone, untrained: the answer that predicts the question better wins."""
    return 100 * np.mean(np.where(p.bwd == 0, 0.5, (p.bwd > 0) == (p.y == 1))) - p.longer


def main() -> int:
    p = rp.probe_parser(__doc__)
    p.add_argument("--sets", nargs="*", help="only these sets (a quick look)")
    args = p.parse_args()
    started = time.monotonic()
    named = rp.probe_sets(args.per_source, args.test)
    if args.sets:
        named = {n: named[n] for n in args.sets}
    cross = args.cache / "cross-smollm2-8"
    data = {n: rp.ScalarPairs(recs, np.load(read(args.reader, n, recs, args.cache, args.precision)), FIELDS,
                                 np.load(cross / f"{n}.npz") if (cross / f"{n}.npz").exists() else None)
            for n, recs in named.items()}
    if args.sets:
        for n, d in data.items():
            print(f"{n}: backward rule {rule(d):+.1f} (longer wins {d.longer:.1f}, {len(d.y)} pairs)")
        return 0
    variants = {"backward rule (untrained)": None, "info": ("info",), "bwd + info": ("bwd", "info")}
    if all(hasattr(d, "first") for d in data.values()):
        variants |= {"layer 8 + info (the default's features)": ("first", "info"),
                     "layer 8 + bwd + info": ("first", "bwd", "info")}
    rows = {f"{name}{', length-balanced' if balanced else ''}": rp.group_probe(data, groups, balanced, rule)
            for balanced in (False, True) for name, groups in variants.items() if groups or not balanced}
    result = rp.probe_result(args, started, rows, ask=ASK)
    print(f"wrote {write('backward_probe', result, markdown(result))}")
    return 0


def markdown(result: dict) -> str:
    return rp.group_markdown(result, "Backward-likelihood probe", "`bwd`: mean log-probability of the question's "
                             f"tokens after the answer, asked as {result['ask']!r}.")


if __name__ == "__main__":
    sys.exit(main())
