"""Obvious pairs as a floor: does a judge prefer the right answer when nothing subtle decides?

``research/obvious_pairs.jsonl`` holds 60 hand-written pairs (``question``, ``answer_a``, ``answer_b``, ``winner``
A/B): a wrong fact against the right one, an off-topic answer against an on-topic one, a refusal of a harmless
request against an answer, a fluent wrong calculation against a terse right one, a wrong prime. In half of them the
worse answer is the longer one (``worse_is_longer: true``), in the other half the shorter; the better answer is A
in half of each half. A length rule therefore scores 100% on one half and 0% on the other, and a judge that only
counts words shows it at once. Each judge decides by P(A) against P(B) (a forced choice: a calibrated tie counts
as wrong, and so does an output a generative judge could not parse); the report gives its accuracy on each half and
overall, beside "longer answer wins" and "shorter answer wins", with the difference to longer-answer-wins and its
paired bootstrap CI over all pairs.

    OMP_NUM_THREADS=2 .venv/bin/python research/obvious_pairs.py JUDGE_DIR [JUDGE_DIR ...] [--symmetric]
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, vs_longer_cell, write  # noqa: E402

from clfjudge.data.readers import iter_jsonl  # noqa: E402
from clfjudge.data.records import Loc, PairRecord, Verdict  # noqa: E402
from clfjudge.metrics import longer_answer_wins, paired_difference, shorter_answer_wins  # noqa: E402

PAIRS = Path(__file__).resolve().parent / "obvious_pairs.jsonl"
HALVES = {"worse longer": True, "worse shorter": False}


def load_pairs(path: Path = PAIRS) -> list[PairRecord]:
    """The pairs, checked: a decisive winner, and a ``worse_is_longer`` flag that matches the answers' lengths."""
    records = []
    for line, row in iter_jsonl(path):
        loc = Loc(str(path), line)
        if not isinstance(row, dict):
            raise loc.error(None, f"expected an object, got {type(row).__name__}")
        if row.get("winner") not in ("A", "B"):
            raise loc.error("winner", f"must be A or B, got {row.get('winner')!r}")
        flag = row.get("worse_is_longer")
        if not isinstance(flag, bool):
            raise loc.error("worse_is_longer", f"must be true or false, got {flag!r}")
        record = PairRecord.build(loc, question=row.get("question"), answer_a=row.get("answer_a"),
                                  answer_b=row.get("answer_b"), verdict=row["winner"], id=row.get("id"),
                                  meta={"kind": row.get("kind", ""), "worse_is_longer": flag})
        better, worse = ((record.answer_a, record.answer_b) if record.verdict is Verdict.A
                         else (record.answer_b, record.answer_a))
        if (len(worse) > len(better)) != flag:
            raise loc.error("worse_is_longer", f"is {str(flag).lower()}, but the worse answer has {len(worse)} "
                            f"characters and the better {len(better)}")
        records.append(record)
    return records


def forced_choice(p_a: float, p_b: float) -> Verdict | None:
    """A if P(A) > P(B), B if less; None (counted wrong) for a tie or a NaN (an unparsed generative output)."""
    return Verdict.A if p_a > p_b else Verdict.B if p_b > p_a else None


def judge_verdicts(judge_dir: Path, records: Sequence[PairRecord], symmetric: bool) -> tuple[list, list[float]]:
    from clfjudge import Judge

    judge = Judge.load(judge_dir)
    comparisons = judge.compare_batch(list(records), symmetric=symmetric)
    verdicts = [forced_choice(c.p_a, c.p_b) for c in comparisons]
    p_better = [c.p_a if r.verdict is Verdict.A else c.p_b for c, r in zip(comparisons, records)]
    return verdicts, p_better


def row(name: str, records: Sequence[PairRecord], verdicts: Sequence[Verdict | None],
        p_better: Sequence[float] | None = None) -> dict[str, Any]:
    right = [v == r.verdict for v, r in zip(verdicts, records)]
    out: dict[str, Any] = {"name": name, "right": right, "accuracy": float(np.mean(right))}
    for half, flag in HALVES.items():
        out[half] = float(np.mean([ok for ok, r in zip(right, records) if r.meta["worse_is_longer"] is flag]))
    out["undecided"] = sum(v is None for v in verdicts)
    if p_better is not None:
        out["mean_p_better"] = float(np.nanmean(p_better))
    return out


def markdown(rows: Sequence[dict[str, Any]], pairs: Path, n: int, info: dict[str, Any], symmetric: bool) -> str:
    lines = [
        f"# Obvious pairs ({info['date']})", "",
        f"{n} hand-written pairs (`{pairs.name}`), half with the worse answer longer; forced choice "
        f"by P(A) vs P(B){', both answer orders averaged' if symmetric else ''}. Machine: {info['cpu']}, "
        f"commit {info['commit']}.", "",
        "| judge | worse longer | worse shorter | all | vs longer-answer-wins (all) | undecided | mean P(better) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = f"{r['mean_p_better']:.2f}" if "mean_p_better" in r else "-"
        lines.append(f"| {r['name']} | {100 * r['worse longer']:.1f} | {100 * r['worse shorter']:.1f} | "
                     f"{100 * r['accuracy']:.1f} | {vs_longer_cell(r.get('vs_longer'))} | {r['undecided']} | {p} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("judges", nargs="*", type=Path, help="judge directories (anything Judge.load takes)")
    parser.add_argument("--pairs", type=Path, default=PAIRS)
    parser.add_argument("--symmetric", action="store_true", help="average both answer orders")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="obvious_pairs", help="results file prefix")
    args = parser.parse_args(argv)

    records = load_pairs(args.pairs)
    info = machine(threads=torch.get_num_threads())
    baselines = [row("longer answer wins", records, longer_answer_wins(records)),
                 row("shorter answer wins", records, shorter_answer_wins(records))]
    judged = []
    for judge_dir in args.judges:
        verdicts, p_better = judge_verdicts(judge_dir, records, args.symmetric)
        judged.append(row(str(judge_dir), records, verdicts, p_better))
        judged[-1]["vs_longer"] = paired_difference(judged[-1]["right"], baselines[0]["right"])
    rows = [*baselines, *judged]
    data = {"machine": info, "pairs": str(args.pairs), "n": len(records), "symmetric": args.symmetric,
            "rows": rows}
    path = write(args.name, data, markdown(rows, args.pairs, len(records), info, args.symmetric), results=args.out)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
