"""Distillation: an expensive judge labels a pool of answer pairs once, and a fast student learns its probabilities.

The teacher is any judge ``Judge.load`` opens (a verdict judge, a stacked or fine-tuned judge, a released reward
model) or a file of a judge's predictions (JSONL rows with question, answer_a, answer_b and p_a [, p_b]). It judges
each pool pair in both answer orders, and its P(A) / (P(A) + P(B)) becomes the pair's soft target, appended to a
cache file keyed by the pair's content, so a stopped run resumes and a second student reads no teacher again. The
student is the recipe's head (``STUDENTS``): an embedding judge (``training.embedding``: a frozen reader + a linear
head, the default judge's kind) fitted on the soft targets (``judges.embedding.soft_rows``), or a verdict judge whose
chat model is fine-tuned until its own verdict matches the teacher's (``training.verdict_student``: a LoRA adapter,
merged). The report says how often the student decides as the teacher on pool pairs held out by question, and
scores both on labelled evaluation sets beside longer- and shorter-answer-wins, with paired bootstrap CIs: what the
cheap judge keeps of the expensive one, and what it loses.
"""
from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..batching import DEFAULT_BATCH_SIZE
from ..data.records import PairRecord, Verdict
from ..progress import meter
from ..registry import Registry
from .labels import TEACHER_REWARDS, load_pool, pair_key

TEACHER_LABELS = "teacher_labels.jsonl"  # in the output directory: pair key -> the teacher's P(A)
STUDENT_DIR = "student"
REPORT = "distill_report"  # .json and .md


class PredictionsTeacher:
    """A teacher read from a file of a judge's predictions: JSONL rows with question, answer_a, answer_b and p_a
    (and p_b; default 1 - p_a), matched to pool pairs by content."""

    card = None  # a teacher card says what a verdict student asks (questions, budgets): none here

    def __init__(self, path: str | Path) -> None:
        from ..data.readers import iter_jsonl
        from ..data.records import Loc

        self.path, self.p_a, self.records = Path(path), {}, []
        for line, row in iter_jsonl(self.path):
            loc = Loc(str(self.path), line)
            missing = [k for k in ("question", "answer_a", "answer_b", "p_a") if k not in row]
            if missing:
                raise loc.error(missing[0], "is missing (a predictions row has question, answer_a, answer_b, p_a)")
            p_a, p_b = row["p_a"], row.get("p_b", 1 - row["p_a"] if isinstance(row["p_a"], (int, float)) else None)
            if not all(isinstance(p, (int, float)) and 0 <= p <= 1 for p in (p_a, p_b)) or p_a + p_b == 0:
                raise loc.error("p_a", f"p_a and p_b are probabilities, not both 0; got {p_a!r}, {p_b!r}")
            pair = PairRecord(id=str(row.get("id", f"{self.path.name}:{line}")), question=row["question"],
                              answer_a=row["answer_a"], answer_b=row["answer_b"], verdict=None)
            self.p_a[pair_key(pair)] = p_a / (p_a + p_b)
            self.records.append(pair)

    def describe(self) -> str:
        return f"predictions file {self.path}"

    def label(self, records: Sequence[PairRecord]) -> list[float]:
        missing = [r for r in records if pair_key(r) not in self.p_a]
        if missing:
            raise ValueError(f"{self.path}: no prediction for {len(missing)} pool pairs (first: question "
                             f"{missing[0].question[:60]!r})")
        return [self.p_a[pair_key(r)] for r in records]


