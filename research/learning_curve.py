"""Does a fast student keep what the slow verdict judge knows? Students on a learning curve of teacher labels.

The teacher: the verdict judge on Qwen2.5-Coder-1.5B (``clfjudge label``'s committed label directory,
``train/labels/verdict-qwen1.5b``: its reward per pool answer). Each student is fitted on the soft targets of n
labelled pool pairs (n = 500, 1k, 2k, 4k, all; nested samples) and scored on what no fit read:

- agreement with the teacher on pool pairs whose question is held out (a stable 20% of questions by content hash,
  so the held-out set only grows as labelling goes on);
- the 60 obvious pairs, split by whether the worse answer is the longer one;
- samples of PandaLM, Auto-J, LLMBar Natural and LLMBar adversarial (Neighbor, GPTInst, GPTOut, Manual) against
  their human labels, beside longer- and shorter-answer-wins — the teacher's readings of them are a label directory
  of their own (``--evals``; ``clfjudge label`` on those sets, never a training pool);

with paired bootstrap CIs against the default judge (the main recipe fitted on its gold pool) and against the teacher.

Students (each is an embedding judge, so ``clfjudge distill --recipe`` trains the same thing from the labels):

- ``a``: the default's kind, SmolLM2 layer 8 + information length, logistic (the main recipe) on the soft targets;
- ``b``: more capacity, still frozen: ``a`` plus SmolLM2's own verdict ("is this answer correct?" log-odds, the whole
  135M read) as a feature (the stacked judge) — the teacher's kind of reading at a tenth of its parameters;
- ``c``: SmolLM2 fine-tuned (a LoRA, merged) so that its own verdict log-odds match the teacher's
  (``train/cpu/student-verdict-lora-smollm2.yaml``, what ``clfjudge distill`` trains with that recipe): a verdict
  judge of its own. Hours of CPU a point, so it runs at ``--c-sizes`` only (default 500 labels); each trained judge is
  kept in the cache (``student-c-N/``) and its readings beside it, so a rerun only scores, and ``speed`` times it.
  ``c@0`` is the same question asked of SmolLM2 before any fitting (the zero-shot verdict).

``fit`` writes ``research/results/learning_curve_DATE.{md,json}``; ``speed`` measures answers/s of the default, each
student and the teacher on the same held-out answers (run it on an idle machine, threads pinned):

    OMP_NUM_THREADS=2 .venv/bin/python research/learning_curve.py fit --labels train/labels/verdict-qwen1.5b \\
        --evals research/results/teacher_evals_qwen1.5b
    OMP_NUM_THREADS=2 .venv/bin/python research/learning_curve.py speed --labels train/labels/verdict-qwen1.5b
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, write  # noqa: E402

from clfjudge.data.records import PairRecord, PointRecord, Verdict  # noqa: E402
from clfjudge.judges.embedding import PROBA_COLUMNS, SOFT_TARGET  # noqa: E402
from clfjudge.metrics import bootstrap_ci, paired_difference  # noqa: E402
from clfjudge.training.labels import LabelSet, answer_key, load_pool, pair_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "clfjudge/configs/recipes/main-smollm2.yaml"
CACHE = RESULTS / "learning_curve" / "cache"  # ignored by git: embeddings and SmolLM2's verdicts
SIZES = (500, 1000, 2000, 4000)
HOLDOUT = 20  # percent of pool questions, by content hash
EVAL_GROUPS = {"obvious": ("research/obvious_pairs.jsonl",), "pandalm": ("pandalm-test",),
               "autoj": ("autoj-test",), "llmbar-natural": ("llmbar-natural",),
               "llmbar-adversarial": ("llmbar-neighbor", "llmbar-gptinst", "llmbar-gptout", "llmbar-manual")}
DEV = ("pandalm", "autoj", "llmbar-natural", "llmbar-adversarial")
STUDENT_VERDICT = {"backbone": "smollm2", "questions": ["correct"]}
STUDENTS = {
    "a": ("default's kind: SmolLM2 L8 + information length, logistic", {}),
    "b": ("a + SmolLM2's own verdict (stacked)", {"features": ["diff", "info_length_diff", "verdict_diff"],
                                                  "verdict": STUDENT_VERDICT}),
    "c": ("SmolLM2 fine-tuned (LoRA, merged) so its own verdict matches the teacher's", None),
}


def shown(path: Path) -> str:
    """A path as the results name it: from the repository root where it is inside."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def threads() -> int:
    return int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count())


