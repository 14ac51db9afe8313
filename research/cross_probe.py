"""Does a frozen reader judge better when it reads one answer after the other (a cross-reading, as PairRM's
cross-attention does), rather than each answer alone after its question?

Every pair is read twice by SmolLM2 cut at ``--layer`` (bf16 autocast where the CPU has it): the question's
prompt, answer A, a separator, answer B; and the same with B first. Each answer's mean state is kept twice: read
first (after the question alone: exactly the default judge's reading) and read second (after the question and the
other answer, so its states can see what it is compared with). Heads over the antisymmetric differences:

- ``first``: first-read A minus first-read B (the default judge's features);
- ``second``: A read after B minus B read after A (each answer in the light of the other);
- ``first+second``: both.

each with the information-length difference, logistic regression with C = 0.03, on the reader probe's protocol
(``reader_probe.py``: leave one pool source out, LLMBar case studies as dev, points above longer-answer-wins on the
same non-tie pairs; the evaluation sets with ``--test`` only, for the record). Pool sources are capped at
``--per-source`` pairs (a prefix of the reader probe's seeded samples). Readings are cached as ``.npz`` per set
under ``--cache``. A pair costs two passes of both answers: four answer readings, against two.

    OMP_NUM_THREADS=2 .venv/bin/python research/cross_probe.py [--per-source 500] [--test]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reader_probe as rp  # noqa: E402
from common import write  # noqa: E402

SEPARATOR = "\n\nAnother answer:\n\n"  # between the two answers, inside the assistant's turn


def read(spec: str, layer: int, name: str, records: list, cache: Path, precision: str) -> Path:
    """For each record, both orders: the mean layer state over the first answer's and the second answer's tokens
    (``first_ab``, ``second_ab``: A then B; ``first_ba``, ``second_ba``: B then A)."""
    path = cache / f"cross-{spec}-{layer}" / f"{name}.npz"
    if path.exists():
        return path
    from clfjudge.embedders.decoder import DecoderEmbedder

    reader = DecoderEmbedder(spec, max_prompt_tokens=rp.MAX_PROMPT, max_answer_tokens=rp.MAX_ANSWER)
    sep = reader.token_ids(SEPARATOR)
    entries, spans = [], []  # (key, prompt ids, body ids) as rp.read_states takes them; the two answers' spans
    for i, r in enumerate(records):
        prompt = reader.prompt_ids(r.question)
        a, b = reader.answer_ids(r.answer_a), reader.answer_ids(r.answer_b)
        for order, (x, y) in (("ab", (a, b)), ("ba", (b, a))):
            entries.append((f"{i}{order}", prompt, x + sep + y))
            start = len(prompt)
            spans.append(((start, start + len(x)), (start + len(x) + len(sep), start + len(x) + len(sep) + len(y))))
    out = {"first": None, "second": None}

    def keep(batch: list[int], states: dict) -> None:
        h = states[layer]
        for key in out:
            if out[key] is None:
                out[key] = np.zeros((len(entries), h.shape[-1]), np.float32)
        for row, j in enumerate(batch):
            for key, (lo, hi) in zip(("first", "second"), spans[j]):
                out[key][j] = h[row, lo:hi].mean(0).numpy()

    started = time.monotonic()
    rp.read_states(spec, [layer], entries, reader.eos_id, precision, keep)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, first_ab=out["first"][0::2], second_ab=out["second"][0::2], first_ba=out["first"][1::2],
             second_ba=out["second"][1::2])
    print(f"[{spec}:{layer}] {name}: {len(records)} pairs, {len(entries)} passes in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    return path


class Pairs(rp.Pairs):
    """A set's non-tie pairs (labels, length features: ``reader_probe.Pairs``) and the two difference features."""

    def __init__(self, records: list, z) -> None:
        super().__init__(records, None)
        keep = np.array([r.verdict is not None and r.verdict.value in ("A", "B") for r in records])
        self.first = (z["first_ab"] - z["first_ba"])[keep]  # A read first minus B read first
        self.second = (z["second_ba"] - z["second_ab"])[keep]  # A read after B minus B read after A


def main() -> int:
    p = rp.probe_parser(__doc__)
    p.add_argument("--layer", type=int, default=8)
    args = p.parse_args()
    started = time.monotonic()
    named = rp.probe_sets(args.per_source, args.test)
    data = {n: Pairs(recs, np.load(read(args.reader, args.layer, n, recs, args.cache, args.precision)))
            for n, recs in named.items()}
    rows = {f"{'+'.join(groups)} + info{', length-balanced' if balanced else ''}":
            rp.group_probe(data, (*groups, "info"), balanced)
            for balanced in (False, True) for groups in (("first",), ("second",), ("first", "second"))}
    result = rp.probe_result(args, started, rows, f"{args.reader}:{args.layer}", separator=SEPARATOR)
    print(f"wrote {write('cross_probe', result, markdown(result))}")
    return 0


def markdown(result: dict) -> str:
    return rp.group_markdown(result, "Cross-reading probe", "`first`: each answer read after the question (the "
                             "default judge's reading); `second`: each answer read after the question and the other "
                             "answer.")


if __name__ == "__main__":
    sys.exit(main())
