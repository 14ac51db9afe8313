"""`clfjudge audit`: run judges of every kind on every test set and bias probe, write report.md + metrics.json.

Flow: test sets (suites.TEST_SETS, sources absent here are listed as not available) -> records (optionally a
seeded sample of ``limit`` per set) -> each judge's predictions per set (judges.build_judge; cached in
``out/cache``) -> every suite in suites.SUITES -> report.write_report. Judges that are not judge directories
read here too: the released judges' prediction files (``released``) and SemScore (``semscore``).

With ``ray_options`` (``clfjudge audit --engine ray``) the judge directories predict on Ray actors
(``scoring.ray_engine.map_on_actors``: each actor loads the judge once, one test set per call, the very call the
local path makes, so the predictions and the report are the same); the other kinds predict in this process.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.formats import ReadOptions
from ..data.records import LoadResult, PairRecord, exclusion_lines
from ..options import LoadOptions
from ..outputs import discard, write_whole
from .escalation import escalation_curves
from .judges import DirectoryJudge, Predictions, build_judge, check_spec, judge_directory, predict_or_reason
from .suites import SUITES, TEST_SETS, AuditData, TestSet

if TYPE_CHECKING:
    from ..scoring.ray_engine import RayOptions

# Baselines appear beside every table, whatever judges the user names.
BASELINE_JUDGES = ("baseline:longer", "baseline:shorter", "baseline:majority")


def _set_names(set_names: Sequence[str] | None) -> dict[str, int | None]:
    """``--sets`` entries -> name -> N of "name:N" (None: every record), as every command reads a source spec."""
    from ..data.sources import parse_source

    return dict(parse_source(entry) for entry in set_names or ())


def check_sets(set_names: Sequence[str] | None) -> None:
    """Refuse a set name that is neither a test set nor a data spec (a typo would otherwise audit nothing)."""
    from ..data.sources.files import is_data_spec

    known = [s.name for s in TEST_SETS]
    unknown = [n for n in _set_names(set_names) if n not in known and not is_data_spec(n)]
    if unknown:
        raise KeyError(f"unknown test set(s) {unknown}; known: {', '.join(known)}; or a data file, a save_to_disk "
                       "directory or hf:OWNER/NAME[:SPLIT] of your own labelled pairs or ratings")


def user_set(spec: str, options: ReadOptions) -> tuple[TestSet, list, LoadResult]:
    """The user's labelled data as a test set: pairs scored with the selection protocol (beside longer- and
    shorter-answer-wins on the scoreboard), ratings with the grading protocol; and what its load excluded."""
    from ..data.sources import resolve
    from ..training.data import randomize_order

    source = resolve(spec, options)
    protocol = "selection" if source.arity == "pair" else "grading"
    loaded = source.load()
    records = loaded.records
    if source.fixed_order:  # chosen first (TRL): a seeded half swapped, so the answer order gives nothing away
        records, _ = randomize_order(records, seed=0)
    return TestSet(set_slug(spec), source.arity, protocol, spec), records, loaded


def set_slug(spec: str) -> str:
    """A file-name-safe set name for a data spec (cache files and figures are named after their set)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", spec.removeprefix("hf:") if spec.startswith("hf:") else Path(spec).name)