def held_out(question: str) -> bool:
    return int(hashlib.blake2b(question.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest(), 16) % 100 \
        < HOLDOUT


# -- data ---------------------------------------------------------------------------------------------------------

def labelled_pairs(labels: LabelSet) -> tuple[list[PairRecord], dict[str, str]]:
    """The chosen pool pairs whose answers are all labelled, with the teacher's P(A) as soft target, and each pair's
    selection (random / uncertain)."""
    selection = {row["key"]: row.get("selection", "random") for row in labels.pairs}
    seed = labels.provenance["rounds"][0].get("seed", 0)
    pool, _ = load_pool(labels.provenance["pool"], seed)
    out, seen = [], set()
    for r in pool:
        key = pair_key(r)
        if key not in selection or key in seen:
            continue
        seen.add(key)
        p = labels.p_a(r.question, r.answer_a, r.answer_b)
        if p is not None:
            out.append(replace(r, verdict=Verdict.A if p >= 0.5 else Verdict.B, meta={**r.meta, SOFT_TARGET: p}))
    return out, selection


def eval_sets(evals: LabelSet) -> dict[str, tuple[list[PairRecord], np.ndarray]]:
    """Each evaluation group's decisive pairs (human label A or B) that the teacher read, with its P(A)."""
    from obvious_pairs import load_pairs

    pool, _ = load_pool(evals.provenance["pool"], evals.provenance["rounds"][0].get("seed", 0))
    gold = {pair_key(r): r.verdict for r in load_pairs()}  # the generic reader leaves their "winner" field aside
    by_source: dict[str, list[PairRecord]] = {}
    for r in pool:
        if r.verdict is None and pair_key(r) in gold:
            r = replace(r, verdict=gold[pair_key(r)])
        if r.verdict in (Verdict.A, Verdict.B) and evals.p_a(r.question, r.answer_a, r.answer_b) is not None:
            by_source.setdefault(r.source, []).append(r)
    out = {}
    for group, names in EVAL_GROUPS.items():
        recs = [r for name in names for src, rs in by_source.items() if src == name or src.endswith(name) for r in rs]
        if recs:
            out[group] = (recs, np.array([evals.p_a(r.question, r.answer_a, r.answer_b) for r in recs]))
    return out


# -- judges -------------------------------------------------------------------------------------------------------

class CachedVerdicts:
    """A stacked judge's verdict reader with its readings kept on disk (one JSON row per answer)."""

    def __init__(self, options: dict, path: Path) -> None:
        self.options, self.path, self.reader = options, path, None
        self.known = {}
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                self.known[row["key"]] = row["log_odds"]

    def log_odds(self, records) -> np.ndarray:
        keys = [answer_key(r.question, r.answer) for r in records]
        todo = {k: r for k, r in zip(keys, records) if k not in self.known}
        if todo:
            if self.reader is None:
                from clfjudge.judges.verdict import reader_from_options

                self.reader = reader_from_options(self.options)
            items = list(todo.items())
            for i in range(0, len(items), 64):
                part = items[i:i + 64]
                values = self.reader.log_odds([r for _, r in part])
                with self.path.open("a") as f:
                    for (k, _), v in zip(part, values):
                        self.known[k] = [float(x) for x in v]
                        f.write(json.dumps({"key": k, "log_odds": self.known[k]}) + "\n")
                print(f"  smollm2 verdicts: {min(i + 64, len(items))}/{len(items)}", flush=True)
        return np.array([self.known[k] for k in keys])


class VerdictStudentC:
    """Student c at n labels: trained once into ``CACHE/student-c-N`` (the judge directory), its P(A) of every pair
    it was asked about kept in ``readings.jsonl`` beside it (keyed by pair)."""

    RECIPE = ROOT / "train/cpu/student-verdict-lora-smollm2.yaml"

    def __init__(self, n: int, teacher_card: dict, fitted_on: str, epochs: float | None = None) -> None:
        self.n, self.teacher_card, self.epochs = n, teacher_card, epochs
        # the pairs it is fitted on name it: a grown label file shuffles other pairs into the first n
        self.dir = CACHE / (f"student-c-{n}-{fitted_on}" if n else "student-c-0")
        self.readings = self.dir / "readings.jsonl"
        self.known: dict[str, float] = {}
        if self.readings.exists():
            self.known = {row["key"]: row["p_a"] for row in map(json.loads, self.readings.open())}
        self._judge = None

    def fit(self, pairs) -> VerdictStudentC:
        from clfjudge.training.config import TrainConfig
        from clfjudge.training.verdict_student import VerdictStudent

        if (self.dir / "judge_card.json").exists() or self.n == 0:
            return self
        cfg = TrainConfig.from_yaml(self.RECIPE)
        if self.epochs is not None:
            cfg = replace(cfg, epochs=self.epochs)
        student = VerdictStudent(cfg, self.teacher_card).fit(pairs[: self.n])
        student.save(self.dir, {"labels": self.n, "recipe": shown(self.RECIPE)})
        print(f"  student c@{self.n}: trained in {student.trained['wall_time_s']} s", flush=True)
        return self

    def judge(self):
        from clfjudge.judges.base import Judge
        from clfjudge.judges.verdict import questions_from, verdict_card

        if self._judge is None:
            if self.n == 0:  # the zero-shot verdict of the same question and token budgets
                read = self.teacher_card.get("truncation") or {}
                card = verdict_card("smollm2", questions_from(["correct"], "--question"), precision="auto",
                                    **{k: int(v) for k, v in read.items() if k.endswith("_tokens")})
                self.dir.mkdir(parents=True, exist_ok=True)
                card.save(self.dir)
            self._judge = Judge.load(self.dir)
        return self._judge

    def p_a(self, pairs) -> np.ndarray:
        from clfjudge.training.labels import pair_key as key

        todo = [r for r in pairs if key(r) not in self.known]
        if todo:
            judge = self.judge()
            with self.readings.open("a") as f:
                for i in range(0, len(todo), 32):
                    part = todo[i:i + 32]
                    for r, p in zip(part, verdict_p_a(judge, part)):
                        self.known[key(r)] = float(p)
                        f.write(json.dumps({"key": key(r), "p_a": float(p)}) + "\n")
                    f.flush()
                    print(f"  student c@{self.n} read {min(i + 32, len(todo))}/{len(todo)} pairs", flush=True)
        return np.array([self.known[key(r)] for r in pairs])


def verdict_p_a(judge, pairs) -> np.ndarray:
    """A verdict judge's sigmoid(r_A - r_B) of each pair: its decision, with no tie model in the way."""
    from scipy.special import expit

    done = judge.compare_batch([{"question": r.question, "answer_a": r.answer_a, "answer_b": r.answer_b}
                                for r in pairs])
    return expit(np.array([c.margin for c in done]))


def config(overrides: dict):
    from clfjudge.training.config import TrainConfig

    cfg = TrainConfig.from_yaml(RECIPE)
    return replace(cfg, embedding=replace(cfg.embedding, **overrides))


def model(overrides: dict, cached: bool = True):
    from clfjudge.training.embedding import model_from_config

    m = model_from_config(config(overrides))
    if cached and overrides.get("verdict"):
        m.read_verdicts_with(CachedVerdicts(overrides["verdict"], CACHE / "smollm2_verdicts.jsonl"))
    return m


def default_judge():
    """The main recipe fitted on its gold pool (what ``make main`` trains)."""
    from clfjudge.training.data import build_splits
    from clfjudge.training.embedding import EmbeddingDataHead

    cfg = config({})
    return model({}).fit(build_splits(cfg, EmbeddingDataHead("pair")).train)


def p_a(judge, pairs) -> np.ndarray:
    proba = judge.predict_proba(pairs)
    col = {v: i for i, v in enumerate(PROBA_COLUMNS)}
    return proba[:, col[Verdict.A]] / (proba[:, col[Verdict.A]] + proba[:, col[Verdict.B]])


# -- scoring ------------------------------------------------------------------------------------------------------

def right(p: np.ndarray, pairs) -> np.ndarray:
    gold_a = np.array([r.verdict is Verdict.A for r in pairs])
    return np.where(p == 0.5, 0.5, ((p > 0.5) == gold_a).astype(float))


def length_rule(pairs) -> np.ndarray:
    """Right (1), wrong (0) or a tie (0.5) for longer-answer-wins."""
    gold_a = np.array([r.verdict is Verdict.A for r in pairs])
    la, lb = np.array([len(r.answer_a) for r in pairs]), np.array([len(r.answer_b) for r in pairs])
    return np.where(la == lb, 0.5, ((la > lb) == gold_a).astype(float))


def dev_mean_diff(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray], n: int = 4000, seed: int = 0) -> dict:
    """The difference of the dev-set means (each set weighs one), with a bootstrap resampling each set within
    itself."""
    rng = np.random.default_rng(seed)
    diffs = {g: ours[g] - theirs[g] for g in ours}
    est = float(np.mean([d.mean() for d in diffs.values()]))
    boots = np.mean([[d[rng.integers(0, len(d), len(d))].mean() for _ in range(n)] for d in diffs.values()], axis=0)
    return {"estimate": est, "low": float(np.quantile(boots, 0.025)), "high": float(np.quantile(boots, 0.975))}