class JudgeTeacher:
    """A teacher that is a judge: each pair compared in both answer orders (position-invariant judges once)."""

    def __init__(self, spec: str, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        from ..judges.base import Judge

        self.spec, self.judge = spec, Judge.load(spec, batch_size=batch_size)
        if "compare" not in self.judge.tasks:
            raise ValueError(f"{spec}: a teacher compares answers; this judge can {sorted(self.judge.tasks)}")
        self.card = asdict(self.judge.card)  # a verdict teacher's questions and budgets, for a verdict student

    def describe(self) -> str:
        return f"{self.judge.card.name} judge {self.spec} ({self.judge.card.backbone})"

    def label(self, records: Sequence[PairRecord]) -> list[float]:
        out = []
        for c in self.judge.compare_batch(list(records), symmetric=True):
            total = c.p_a + c.p_b
            out.append(c.p_a / total if c.parsed and total > 0 else math.nan)  # unparsed: no target
        return out


class LabelsTeacher:
    """A teacher read from a label directory (``clfjudge label``): the teacher's P(A) of each pair it labelled,
    computed from its per-answer rewards; no teacher model is loaded."""

    def __init__(self, directory: str | Path) -> None:
        from .labels import LabelSet

        self.labels = LabelSet(directory)
        self.pairs = {row["key"] for row in self.labels.pairs}
        self.card = self.provenance["teacher"].get("card")

    @property
    def provenance(self) -> dict[str, Any]:
        return self.labels.provenance

    def describe(self) -> str:
        t = self.provenance["teacher"]
        return f"labels {self.labels.dir} of the {t['head']} judge on {t['backbone']} (card {t['card_hash']})"

    def label(self, records: Sequence[PairRecord]) -> list[float]:
        out = [self.labels.p_a(r.question, r.answer_a, r.answer_b) for r in records]
        missing = [r for r, p in zip(records, out) if p is None]
        if missing:
            raise ValueError(f"{self.labels.dir}: no label for {len(missing)} pairs (first: question "
                             f"{missing[0].question[:60]!r}); label them with clfjudge label")
        return out

    def rewards(self, record: PairRecord) -> list[float] | None:
        """A pointwise teacher's scaled rewards of the pair's two answers (``LabelSet.rewards``)."""
        return self.labels.rewards(record.question, record.answer_a, record.answer_b)


def open_teacher(spec: str, batch_size: int = DEFAULT_BATCH_SIZE) -> PredictionsTeacher | JudgeTeacher | LabelsTeacher:
    from .labels import is_label_dir

    path = Path(spec)
    if path.is_file() and path.suffix in (".jsonl", ".json"):
        return PredictionsTeacher(path)
    if is_label_dir(path):
        return LabelsTeacher(path)
    return JudgeTeacher(spec, batch_size)


def teacher_targets(teacher, records: Sequence[PairRecord], cache: Path, chunk: int = 64,
                    progress: bool = True) -> dict[str, float]:
    """The teacher's P(A) of every pair, read once: what ``cache`` holds from this teacher is reused (rows are keyed
    by teacher and pair), the rest labelled in chunks and appended to it (a stopped run loses at most one chunk; a
    line it left cut short is dropped)."""
    from .labels import append_rows, read_rows

    if isinstance(teacher, LabelsTeacher):  # its labels are on disk already
        return {pair_key(r): p for r, p in zip(records, teacher.label(records))}
    who = teacher.describe()
    done = {row["key"]: row["p_a"] for row in read_rows(cache, repair=True) if row.get("teacher") == who}
    todo = list({pair_key(r): r for r in records if pair_key(r) not in done}.values())
    # the teacher's readers count answers (and tokens) as they read them; the pairs, per chunk
    with meter("teacher", enabled=progress and bool(todo)) as shown:
        for i in range(0, len(todo), chunk):
            part = todo[i:i + chunk]
            rows = [{"key": pair_key(r), "teacher": who, "p_a": p} for r, p in zip(part, teacher.label(part))]
            append_rows(cache, rows)
            done |= {row["key"]: row["p_a"] for row in rows}
            if shown is not None:
                shown.note(f"{min(i + chunk, len(todo))}/{len(todo)} pairs labelled")
    return done


@dataclass(frozen=True)
class DistillJob:
    """``teacher``: a judge directory / hub id or a predictions file; ``pool``: data specs (labelled or not);
    ``evals``: labelled data specs both judges are scored on; ``holdout``: share of pool questions kept from the
    student to measure its agreement with the teacher; ``recipe``: where the student's recipe came from (errors
    name it)."""

    teacher: str
    pool: tuple[str, ...]
    out_dir: Path
    evals: tuple[str, ...] = ()
    holdout: float = 0.1
    seed: int = 0
    batch_size: int = DEFAULT_BATCH_SIZE
    recipe: str = "student recipe"


class EmbeddingStudent:
    """The default judge's kind as a student: a frozen reader and a linear head fitted on the soft targets."""

    def __init__(self, cfg, teacher_card=None, where: str = "") -> None:
        from .embedding import model_from_config

        self.model = model_from_config(cfg)

    def fit(self, records: Sequence[PairRecord]) -> EmbeddingStudent:
        self.model.fit(records)
        return self

    def p_a(self, records: Sequence[PairRecord]) -> np.ndarray:
        """The student's P(A) / (P(A) + P(B)) of each pair."""
        from ..judges.embedding import PROBA_COLUMNS

        proba = self.model.predict_proba(records)
        col = {v: i for i, v in enumerate(PROBA_COLUMNS)}
        return proba[:, col[Verdict.A]] / (proba[:, col[Verdict.A]] + proba[:, col[Verdict.B]])

    def save(self, directory: Path, training: dict[str, Any]) -> Path:
        return self.model.save(directory, training=training)


# recipe head -> its student: ``(cfg, the teacher's card as a dict or None, recipe name) -> student``, which has
# ``fit(pairs) -> self``, ``p_a(pairs) -> array`` and ``save(directory, training) -> judge directory``
STUDENTS: Registry[Any] = Registry("student")
STUDENTS.register("embedding", EmbeddingStudent)
STUDENTS.register("verdict", "clfjudge.training.verdict_student:VerdictStudent")


def split_by_question(records: Sequence[PairRecord], holdout: float, seed: int
                      ) -> tuple[list[PairRecord], list[PairRecord]]:
    from ..data.splits import group_ids

    groups = group_ids(records)
    names = sorted(set(groups.tolist()))
    random.Random(seed).shuffle(names)
    held = set(names[:round(holdout * len(names))])
    return ([r for r, g in zip(records, groups) if g not in held], [r for r, g in zip(records, groups) if g in held])


def distill(job: DistillJob, cfg) -> dict[str, Any]:
    """Label the pool with the teacher (cached), fit the student on the soft targets, score both; returns the
    report (written beside the student as distill_report.json / .md)."""
    from ..judges.embedding import SOFT_TARGET

    if cfg.head not in STUDENTS:
        raise ValueError(f"the student is an embedding judge (head: embedding, the default judge's kind) or a "
                         f"fine-tuned verdict judge (head: verdict with verdict.lora); the recipe names head "
                         f"{cfg.head!r}")
    start = time.monotonic()
    teacher = open_teacher(job.teacher, job.batch_size)
    student = STUDENTS.get(cfg.head)(cfg, teacher.card, job.recipe)  # refused before anything is labelled or written
    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pool, counts = load_pool(job.pool or tuple(getattr(teacher, "provenance", {}).get("pool", ())), job.seed)
    if isinstance(teacher, LabelsTeacher):  # the pairs it chose, those labelled so far (labelling may go on)
        chosen = [r for r in pool if pair_key(r) in teacher.pairs]
        pool = [r for r in chosen if teacher.labels.p_a(r.question, r.answer_a, r.answer_b) is not None]
        counts["labels"] = {"chosen_pairs": len(chosen), "labelled_pairs": len(pool)}
        print(f"teacher labels: {len(pool)} of the {len(chosen)} chosen pairs are labelled", flush=True)
    targets = teacher_targets(teacher, pool, out / TEACHER_LABELS)
    unlabelled = sum(math.isnan(targets[pair_key(r)]) for r in pool)
    # a pointwise label directory also gives each answer's own reward (a verdict student regresses on it)
    rewards = teacher.rewards if isinstance(teacher, LabelsTeacher) else lambda r: None
    labelled = [replace(r, verdict=Verdict.A if targets[pair_key(r)] >= 0.5 else Verdict.B,
                        meta={**r.meta, SOFT_TARGET: targets[pair_key(r)], TEACHER_REWARDS: rewards(r)})
                for r in pool if not math.isnan(targets[pair_key(r)])]
    train, held = split_by_question(labelled, job.holdout, job.seed)
    if not train:
        raise ValueError("no pool pair left to train the student on (the pool is empty or all held out)")
    student.fit(train)
    report = {"teacher": teacher.describe(), "pool": counts, "pool_pairs": len(pool),
              "teacher_unparsed": unlabelled, "student_train_pairs": len(train), "holdout_pairs": len(held),
              "agreement_holdout": _agreement(student, held) if held else None,
              "evals": {spec: _scored(teacher, student, spec, out) for spec in job.evals}}
    student_dir = student.save(out / STUDENT_DIR, training={
        "distilled_from": {"teacher": teacher.describe(), "pool": counts, "holdout": job.holdout, "seed": job.seed,
                           **({"labels": {k: v for k, v in teacher.provenance.items() if k != "rounds"}}
                              if isinstance(teacher, LabelsTeacher) else {"soft_targets": TEACHER_LABELS})},
        "config": asdict(cfg)})
    report |= {"student": str(student_dir), "wall_time_s": round(time.monotonic() - start, 1)}
    (out / f"{REPORT}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / f"{REPORT}.md").write_text(markdown(report))
    return report


def _agreement(student, held: Sequence[PairRecord]) -> dict[str, Any]:
    """How often the student picks the answer the teacher prefers (held-out questions), and its mean |P - P'|."""
    from ..judges.embedding import SOFT_TARGET

    mine = student.p_a(held)
    theirs = np.array([r.meta[SOFT_TARGET] for r in held])
    return {"pairs": len(held), "decision_agreement": float(np.mean((mine >= 0.5) == (theirs >= 0.5))),
            "mean_abs_diff": float(np.mean(np.abs(mine - theirs)))}


def _scored(teacher, student, spec: str, out: Path) -> dict[str, Any]:
    """Teacher and student on a labelled set (its decisive pairs), beside the length rules, with paired CIs."""
    from ..data import sources
    from ..metrics import paired_difference
    from .verdict import VerdictDataHead

    usable = sources.load_usable(spec, VerdictDataHead().select)
    pairs = [r for r in usable.records if r.verdict in (Verdict.A, Verdict.B)]
    if usable.limit and len(pairs) > usable.limit:
        pairs = random.Random(0).sample(pairs, usable.limit)
    if not pairs:
        raise ValueError(f"{spec}: no labelled decisive pair to score the judges on")
    gold_a = np.array([r.verdict is Verdict.A for r in pairs])
    p_teacher = np.array([teacher_targets(teacher, pairs, out / TEACHER_LABELS, progress=False)[pair_key(r)]
                          for r in pairs])
    right = {"teacher": (p_teacher > 0.5) == gold_a, "student": (student.p_a(pairs) > 0.5) == gold_a}
    la, lb = np.array([len(r.answer_a) for r in pairs]), np.array([len(r.answer_b) for r in pairs])
    longer = np.where(la == lb, 0.5, ((la > lb) == gold_a).astype(float))
    return {"pairs": len(pairs), **{k: 100 * float(np.mean(v)) for k, v in right.items()},
            "longer": 100 * float(longer.mean()), "shorter": 100 * float(1 - longer.mean()),
            "student_vs_teacher": paired_difference(right["student"], right["teacher"]),
            "student_vs_longer": paired_difference(right["student"].astype(float), longer),
            "teacher_vs_longer": paired_difference(right["teacher"].astype(float), longer)}


def markdown(report: dict[str, Any]) -> str:
    def ci(d: dict[str, Any]) -> str:  # metrics.paired_difference: fractions -> points
        return f"{100 * d['estimate']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"

    agree = report["agreement_holdout"]
    lines = [f"# Distillation of {report['teacher']}", "",
             f"Pool: {report['pool_pairs']} pairs ({report['teacher_unparsed']} the teacher gave no probability "
             f"for); the student trained on {report['student_train_pairs']}, "
             f"{report['holdout_pairs']} held out by question.", ""]
    if agree:
        lines += [f"Student-teacher agreement on the held-out pairs: {100 * agree['decision_agreement']:.1f}% of "
                  f"decisions, mean |P(A) difference| {agree['mean_abs_diff']:.3f}.", ""]
    if report["evals"]:
        lines += ["| set | pairs | teacher | student | longer wins | shorter wins | student - teacher [95% CI] | "
                  "student - longer | teacher - longer |", "|---|---|---|---|---|---|---|---|---|"]
        for spec, r in report["evals"].items():
            lines.append(f"| {spec} | {r['pairs']} | {r['teacher']:.1f} | {r['student']:.1f} | {r['longer']:.1f} | "
                         f"{r['shorter']:.1f} | {ci(r['student_vs_teacher'])} | {ci(r['student_vs_longer'])} | "
                         f"{ci(r['teacher_vs_longer'])} |")
    return "\n".join(lines) + "\n"