def load_sets(set_names: Sequence[str] | None, limit: int | None, seed: int = 0,
              extra: Mapping[str, Sequence[PairRecord]] | None = None,
              set_limits: Mapping[str, int] | None = None, options: ReadOptions = ReadOptions(),
              accounts: dict[str, dict] | None = None):
    """The audit's test sets (and ``extra``: more named pair sets, e.g. a training pool's held-out slices, scored
    with the selection protocol; data specs among ``set_names``: the user's own sets, read with ``options``), each a
    seeded sample of at most N records ("name:N" in ``set_names``, else ``set_limits[name]``, else ``limit``).
    ``accounts``, when given, is filled with each set's load: records read, excluded by reason, the first
    excluded rows, and the sample drawn."""
    from ..data.sources import SOURCES, sample
    from ..data.sources.files import is_data_spec

    check_sets(set_names)
    named = _set_names(set_names)
    accounts = {} if accounts is None else accounts
    sets, records, missing = [], {}, []

    def add(s: TestSet, recs: list, loaded: LoadResult | None, n: int | None) -> None:
        cap = n if n is not None else (set_limits or {}).get(s.name, limit)
        sets.append(s)
        records[s.name] = sample(recs, cap, s.name, seed)
        if loaded is not None:
            accounts[s.name] = {**loaded.account(), "sampled": len(records[s.name])}

    for name, recs in (extra or {}).items():
        sets.append(TestSet(name, "pair", "selection", name))
        records[name] = list(recs)
    for spec, n in named.items():
        if spec in SOURCES or not is_data_spec(spec):
            continue
        s, recs, loaded = user_set(spec, options)
        if s.name in records:
            raise ValueError(f"--sets: {spec!r} and another set share the name {s.name!r}; rename one file")
        add(s, recs, loaded, n)
    for s in TEST_SETS:
        if named and s.name not in named:
            continue
        source = SOURCES.get(s.name)
        if not source.available():
            missing.append(s.name)
            continue
        loaded = source.load(source.path())
        add(s, loaded.records, loaded, named.get(s.name))
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
                load: LoadOptions = LoadOptions(), ray_options: RayOptions | None = None) -> tuple[list[str], dict]:
    """judge name -> set -> Predictions or the reason it does not apply. Cached per (judge, set, record ids).
    ``load``: how the judge directories load. With ``ray_options``, the judge directories' sets that are not cached
    are predicted on Ray actors."""
    from ..progress import meter, note

    if ray_options is not None and not any(judge_directory(spec) for spec in judge_specs):
        print("--engine ray: none of the judges is a judge directory (only those predict on Ray): every prediction "
              "is made in this process", file=sys.stderr)
    names, preds = [], {}
    total, done = len(judge_specs) * len(sets), 0

    def predicted(judge_name: str, set_name: str) -> None:
        nonlocal done
        done += 1
        note(f"{done}/{total} predictions ({judge_name} on {set_name})")

    # answers are counted as the judges read them (progress.meter), the predictions per judge and set
    with meter("audit: predictions", enabled=progress), contextlib.ExitStack() as stack:
        on_ray = None if ray_options is None else _OnRay(ray_options, load, stack)
        for spec in judge_specs:
            directory = judge_directory(spec) if on_ray is not None else None
            if directory is None:
                judge = build_judge(spec, load)
                name = judge.name
            else:
                from ..judges.base import open_card

                name = DirectoryJudge.display_name(directory, open_card(directory)[1])
            names.append(name)
            preds[name] = {}
            todo = []
            for s in sets:
                cache = _cache_path(out, spec, s.name)
                if cache.exists() and (cached := json.loads(cache.read_text()))["ids"] == _ids(records, s):
                    cached_result = cached["na"] if "na" in cached else Predictions.from_json(cached["predictions"])
                    preds[name][s.name] = cached_result
                    predicted(name, s.name)
                else:
                    preds[name][s.name] = None  # a place in the sets' order, filled below
                    todo.append(s)
            if directory is None:
                results = ((s, predict_or_reason(judge, s.name, s.arity, records[s.name])) for s in todo)
            else:
                results = on_ray.predict(directory, name, todo, records)
            for s, result in results:
                payload = {"na": result} if isinstance(result, str) else {"predictions": result.to_json()}
                cache = _cache_path(out, spec, s.name)
                cache.parent.mkdir(parents=True, exist_ok=True)
                write_whole(cache, json.dumps({"spec": spec, "ids": _ids(records, s), **payload}))
                preds[name][s.name] = result
                predicted(name, s.name)
            missing = [set_name for set_name, result in preds[name].items() if result is None]
            if missing:  # every set has predictions or a reason; an engine that lost one would be a bug
                raise RuntimeError(f"judge {spec}: no predictions came back for {missing}")
    return names, preds


def _ids(records, s: TestSet) -> list[str]:
    return [r.id for r in records[s.name]]