def scores(p_by_group: dict[str, np.ndarray], sets) -> dict[str, np.ndarray]:
    return {g: right(p_by_group[g], sets[g][0]) for g in sets}


def summary(name: str, rights: dict[str, np.ndarray], sets, default: dict, teacher: dict) -> dict:
    dev = [g for g in DEV if g in rights]
    row = {"judge": name, **{g: 100 * float(v.mean()) for g, v in rights.items()},
           "dev_mean": 100 * float(np.mean([rights[g].mean() for g in dev])) if dev else None}
    if "obvious" in rights:
        pairs = sets["obvious"][0]
        worse_longer = np.array([len(r.answer_b if r.verdict is Verdict.A else r.answer_a)
                                 > len(r.answer_a if r.verdict is Verdict.A else r.answer_b) for r in pairs])
        row["obvious_worse_longer"] = 100 * float(rights["obvious"][worse_longer].mean())
        row["obvious_worse_shorter"] = 100 * float(rights["obvious"][~worse_longer].mean())
    for other, theirs in (("default", default), ("teacher", teacher)):
        if theirs is rights or not theirs:
            continue
        if "obvious" in rights:
            row[f"obvious_vs_{other}"] = paired_difference(rights["obvious"], theirs["obvious"], n=4000)
        if dev:
            row[f"dev_vs_{other}"] = dev_mean_diff({g: rights[g] for g in dev}, {g: theirs[g] for g in dev})
    return row


