"""Teacher labels as a dataset: a slow judge reads a pool's answers once, and what it said is kept in a directory that
travels without the teacher (``clfjudge label``; ``clfjudge distill`` trains a student from it).

A label directory holds three files:

- ``provenance.json``: who labelled (the teacher's card and its hash, backbone, precision, questions, calibration),
  on what machine, at which clfjudge commit, from which pool specs, decontaminated against which sets, and each
  selection round (how its pairs were chosen);
- ``pairs.jsonl``: the chosen pairs in the order they were chosen (pair key, the two answers' keys, source, how it
  was selected: ``random`` or ``uncertain`` — where the student named was least sure);
- ``labels.jsonl``: one row per label. A pointwise teacher (a verdict judge asking "is this answer correct?", a
  reward model) labels each **answer** once, keyed by the content hash of its question and text, with every question
  of its card and the tokens it read, so an answer shared by many pairs (AlpacaEval's reference outputs) is read
  once; a pairwise teacher labels each pair (P(A) over both answer orders).

Rows are appended and flushed a few answers at a time, keyed by content: a run stopped anywhere (kill -9 included)
resumes where it stopped, and each key is labelled exactly once; a torn last line is dropped on resume. A directory
belongs to one teacher: another teacher is refused (its labels would be mixed with the first one's).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..batching import DEFAULT_BATCH_SIZE
from ..data.records import PairRecord, PointRecord, Record

PROVENANCE, PAIRS, LABELS = "provenance.json", "pairs.jsonl", "labels.jsonl"
SELECTIONS = ("random", "uncertain")
# a labelled pair's meta key: a pointwise teacher's scaled rewards of its two answers (``LabelSet.rewards``), or None
TEACHER_REWARDS = "teacher_rewards"
FORMAT = 1


def answer_key(question: str, answer: str) -> str:
    """An answer's content under its question: equal texts under any id, pair or file share it."""
    return hashlib.blake2b(f"{question}\0{answer}".encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def pair_key(record: PairRecord) -> str:
    """The pair's content (question and both answers, in order): equal pairs under any id or file share it."""
    text = "\0".join((record.question, record.answer_a, record.answer_b))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def any_pairs(records: Sequence[Record]) -> tuple[list[PairRecord], Counter]:
    """Pool pairs, labelled or not (the teacher labels them)."""
    kept, excluded = [], Counter()
    for r in records:
        if isinstance(r, PairRecord):
            kept.append(r)
        else:
            excluded[f"{r.arity} record (distillation reads pairs)"] += 1
    return kept, excluded


def load_pool(specs: Sequence[str], seed: int) -> tuple[list[PairRecord], dict[str, Any]]:
    from ..data import sources

    pool, counts = [], {}
    for spec in specs:
        usable = sources.load_usable(spec, any_pairs, labelled=False)
        pairs = usable.records
        if usable.limit and len(pairs) > usable.limit:
            pairs = random.Random(seed).sample(pairs, usable.limit)
        pool += pairs
        counts[usable.name] = {"used": len(pairs), "excluded": dict(usable.excluded),
                               "excluded_by_loader": dict(usable.loaded.excluded)}
    return pool, counts


def is_label_dir(path: str | Path) -> bool:
    return (Path(path) / PROVENANCE).is_file()


# -- reading and appending ---------------------------------------------------------------------------------------

def read_rows(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """The JSONL rows of ``path``. A last line cut short (a run killed while writing it) is dropped (and cut from the
    file where ``repair``, so appends stay whole lines); any other bad line is an error naming file and line."""
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    rows, good_end = [], 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            good_end += len(line) + 1
            continue
        last = number == len(lines)  # no newline after it: the write was interrupted
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            if last:
                break
            raise ValueError(f"{path}:{number}: {e} (a label file holds one JSON object a line)") from None
        if last:
            break
        rows.append(row)
        good_end += len(line) + 1
    if repair and good_end < len(data):
        with path.open("r+b") as f:
            f.truncate(good_end)
    return rows


def append_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Append whole lines and make them durable before the next chunk is read."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if not text:
        return
    with path.open("a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


# -- the teacher ------------------------------------------------------------------------------------------------

def card_hash(directory: Path) -> str:
    from ..card import CARD_NAME

    return hashlib.sha256((directory / CARD_NAME).read_bytes()).hexdigest()[:16]


def _commit() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


class Teacher:
    """A judge read for labels: pointwise where it scores answers (per answer, every question of a verdict card),
    else pairwise (P(A) per pair, both answer orders)."""

    def __init__(self, spec: str, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        from ..judges.base import Judge

        self.spec, self.judge = spec, Judge.load(spec, batch_size=batch_size)
        self.pointwise = "score" in self.judge.tasks
        if not self.pointwise and "compare" not in self.judge.tasks:
            raise ValueError(f"{spec}: a teacher scores or compares answers; this judge can "
                             f"{sorted(self.judge.tasks)}")
        reader = getattr(self.judge, "reader", None)
        self.questions = [q.name for q in reader.questions] if hasattr(reader, "questions") else ["score"]

    @functools.cache  # noqa: B019 - one teacher a run: its provenance (a git call, the machine probe) read once
    def provenance(self) -> dict[str, Any]:
        from .. import machine

        card = self.judge.card
        directory = Path(self.spec)
        return {"teacher": {"spec": self.spec, "card_hash": card_hash(directory) if directory.is_dir() else None,
                            "head": card.name, "backbone": card.backbone,
                            "form": "pointwise" if self.pointwise else "pairwise", "questions": self.questions,
                            "calibration": card.calibration, "runtime": self.judge.runtime_choice,
                            "card": json.loads(json.dumps(asdict(card), default=str))},
                "machine": {k: v for k, v in machine.describe().items() if k in ("cpu", "arch", "cores",
                                                                                   "matmul_flags")},
                "commit": _commit()}

    def identity(self) -> dict[str, Any]:
        """What must match for two runs to write into one label directory."""
        t = self.provenance()["teacher"]
        return {k: t[k] for k in ("card_hash", "head", "backbone", "form", "questions")}

    def answers(self, points: Sequence[PointRecord]) -> list[dict[str, Any]]:
        """One label row per answer: its reward under every question, and the tokens its prompt holds."""
        reader = getattr(self.judge, "reader", None)
        if hasattr(reader, "log_odds"):  # a verdict judge: every question of the card
            values = reader.log_odds(points)
        else:
            values = [[s.value] for s in self.judge.score_batch(points)]
        lengths = self.judge.sequence_lengths(points) or [[None]] * len(points)
        return [{"key": answer_key(p.question, p.answer), "reward": dict(zip(self.questions, map(float, v))),
                 "tokens": n[0]} for p, v, n in zip(points, values, lengths)]

    def pairs(self, records: Sequence[PairRecord]) -> list[dict[str, Any]]:
        rows = []
        for r, c in zip(records, self.judge.compare_batch(list(records), symmetric=True)):
            total = c.p_a + c.p_b
            rows.append({"key": pair_key(r), "p_a": c.p_a / total if c.parsed and total > 0 else None})
        return rows


# -- the job ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LabelJob:
    """``pairs``: how many pairs selected by ``select`` the directory should hold after this run (the shortfall is
    chosen now; 0: only finish labelling what is chosen); ``candidates``: how many unchosen pool pairs the student
    reads to pick the uncertain ones from."""

    teacher: str
    pool: tuple[str, ...]
    out_dir: Path
    pairs: int = 0
    select: str = "random"
    student: str | None = None
    against: tuple[str, ...] = ()
    seed: int = 0
    chunk: int = 8
    candidates: int = 2000
    limit_s: float | None = None


def load_job_pool(job: LabelJob) -> tuple[list[PairRecord], dict[str, Any]]:
    """The pool's pairs, decontaminated by question against ``job.against``."""
    from ..data import sources
    from ..data.splits import decontaminate

    pool, counts = load_pool(job.pool, job.seed)
    against = [r for name in job.against for r in sources.load(name).records]
    kept, removed, by_set = decontaminate(pool, against) if against else (pool, 0, {})
    counts["decontaminated"] = {"removed": removed, "by_set": by_set}
    return kept, counts


class LabelSet:
    """A label directory as read: its provenance, chosen pairs and labels."""

    def __init__(self, directory: str | Path, repair: bool = False) -> None:
        self.dir = Path(directory)
        self.provenance = json.loads((self.dir / PROVENANCE).read_text()) if is_label_dir(self.dir) else None
        self.pairs = read_rows(self.dir / PAIRS, repair)
        self.labels = {row["key"]: row for row in read_rows(self.dir / LABELS, repair)}

    @property
    def pointwise(self) -> bool:
        return self.provenance["teacher"]["form"] == "pointwise"

    def p_a(self, question: str, answer_a: str, answer_b: str) -> float | None:
        """The teacher's P(A) / (P(A) + P(B)) of a pair: from the two answers' rewards under the card's first
        question and its calibration scale (pointwise; Davidson's tie weight cancels in this ratio), or as read
        (pairwise); None where a label is missing."""
        if not self.pointwise:
            row = self.labels.get(pair_key(PairRecord(id="", question=question, answer_a=answer_a,
                                                      answer_b=answer_b, verdict=None)))
            return None if row is None else row["p_a"]
        rewards = self.rewards(question, answer_a, answer_b)
        return None if rewards is None else 1 / (1 + math.exp(-(rewards[0] - rewards[1])))

    def rewards(self, question: str, *answers: str) -> list[float] | None:
        """A pointwise teacher's rewards of ``answers`` under its card's first question, times its calibration's
        scale (so that P(A) = sigmoid(r_A - r_B)); None where one is not labelled or the teacher is pairwise."""
        if not self.pointwise:
            return None
        first = self.provenance["teacher"]["questions"][0]
        rows = [self.labels.get(answer_key(question, a)) for a in answers]
        if any(r is None for r in rows):
            return None
        scale = float((self.provenance["teacher"].get("calibration") or {}).get("scale", 1.0))
        return [scale * r["reward"][first] for r in rows]

    def labelled_pairs(self) -> list[tuple[PairRecord, float]]:
        """The chosen pairs that have a label, read from the pools (and seeds) their selection rounds name, each with
        the teacher's P(A), in the order they were chosen."""
        rounds = self.provenance.get("rounds") or [{}]
        pools = dict.fromkeys((tuple(r.get("pool") or self.provenance["pool"]), r.get("seed", 0)) for r in rounds)
        by_key = {pair_key(r): r for specs, seed in pools for r in load_pool(specs, seed)[0]}
        out = []
        for row in self.pairs:
            record = by_key.get(row["key"])
            p_a = None if record is None else self.p_a(record.question, record.answer_a, record.answer_b)
            if p_a is not None:
                out.append((record, p_a))
        return out


def _choose(job: LabelJob, pool: Sequence[PairRecord], chosen: set[str], have: int,
            log: Callable[[str], None]) -> list[PairRecord]:

    todo = max(0, job.pairs - have)
    free = list({pair_key(r): r for r in pool if pair_key(r) not in chosen}.values())
    if not todo or not free:
        return []
    rng = random.Random(f"{job.seed}:{job.select}:{have}")
    rng.shuffle(free)
    if job.select == "random":
        return free[:todo]
    if not job.student:
        raise ValueError("--select uncertain needs --student JUDGE_DIR (the judge whose least certain pairs are "
                         "labelled)")
    from ..judges.base import Judge

    candidates = free[:max(todo, job.candidates)]
    log(f"label: the student {job.student} reads {len(candidates)} candidate pairs")
    student = Judge.load(job.student)
    results = student.compare_batch(candidates, symmetric=True)
    certainty = [abs(c.p_a / (c.p_a + c.p_b) - 0.5) if c.p_a + c.p_b > 0 else 0.0 for c in results]
    order = sorted(range(len(candidates)), key=certainty.__getitem__)
    return [candidates[i] for i in order[:todo]]


def _by_question(records: Sequence[PairRecord], chunk: int) -> list[list[PairRecord]]:
    """Chunks of about ``chunk`` pairs, a question's pairs kept together (their answers share the prompt's
    question: read once)."""
    groups: dict[str, list[PairRecord]] = {}
    for r in records:
        groups.setdefault(r.question, []).append(r)
    out, current = [], []
    for members in groups.values():
        if current and len(current) + len(members) > chunk:
            out.append(current)
            current = []
        current += members
    return out + ([current] if current else [])


def label(job: LabelJob, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Choose pairs (``job.select``) and label every answer (or pair) of the chosen ones not yet labelled; returns
    what this run did."""

    if job.select not in SELECTIONS:
        raise ValueError(f"--select is one of {', '.join(SELECTIONS)}, got {job.select!r}")
    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    have = LabelSet(out, repair=True)
    teacher = Teacher(job.teacher, batch_size=job.chunk)
    if have.provenance is not None:
        before = {k: have.provenance["teacher"].get(k) for k in teacher.identity()}
        if before != teacher.identity():
            raise ValueError(f"{out / PROVENANCE}: these labels come from another teacher ({before['backbone']}, card "
                             f"{before['card_hash']}); {job.teacher} is {teacher.identity()['backbone']}, card "
                             f"{teacher.identity()['card_hash']}: label into another directory")
    pool, counts = load_job_pool(job)
    provenance = have.provenance or {"format": FORMAT, **teacher.provenance(), "pool": list(job.pool),
                                     "decontaminated_against": list(job.against), "rounds": []}
    chosen = {row["key"] for row in have.pairs}
    already = sum(row.get("selection") == job.select for row in have.pairs)
    new = _choose(job, pool, chosen, already, log)
    if new:
        provenance["rounds"].append({"selection": job.select, "pairs": len(new), "student": job.student,
                                     "seed": job.seed, "pool": list(job.pool), "pool_counts": counts,
                                     "commit": teacher.provenance()["commit"]})
        append_rows(out / PAIRS, ({"key": pair_key(r), "a": answer_key(r.question, r.answer_a),
                                   "b": answer_key(r.question, r.answer_b), "source": r.source,
                                   "selection": job.select, "round": len(provenance["rounds"])} for r in new))
    (out / PROVENANCE).write_text(json.dumps(provenance, indent=2, default=str) + "\n")

    plan = {row["key"] for row in read_rows(out / PAIRS)}
    by_key = {pair_key(r): r for r in pool}
    missing = plan - set(by_key)
    if missing:
        raise ValueError(f"{out / PAIRS}: {len(missing)} chosen pairs are not in the pool {list(job.pool)} (the "
                         "pool must be the one they were chosen from: see provenance.json)")
    ordered = [by_key[row["key"]] for row in read_rows(out / PAIRS)]
    return _label_plan(teacher, ordered, out, have.labels, job, log)


def _label_plan(teacher: Teacher, ordered: Sequence[PairRecord], out: Path, done: dict[str, Any], job: LabelJob,
                log: Callable[[str], None]) -> dict[str, Any]:

    if teacher.pointwise:
        todo_answers = {answer_key(r.question, a) for r in ordered for a in (r.answer_a, r.answer_b)} - set(done)
        total = len(todo_answers)
    else:
        total = len({pair_key(r) for r in ordered} - set(done))
    start, labelled, tokens = time.monotonic(), 0, 0
    log(f"label: {total} {'answers' if teacher.pointwise else 'pairs'} to label ({len(done)} labelled before)")
    for chunk in _by_question(ordered, job.chunk):
        if job.limit_s is not None and time.monotonic() - start > job.limit_s:
            log(f"label: stopped after {job.limit_s:.0f} s (--limit-s); run again to go on")
            break
        if teacher.pointwise:
            points = list({answer_key(r.question, a): PointRecord(id=f"{r.id}:{side}", question=r.question, answer=a,
                                                                  score=None, meta=r.meta)
                           for r in chunk for side, a in (("a", r.answer_a), ("b", r.answer_b))
                           if answer_key(r.question, a) not in done}.values())
            rows = teacher.answers(points) if points else []
        else:
            todo = [r for r in chunk if pair_key(r) not in done]
            rows = teacher.pairs(todo) if todo else []
        append_rows(out / LABELS, rows)
        for row in rows:
            done[row["key"]] = row
        labelled += len(rows)
        tokens += sum(row.get("tokens") or 0 for row in rows)
        if rows:
            took = time.monotonic() - start
            log(f"label: {labelled}/{total} {'answers' if teacher.pointwise else 'pairs'} ({labelled / took:.2f}/s, "
                f"{tokens / took:.0f} prompt tokens/s, {took:.0f} s)")
    return {"labelled": labelled, "total": total, "seconds": round(time.monotonic() - start, 1),
            "prompt_tokens": tokens, "directory": str(out)}
