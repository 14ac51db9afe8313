"""The escalation curve of ``clfjudge audit JUDGE --escalate TEACHER``: each fast judge directory among the judges
decides every pair of a set, the least sure share of them (``scoring.escalation``: by |P(A) - P(B)|) goes to the
teacher, and the curve is the accuracy against that share (``SHARES``), with what each point costs to read.

Each judge reads every pair of the set once, timed (the teacher's 100% point needs all of them anyway); a point's
teacher time is the teacher's measured time on the set scaled to the pairs it reads there (an estimate: a pair's
time is taken as the set's mean). Readings are cached beside the audit's predictions (``cache``: judge spec, set ->
file), with their seconds as measured then.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..data.records import PairRecord, Verdict
from ..metrics import evaluate_pairs
from ..options import LoadOptions
from ..outputs import write_whole
from ..scoring.escalation import confidence, least_sure, share_count

SHARES = (0.0, 0.1, 0.25, 0.5, 1.0)
Readings = dict[str, Any]  # p_a, p_b, verdict (lists aligned with the set's records), seconds


def read(judge, records: Sequence[PairRecord]) -> Readings:
    """One judge's P(A), P(B) and verdict of every pair (one answer order, as the fast judge decides a scored pair),
    and the wall time it took."""
    start = time.perf_counter()
    results = judge.compare_batch(records)
    seconds = time.perf_counter() - start
    return {"p_a": [c.p_a if c.parsed else None for c in results],
            "p_b": [c.p_b if c.parsed else None for c in results],
            "verdict": [None if c.verdict is None else c.verdict.value for c in results], "seconds": seconds}


def curve(records: Sequence[PairRecord], fast: Readings, teacher: Readings,
          shares: Sequence[float] = SHARES) -> list[dict[str, Any]]:
    """Per share: the pairs the teacher decides, the accuracy of the decisions against the gold verdicts (an
    unparsed output counts wrong), their agreement with the teacher's, and the seconds of each reader."""
    n = len(records)
    conf = [confidence(a, b) for a, b in zip(fast["p_a"], fast["p_b"])]
    teacher_verdicts = [None if v is None else Verdict(v) for v in teacher["verdict"]]
    points = []
    for share in shares:
        sent = set(least_sure(conf, share_count(share, n)))
        verdicts = [teacher_verdicts[i] if i in sent else None if v is None else Verdict(v)
                    for i, v in enumerate(fast["verdict"])]
        accuracy = evaluate_pairs(records, verdicts, failures="count_wrong")["accuracy"]
        teacher_seconds = teacher["seconds"] * len(sent) / n if n else 0.0
        points.append({"share": share, "teacher_pairs": len(sent), "pairs": n, "accuracy": accuracy,
                       "agreement_with_teacher": sum(v is t for v, t in zip(verdicts, teacher_verdicts)) / n,
                       "judge_seconds": fast["seconds"], "teacher_seconds": teacher_seconds,
                       "seconds": fast["seconds"] + teacher_seconds})
    return points


def escalation_curves(fast_specs: Sequence[str], teacher: str, sets, records, cache: Callable[[str, str], Path],
                      load: LoadOptions = LoadOptions(), progress: bool = True) -> dict[str, Any]:
    """The curve of each fast judge directory on each pair set (``sets``: the audit's ``TestSet``s), the judges
    loaded with ``load``."""
    from tqdm.auto import tqdm

    from ..judges.base import Judge

    pair_sets = [s for s in sets if s.arity == "pair" and records[s.name]]
    loaded: dict[str, Any] = {}

    def readings(spec: str, set_name: str) -> Readings:
        path = cache(spec, set_name)
        ids = [r.id for r in records[set_name]]
        if path.exists() and (cached := json.loads(path.read_text()))["ids"] == ids:
            return cached["readings"]
        if spec not in loaded:
            loaded[spec] = Judge.load(spec, load)
        result = read(loaded[spec], records[set_name])
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps({"spec": spec, "ids": ids, "readings": result}))
        return result

    judges: dict[str, dict[str, Any]] = {}
    bar = tqdm(total=len(fast_specs) * len(pair_sets), desc="audit: escalation", disable=not progress)
    for spec in fast_specs:
        judges[spec] = {}
        for s in pair_sets:
            judges[spec][s.name] = curve(records[s.name], readings(spec, s.name), readings(teacher, s.name))
            bar.update(1)
    bar.close()
    return {"teacher": teacher, "shares": list(SHARES), "judges": judges}