def gain_kept(row: dict, default: dict, teacher: dict, key: str) -> float | None:
    if row.get(key) is None:
        return None
    gain = teacher[key] - default[key]
    return None if abs(gain) < 1e-9 else (row[key] - default[key]) / gain


def agreement(p_student: np.ndarray, p_teacher: np.ndarray) -> dict:
    same = ((p_student >= 0.5) == (p_teacher >= 0.5)).astype(float)
    ci = bootstrap_ci(np.mean, same, n=4000, seed=0).as_dict()
    return {"pairs": len(same), **{k: 100 * v for k, v in ci.items()},
            "mean_abs_diff": float(np.mean(np.abs(p_student - p_teacher)))}


def escalation(student_p: dict[str, np.ndarray], teacher_p: dict[str, np.ndarray], sets, rows: dict,
               shares=(0.0, 0.1, 0.25, 0.5, 1.0)) -> list[dict]:
    """The student decides every pair; the share it is least sure of (|P(A) - 0.5| smallest, per set) is decided by
    the teacher instead. Accuracy at each share, and the gain over the default kept."""
    out = []
    for share in shares:
        mixed = {}
        for g, p in student_p.items():
            k = round(share * len(p))
            order = np.argsort(np.abs(p - 0.5), kind="stable")[:k]
            q = p.copy()
            q[order] = teacher_p[g][order]
            mixed[g] = q
        r = summary(f"escalate {share:.0%}", scores(mixed, sets), sets, {}, {})
        r |= {"share": share, "teacher_answers_read": sum(2 * round(share * len(p)) for p in student_p.values())}
        for key in ("obvious", "dev_mean"):
            r[f"{key}_gain_kept"] = gain_kept(r, rows["default"], rows["teacher"], key)
        out.append(r)
    return out


