"""`clfjudge audit`: run judges of every kind on every test set and bias probe, write report.md + metrics.json.

Flow: test sets (suites.TEST_SETS, sources absent here are listed as not available) -> records (optionally a
seeded sample of ``limit`` per set) -> each judge's predictions per set (judges.build_judge; cached in
``out/cache``) -> every suite in suites.SUITES -> report.write_report. Judges that are not judge directories
read here too: the released judges' prediction files (``released``) and SemScore (``semscore``).
"""
from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..data.records import PairRecord
from .judges import NotApplicable, Predictions, build_judge
from .suites import SUITES, TEST_SETS, AuditData, TestSet

# Baselines appear beside every table, whatever judges the user names.
BASELINE_JUDGES = ("baseline:longer", "baseline:shorter", "baseline:majority")


def load_sets(set_names: Sequence[str] | None, limit: int | None, seed: int = 0,
              extra: Mapping[str, Sequence[PairRecord]] | None = None,
              set_limits: Mapping[str, int] | None = None):
    """The audit's test sets (and ``extra``: more named pair sets, e.g. a training pool's held-out slices, scored
    with the selection protocol), each a seeded sample of at most ``set_limits[name]`` (else ``limit``) records."""
    from ..data.sources import SOURCES

    sets, records, missing = [], {}, []
    for name, recs in (extra or {}).items():
        sets.append(TestSet(name, "pair", "selection", name))
        records[name] = list(recs)
    for s in TEST_SETS:
        if set_names and s.name not in set_names:
            continue
        source = SOURCES.get(s.name)
        if not source.available():
            missing.append(s.name)
            continue
        recs = source.load(source.path()).records
        cap = (set_limits or {}).get(s.name, limit)
        if cap is not None and len(recs) > cap:
            keep = sorted(random.Random(f"{seed}:{s.name}").sample(range(len(recs)), cap))
            recs = [recs[i] for i in keep]
        sets.append(s)
        records[s.name] = recs
    return sets, records, missing


def _cache_path(out: Path, spec: str, set_name: str) -> Path:
    """One file per (judge, set). A judge directory is keyed by its path and its judge card, so a judge
    re-trained or re-exported in place is predicted again rather than read from a stale cache."""
    key = spec
    directory = Path(spec.partition(":")[2] if spec.startswith("gen:") else spec)
    if (directory / "judge_card.json").is_file():
        key = f"{directory.resolve()}:{(directory / 'judge_card.json').read_text()}"
    slug = hashlib.sha1(key.encode()).hexdigest()[:12]
    return out / "cache" / f"{slug}-{set_name}.json"


def predict_all(judge_specs: Sequence[str], sets, records, out: Path, progress: bool,
                trust_pickle: bool = False) -> tuple[list[str], dict]:
    """judge name -> set -> Predictions or the reason it does not apply. Cached per (judge, set, record ids)."""
    from tqdm.auto import tqdm

    names, preds = [], {}
    bar = tqdm(total=len(judge_specs) * len(sets), desc="audit: predictions", disable=not progress)
    for spec in judge_specs:
        judge = build_judge(spec, trust_pickle=trust_pickle)
        names.append(judge.name)
        preds[judge.name] = {}
        for s in sets:
            ids = [r.id for r in records[s.name]]
            cache = _cache_path(out, spec, s.name)
            if cache.exists() and (cached := json.loads(cache.read_text()))["ids"] == ids:
                result = cached["na"] if "na" in cached else Predictions.from_json(cached["predictions"])
            else:
                try:
                    result = judge.predict(s.name, s.kind, records[s.name])
                    payload = {"predictions": result.to_json()}
                except NotApplicable as why:
                    result = str(why)
                    payload = {"na": result}
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps({"spec": spec, "ids": ids, **payload}))
            preds[judge.name][s.name] = result
            bar.update(1)
    bar.close()
    return names, preds


def run_audit(judges: list[str], out_dir: Path, suites: list[str] | None = None, limit: int | None = None,
              bootstrap: int = 1000, progress: bool = True, sets: list[str] | None = None,
              extra_sets: Mapping[str, Sequence[PairRecord]] | None = None,
              trust_pickle: bool = False, set_limits: Mapping[str, int] | None = None) -> dict[str, Any]:
    from .report import write_report

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen = list(suites or SUITES)
    unknown = sorted(set(chosen) - set(SUITES))
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; known: {sorted(SUITES)}")
    specs = list(dict.fromkeys([*judges, *BASELINE_JUDGES]))
    test_sets, records, missing = load_sets(sets, limit, extra=extra_sets, set_limits=set_limits)
    names, preds = predict_all(specs, test_sets, records, out_dir, progress, trust_pickle)
    data = AuditData(test_sets, records, names, preds, bootstrap)
    metrics = {
        "judges": dict(zip(names, specs)),
        "sets": {s.name: {"kind": s.kind, "protocol": s.protocol, "n": len(records[s.name])} for s in test_sets},
        "sets_not_available": missing, "limit": limit, "set_limits": dict(set_limits or {}), "bootstrap": bootstrap,
        "suites": {name: SUITES[name](data) for name in chosen},
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, default=float) + "\n")
    write_report(metrics, out_dir)
    return metrics