class _OnRay:
    """The judge directories' predictions on Ray actors (``scoring.ray_engine.map_on_actors``): each actor loads
    the judge once, with one thread per CPU it asks for (on CUDA if it asks for GPUs), and makes the call the
    local path makes on a whole test set, the largest sets first. Ray is connected on the first call of the run
    and stays so until ``stack`` closes."""

    def __init__(self, options: RayOptions, load: LoadOptions, stack: contextlib.ExitStack) -> None:
        self.options, self.load, self.stack, self.connected = options, load, stack, False

    def predict(self, directory: Path, name: str, todo: Sequence[TestSet], records) -> Iterator[tuple[TestSet, Any]]:
        from ..scoring import ray_engine

        if not todo:
            return
        if not self.connected:
            self.stack.enter_context(ray_engine.connected(self.options.address))
            self.connected = True
        calls = sorted(todo, key=lambda s: -len(records[s.name]))
        load = {"directory": str(directory), "options": self.load.with_(
            threads=max(1, int(self.options.cpus_per_actor)),
            provider="cuda" if self.options.gpus_per_actor else self.load.provider)}
        for index, result in ray_engine.map_on_actors(DirectoryJudge, load, predict_or_reason,
                                                      [(s.name, s.arity, records[s.name]) for s in calls],
                                                      self.options, f"audit: {name}"):
            yield calls[index], result


def run_audit(judges: list[str], out_dir: Path, suites: list[str] | None = None, limit: int | None = None,
              bootstrap: int = 1000, progress: bool = True, sets: list[str] | None = None,
              extra_sets: Mapping[str, Sequence[PairRecord]] | None = None,
              load: LoadOptions = LoadOptions(), set_limits: Mapping[str, int] | None = None,
              ray_options: RayOptions | None = None, read_options: ReadOptions = ReadOptions(),
              escalate: str | None = None) -> dict[str, Any]:
    """Audit the judges (specs) into ``out_dir``; ``load``: how the judge directories load (``options.LoadOptions``,
    e.g. ``LoadOptions(trust_pickle=True)``); ``ray_options``: predict with the judge directories on Ray
    actors (``scoring.ray_engine.RayOptions``; the ray extra), with the same results as in this process;
    ``read_options``: how the data specs among ``sets`` are read; ``escalate``: a teacher judge directory, for the
    escalation curve of each judge directory among ``judges`` (``audit.escalation``, read in this process)."""
    from .report import write_report

    out_dir = Path(out_dir)
    chosen = list(suites or SUITES)
    unknown = sorted(set(chosen) - set(SUITES))
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; known: {sorted(SUITES)}")
    for spec in judges:  # before any set is loaded or judge predicts
        check_spec(spec)
    fast = [spec for spec in judges if judge_directory(spec) is not None and spec != escalate]
    if escalate is not None:
        if judge_directory(escalate) is None:
            raise FileNotFoundError(f"--escalate {escalate}: no such judge directory")
        if not fast:
            raise ValueError("--escalate: no judge directory among the judges to escalate from")
    check_sets(sets)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = list(dict.fromkeys([*judges, *BASELINE_JUDGES]))
    accounts: dict[str, dict] = {}
    try:
        test_sets, records, missing = load_sets(sets, limit, extra=extra_sets, set_limits=set_limits,
                                                  options=read_options, accounts=accounts)
        for name, account in accounts.items():
            for line in exclusion_lines(f"audit: set {name}", account):
                print(line, file=sys.stderr)
        names, preds = predict_all(specs, test_sets, records, out_dir, progress, load, ray_options)
        curves = None if escalate is None else escalation_curves(
            fast, escalate, test_sets, records, lambda spec, set_name: _cache_path(out_dir, spec,
                                                                                   f"{set_name}.escalation"),
            load, progress)
    except BaseException:
        if created and not any(p.is_file() for p in out_dir.rglob("*")):  # nothing cached: leave no empty --out
            discard(out_dir)
        raise
    data = AuditData(test_sets, records, names, preds, bootstrap)
    metrics = {
        "judges": dict(zip(names, specs)),
        "sets": {s.name: {"arity": s.arity, "protocol": s.protocol, "n": len(records[s.name]),
                          **({"loaded": accounts[s.name]} if s.name in accounts else {})} for s in test_sets},
        "sets_not_available": missing, "limit": limit, "set_limits": dict(set_limits or {}), "bootstrap": bootstrap,
        "suites": {name: SUITES[name](data) for name in chosen},
        **({"escalation": curves} if curves is not None else {}),
    }
    write_whole(out_dir / "metrics.json", json.dumps(metrics, indent=2, default=float) + "\n")
    write_report(metrics, out_dir)
    return metrics