class Frozen:
    """Students a and b: an embedding judge (``model``) fitted on the soft targets."""

    def __init__(self, overrides: dict) -> None:
        self.model = model(overrides)

    def fit(self, pairs) -> Frozen:
        self.model.fit(pairs)
        return self

    def p_a(self, pairs) -> np.ndarray:
        return p_a(self.model, pairs)


def make_student(name: str, n: int, pool: list[PairRecord], labels: LabelSet, args: argparse.Namespace):
    if name != "c":
        return Frozen(STUDENTS[name][1])
    fitted_on = hashlib.blake2b("\n".join(pair_key(r) for r in pool[:n]).encode(), digest_size=4).hexdigest()
    return VerdictStudentC(n, labels.provenance["teacher"]["card"], fitted_on, args.c_epochs)


# -- commands -----------------------------------------------------------------------------------------------------

def fit(args: argparse.Namespace) -> None:
    os.environ.setdefault("CLFJUDGE_EMBEDDING_CACHE", str(CACHE / "embeddings"))
    CACHE.mkdir(parents=True, exist_ok=True)
    labels = LabelSet(args.labels)
    evals = LabelSet(args.evals) if (args.evals / "provenance.json").exists() else None
    pairs, selection = labelled_pairs(labels)
    held = [r for r in pairs if held_out(r.question)]
    train = [r for r in pairs if not held_out(r.question)]
    sets = eval_sets(evals) if evals else {}
    print(f"{len(pairs)} labelled pairs: {len(train)} to fit, {len(held)} held out; eval sets "
          + ", ".join(f"{g} {len(v[0])}" for g, v in sets.items()), flush=True)
    teacher_p = {g: v[1] for g, v in sets.items()}
    teacher = scores(teacher_p, sets)
    start = time.monotonic()
    default_model = default_judge()
    default = scores({g: p_a(default_model, v[0]) for g, v in sets.items()}, sets)
    rows = {"teacher": summary("teacher", teacher, sets, default, teacher),
            "default": summary("default", default, sets, default, teacher)}
    rows["default"]["agreement"] = agreement(p_a(default_model, held), np.array([r.meta[SOFT_TARGET] for r in held]))
    rows["default"]["fit_s"] = round(time.monotonic() - start, 1)
    base = {"longer": {g: length_rule(v[0]) for g, v in sets.items()}}
    base["shorter"] = {g: 1 - v for g, v in base["longer"].items()}
    for name, r in base.items():
        rows[f"{name} wins"] = summary(f"{name} wins", r, sets, default, teacher)
    curves = []
    by_selection = {sel: [r for r in train if selection[pair_key(r)] == sel] for sel in ("random", "uncertain")}
    for pool in by_selection.values():
        random.Random(0).shuffle(pool)  # nested samples: each size holds the smaller ones
    # every random label, then the uncertain ones: what the actively chosen labels add on top of a random sample
    by_selection["random, then uncertain"] = by_selection["random"] + by_selection["uncertain"]
    for sel, pool in by_selection.items():
        first = len(by_selection["random"]) if sel == "random, then uncertain" else 0
        sizes = [n for n in SIZES if first < n < len(pool)] + ([len(pool)] if len(pool) > first else [])
        for student in args.students:
            if student == "c" and sel != "random":
                continue  # hours a point: the random labels only
            for n in (args.c_sizes if student == "c" else sizes):
                t0 = time.monotonic()
                m = make_student(student, n, pool, labels, args).fit(pool[:n])
                sp = {g: m.p_a(v[0]) for g, v in sets.items()}
                row = summary(f"{student}@{n}", scores(sp, sets), sets, default, teacher)
                row |= {"student": student, "selection": sel, "labels": n, "fit_s": round(time.monotonic() - t0, 1),
                        "agreement": agreement(m.p_a(held), np.array([r.meta[SOFT_TARGET] for r in held]))}
                for key in ("obvious", "dev_mean"):
                    row[f"{key}_gain_kept"] = gain_kept(row, rows["default"], rows["teacher"], key)
                if n == (max(args.c_sizes) if student == "c" else sizes[-1]) and sets:
                    row["escalation"] = escalation(sp, teacher_p, sets, rows)
                curves.append(row)
                print(f"{student} {sel} n={n}: agreement {row['agreement']['estimate']:.1f}, obvious "
                      f"{row.get('obvious', float('nan')):.1f}, dev mean {row['dev_mean'] or float('nan'):.1f}",
                      flush=True)
    data = {"machine": machine(threads()), "labels": shown(args.labels), "evals": shown(args.evals) if evals else None,
            "label_provenance": {k: v for k, v in labels.provenance.items() if k in ("teacher", "pool", "commit")},
            "pairs": len(pairs), "train_pairs": len(train), "held_out_pairs": len(held),
            "eval_pairs": {g: len(v[0]) for g, v in sets.items()}, "students": {k: v[0] for k, v in STUDENTS.items()},
            "reference": rows, "curve": curves}
    print(write("learning_curve", data, markdown(data)))


def kept(row: dict) -> str:
    """The gain-kept cell: obvious pairs / dev mean."""
    return " / ".join("-" if row[k] is None else f"{row[k]:.2f}" for k in ("obvious_gain_kept", "dev_mean_gain_kept"))


def markdown(d: dict) -> str:
    def ci(x: dict | None, scale: float = 100) -> str:
        return "-" if not x else f"{scale * x['estimate']:+.1f} [{scale * x['low']:+.1f}, {scale * x['high']:+.1f}]"

    def pct(v) -> str:
        return "-" if v is None else f"{v:.1f}"

    groups = list(d["eval_pairs"])
    out = [f"# Students on a learning curve of teacher labels ({d['machine']['date'][:10]})", "",
           f"Teacher: {d['label_provenance']['teacher']['backbone']} verdict "
           f"({d['label_provenance']['teacher']['questions'][0]}), labels `{d['labels']}`: {d['pairs']} labelled "
           f"pool pairs, {d['train_pairs']} to fit, {d['held_out_pairs']} held out by question (agreement). "
           f"Evaluation pairs (human labels; the teacher's readings in `{d['evals']}`): "
           + ", ".join(f"{g} {n}" for g, n in d["eval_pairs"].items()) + ".", "",
           f"Machine: {d['machine'].get('cpu', '')} ({', '.join(d['machine'].get('matmul_flags') or [])}), "
           f"{d['machine'].get('threads')} thread(s), commit {d['machine'].get('commit', '')}. Students: "
           + "; ".join(f"**{k}** {v}" for k, v in d["students"].items()) + ".", "",
           "## Reference judges", "",
           "| judge | " + " | ".join(groups) + " | dev mean | obvious worse longer / shorter |",
           "|---|" + "---|" * (len(groups) + 2)]
    for name, r in d["reference"].items():
        out.append(f"| {name} | " + " | ".join(pct(r.get(g)) for g in groups)
                   + f" | {pct(r['dev_mean'])} | {pct(r.get('obvious_worse_longer'))} / "
                   f"{pct(r.get('obvious_worse_shorter'))} |")
    out += ["", f"Default's agreement with the teacher on held-out pool pairs: "
            f"{d['reference']['default']['agreement']['estimate']:.1f}%.", "",
            "## The curve", "",
            "Agreement: the student decides as the teacher on held-out pool pairs [95% CI]. Gain kept: (student − "
            "default) / (teacher − default).", "",
            "| student | selection | labels | agreement | obvious | obvious vs default | obvious vs teacher "
            "| dev mean | dev vs default | dev vs teacher | gain kept obvious / dev |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["curve"]:
        a = r["agreement"]
        out.append(f"| {r['student']} | {r['selection']} | {r['labels']} | {a['estimate']:.1f} [{a['low']:.1f}, "
                   f"{a['high']:.1f}] | {pct(r.get('obvious'))} | {ci(r.get('obvious_vs_default'))} | "
                   f"{ci(r.get('obvious_vs_teacher'))} | {pct(r['dev_mean'])} | {ci(r.get('dev_vs_default'))} | "
                   f"{ci(r.get('dev_vs_teacher'))} | {kept(r)} |")
    out += ["", "Per dev set (student rows):", "", "| student | selection | labels | " + " | ".join(groups) + " |",
            "|---|---|---|" + "---|" * len(groups)]
    for r in d["curve"]:
        out.append(f"| {r['student']} | {r['selection']} | {r['labels']} | "
                   + " | ".join(pct(r.get(g)) for g in groups) + " |")
    for r in d["curve"]:
        if not r.get("escalation"):
            continue
        out += ["", f"Escalation, student {r['student']} ({r['labels']} labels): the share of each set the student is "
                "least sure of is decided by the teacher instead.", "",
                "| share | teacher answers read | " + " | ".join(groups) + " | dev mean | gain kept obvious / dev |",
                "|---|---|" + "---|" * (len(groups) + 2)]
        for e in r["escalation"]:
            out.append(f"| {e['share']:.0%} | {e['teacher_answers_read']} | "
                       + " | ".join(pct(e.get(g)) for g in groups) + f" | {pct(e['dev_mean'])} | {kept(e)} |")
    return "\n".join(out) + "\n"


def speed(args: argparse.Namespace) -> None:
    """Answers/s of each reading on the same held-out answers, caches off, in one run."""
    from clfjudge.judges.base import Judge

    labels = LabelSet(args.labels)
    pairs, _ = labelled_pairs(labels)
    held = [r for r in pairs if held_out(r.question)][: args.pairs]
    answers = [PointRecord(id=str(i), question=r.question, answer=a, score=None)
               for i, r in enumerate(held) for a in (r.answer_a, r.answer_b)]
    rows = {}
    for name, overrides in (("default / student a", {}), ("student b", STUDENTS["b"][1])):
        m = model(overrides, cached=False)  # read, not looked up
        m.fit(held[: max(8, len(held) // 4)])  # a head to predict with; what is timed is the reading
        m.embedder.memory.clear() if hasattr(m.embedder, "memory") else None
        t0 = time.monotonic()
        p_a(m, held)
        took = time.monotonic() - t0
        rows[name] = {"answers": len(answers), "seconds": round(took, 1), "answers_per_s": len(answers) / took}
        print(name, rows[name], flush=True)
    trained_c = sorted(CACHE.glob("student-c-[1-9]*/judge_card.json"), key=lambda p: p.stat().st_mtime)
    if trained_c:
        judge = Judge.load(trained_c[-1].parent)
        t0 = time.monotonic()
        verdict_p_a(judge, held)
        took = time.monotonic() - t0
        rows["student c"] = {"answers": len(answers), "seconds": round(took, 1), "answers_per_s": len(answers) / took}
        print("student c", rows["student c"], flush=True)
    teacher_dir = args.teacher
    if teacher_dir:
        judge = Judge.load(teacher_dir)
        sample = answers[: args.teacher_answers]
        t0 = time.monotonic()
        judge.score_batch(sample)
        took = time.monotonic() - t0
        rows["teacher"] = {"answers": len(sample), "seconds": round(took, 1), "answers_per_s": len(sample) / took}
        print("teacher", rows["teacher"], flush=True)
    data = {"machine": machine(threads()), "threads": os.environ.get("OMP_NUM_THREADS"), "rows": rows}
    lines = [f"# Learning-curve judges: answers/s ({data['machine']['date'][:10]})", "",
             f"Held-out pool answers, read once each (no cache), {data['threads']} threads, machine "
             f"{data['machine'].get('cpu', '')}, commit {data['machine'].get('commit', '')}.", "",
             "| judge | answers | s | answers/s |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['answers']} | {v['seconds']} | {v['answers_per_s']:.2f} |" for k, v in rows.items()]
    print(write("learning_curve_speed", data, "\n".join(lines) + "\n"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit")
    f.add_argument("--labels", type=Path, default=ROOT / "train/labels/verdict-qwen1.5b")
    f.add_argument("--evals", type=Path, default=RESULTS / "teacher_evals_qwen1.5b")
    f.add_argument("--students", nargs="+", default=list(STUDENTS), choices=list(STUDENTS))
    f.add_argument("--c-sizes", type=int, nargs="+", default=[0, 500], help="label counts student c is fitted at "
                   "(0: the zero-shot verdict)")
    f.add_argument("--c-epochs", type=float, default=None, help="student c's epochs (default: its recipe's)")
    s = sub.add_parser("speed")
    s.add_argument("--labels", type=Path, default=ROOT / "train/labels/verdict-qwen1.5b")
    s.add_argument("--pairs", type=int, default=100)
    s.add_argument("--teacher", type=Path, default=ROOT / "runs/verdict-qwen1.5b-teacher")
    s.add_argument("--teacher-answers", type=int, default=24)
    args = p.parse_args()
    {"fit": fit, "speed": speed}[args.command](args)


if __name__ == "__main__":
    main()
