"""Escalation (scoring/escalation.py): a fast judge whose confidence is a known function of the answers' lengths, a
teacher whose rule is known (the shorter answer wins), so which pairs go to the teacher, what their rows say, the
share kept over chunks, the calibrated threshold and its bound, resuming and the refusals can all be checked."""
from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from clfjudge.card import JudgeCard
from clfjudge.cli import main
from clfjudge.judges.base import DEFAULT_BATCH_SIZE, Budget, Judge, LoadOptions
from clfjudge.kinds import JudgeKind, registered_kind
from clfjudge.models.heads import PairOutputs
from clfjudge.scoring.escalation import (
    ShareRule,
    ThresholdRule,
    calibrate_threshold,
    clopper_pearson_lower,
    confidence,
    least_sure,
)

LOADS = {"fast": 0, "teacher": 0}


class RuleJudge(Judge):
    """``longer``: P(A) = sigmoid((len(a) - len(b)) / 4), so it is surest where the lengths differ most;
    ``shorter``: the shorter answer wins with P = 0.9 (equal lengths: 0.5). Pointwise, an answer scores its length
    (``longer``) or minus it (a label directory of the teacher holds these per answer)."""

    backend_name = "toy-rule"
    position_invariant = True

    def __init__(self, card: JudgeCard, budget: Budget | int = DEFAULT_BATCH_SIZE) -> None:
        super().__init__(card, ("compare", "score"), budget)  # scores too: pointwise escalation is refused
        self.rule = card.runtime["rule"]

    def raw_outputs(self, records):
        return np.array([[len(r.answer_a) - len(r.answer_b) if r.arity == "pair" else len(r.answer)] for r in records],
                        dtype=np.float64)

    def point_scores(self, raw: np.ndarray) -> np.ndarray:  # the answer's length, or minus it
        return raw[:, 0] if self.rule == "longer" else -raw[:, 0]

    def pair_outputs(self, raw: np.ndarray) -> PairOutputs:
        diff = raw[:, 0]
        p_a = 1 / (1 + np.exp(-diff / 4)) if self.rule == "longer" else np.where(diff < 0, 0.9, np.where(
            diff > 0, 0.1, 0.5))
        return PairOutputs(p_a=p_a, p_tie=np.zeros_like(p_a), p_b=1 - p_a)


def load_rule(directory: Path, card: JudgeCard, options: LoadOptions) -> Judge:
    LOADS["fast" if card.runtime["rule"] == "longer" else "teacher"] += 1
    return RuleJudge(card, options.budget)


@pytest.fixture()
def judges(tmp_path):
    """(fast judge directory, teacher directory), their kind registered for the test."""
    dirs = []
    for name, rule in (("fast", "longer"), ("teacher", "shorter")):
        (tmp_path / name).mkdir()
        JudgeCard(kind="toy-rule", arity="pair", backbone="none", scheme="none", max_length=0,
                  runtime={"backend": "toy-rule", "rule": rule}).save(tmp_path / name)
        dirs.append(tmp_path / name)
    LOADS.update(fast=0, teacher=0)
    with registered_kind("toy-rule", JudgeKind(loaders={"toy-rule": load_rule})):
        yield tuple(dirs)


# length differences of answer_a - answer_b, pair by pair: the fast judge's confidence grows with |diff|
DIFFS = [9, -1, 5, 2, -7, 0, 3, -12]


def pairs_file(path: Path, diffs=DIFFS) -> Path:
    rows = [{"id": f"p{i}", "question": f"Question {i}?", "answer_a": "x" * (20 + d), "answer_b": "x" * 20}
            for i, d in enumerate(diffs)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def score(fast: Path, src: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["score", str(fast), "--input", str(src), "--output", str(out), *map(str, extra)])
    return code, stdout.getvalue(), stderr.getvalue()


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- the rules ------------------------------------------------------------------------------------------------

def test_confidence_and_the_least_sure():
    assert confidence(0.8, 0.1) == pytest.approx(0.7) and math.isnan(confidence(None, None))
    assert least_sure([0.5, 0.1, math.nan, 0.1, 0.9], 3) == [1, 2, 3]  # no confidence first, equal in order
    # a share is kept over the run: floor(F * scored) after every chunk
    rule = ShareRule(0.25)
    assert [len(rule.pick([0.5] * 3, done)) for done in (0, 3, 6)] == [0, 1, 1]
    assert ThresholdRule(0.3).pick([0.2, 0.3, math.nan, 0.5], 0) == [0, 2]


def test_the_threshold_is_fixed_sequence_testing_with_a_clopper_pearson_bound():
    rng = np.random.default_rng(0)
    conf = rng.uniform(size=1000)
    agrees = rng.uniform(size=1000) < 0.6 + 0.4 * conf  # the surer, the more often it agrees
    got = calibrate_threshold(conf, agrees, target=0.9, delta=0.1)

    def lower(k: int, n: int) -> float:  # one-sided exact bound at level 0.9, by scipy's own binomial test
        return stats.binomtest(k, n, alternative="greater").proportion_ci(confidence_level=0.9, method="exact").low

    order = np.sort(conf)[::-1]
    fewest = next(n for n in range(1, 200) if lower(n, n) >= 0.9)  # 22: fewer cannot pass even all agreeing
    want = None
    for size in sorted({max(fewest, math.ceil(step * 1000 / 20)) for step in range(1, 21)}):
        t = order[size - 1]
        kept = conf >= t
        if lower(int(agrees[kept].sum()), int(kept.sum())) < 0.9:
            break
        want = t
    assert fewest == 22 and calibrate_threshold(conf[:200], agrees[:200], 0.9).steps[0]["kept"] == 22
    assert want is not None and got.threshold == want and len(got.steps) > 2
    kept = conf >= want
    assert got.bound == pytest.approx(lower(int(agrees[kept].sum()), int(kept.sum())))
    assert got.bound >= 0.9 and got.expected_share == pytest.approx(np.mean(conf < want))
    assert not got.steps[-1]["passed"] and all(s["passed"] for s in got.steps[:-1])
    assert clopper_pearson_lower(0, 10, 0.1) == 0.0
    nothing = calibrate_threshold(conf, np.zeros(1000, bool), target=0.5)
    assert nothing.threshold == math.inf and nothing.bound is None and nothing.expected_share == 1.0


# -- clfjudge score --escalate ---------------------------------------------------------------------------------

def test_the_least_sure_share_goes_to_the_teacher_and_its_rows_say_so(judges, tmp_path):
    fast, teacher = judges
    src, out = pairs_file(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    code, stdout, _ = score(fast, src, out, "--escalate", teacher, "--escalate-share", 0.25, "--chunk-size", 3)
    assert code == 0
    got = rows(out)
    # chunks p0-p2, p3-p5, p6-p7: floor(0.25 * 3) = 0, floor(0.25 * 6) = 1, floor(0.25 * 8) = 2 in all:
    # the least sure of chunk 2 is p5 (diff 0), of chunk 3 p6 (diff 3, against 12)
    assert [r["id"] for r in got if r["decided_by"] == "teacher"] == ["p5", "p6"]
    p6 = got[6]
    assert p6["p_a"] == pytest.approx(0.1) and p6["verdict"] == "B"  # the teacher's: the shorter answer wins
    assert p6["judge"]["p_a"] == pytest.approx(1 / (1 + math.exp(-3 / 4))) and p6["judge"]["verdict"] == "A"
    assert p6["confidence"] == pytest.approx(abs(2 * p6["judge"]["p_a"] - 1))
    p0 = got[0]
    assert p0["decided_by"] == "judge" and p0["p_a"] == p0["judge"]["p_a"] == pytest.approx(1 / (1 + math.exp(-9 / 4)))
    assert "decided by the teacher 2" in stdout and "decided 2 of 8 pairs (25.0%" in stdout
    assert LOADS["teacher"] == 1


def test_the_teacher_is_not_loaded_when_nothing_goes_to_it(judges, tmp_path):
    fast, teacher = judges
    src, out = pairs_file(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    assert score(fast, src, out, "--escalate", teacher, "--escalate-share", 0.1, "--chunk-size", 3)[0] == 0
    assert LOADS["teacher"] == 0 and all(r["decided_by"] == "judge" for r in rows(out))  # floor(0.1 * 8) = 0
    assert score(fast, src, out, "--escalate", teacher, "--escalate-share", 1)[0] == 0
    assert all(r["decided_by"] == "teacher" for r in rows(out)) and LOADS["teacher"] == 1


CAL_DIFFS = [d * s for d in range(1, 41) for s in (1, -1)]


def calibration_file(path: Path) -> Path:
    """The teacher's predictions on held-out pairs: it agrees with the fast judge exactly where |diff| >= 5."""
    path.write_text("".join(json.dumps({"question": f"Q{i}?", "answer_a": "x" * (50 + d), "answer_b": "x" * 50,
                                        "p_a": (0.9 if d > 0 else 0.1) if abs(d) >= 5 else (0.1 if d > 0 else 0.9)})
                            + "\n" for i, d in enumerate(CAL_DIFFS)))
    return path


def test_the_calibrated_threshold_sends_the_pairs_below_it(judges, tmp_path):
    fast, teacher = judges
    diffs = CAL_DIFFS
    cal = calibration_file(tmp_path / "teacher_predictions.jsonl")
    src, out = pairs_file(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    code, _, stderr = score(fast, src, out, "--escalate", teacher, "--escalate-agreement", 0.9,
                            "--escalate-calibration", cal, "--chunk-size", 3)
    assert code == 0
    conf = np.array([abs(2 / (1 + math.exp(-d / 4)) - 1) for d in diffs])
    want = calibrate_threshold(conf, np.abs(diffs) >= 5, 0.9, 0.1)
    assert want.bound is not None and 0 < want.expected_share < 1
    assert f"threshold {want.threshold:.4g}" in stderr and f"lower bound {100 * want.bound:.1f}%" in stderr
    sent = {r["id"] for r in rows(out) if r["decided_by"] == "teacher"}
    assert sent == {f"p{i}" for i, d in enumerate(DIFFS) if abs(2 / (1 + math.exp(-d / 4)) - 1) < want.threshold}
    assert sent and len(sent) < len(DIFFS)


def test_a_label_directory_calibrates(judges, tmp_path):
    fast, teacher = judges
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"question": f"Q{i}?", "answer_a": "x" * (30 + d), "answer_b": "x" * 30})
                            + "\n" for i, d in enumerate(d for d in range(-20, 21) if d)))
    labels = tmp_path / "labels"
    assert main(["label", str(teacher), "--pool", str(pool), "--out", str(labels), "--pairs", "40"]) == 0
    from clfjudge.scoring.escalation import calibration_pairs

    records, p_a = calibration_pairs(str(labels))
    assert len(records) == 40 and all((p < 0.5) == (len(r.answer_a) > len(r.answer_b)) for r, p in zip(records, p_a))
    # the teacher disagrees with the fast judge on every unequal pair: no threshold keeps 0.5
    src, out = pairs_file(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    code, _, stderr = score(fast, src, out, "--escalate", teacher, "--escalate-agreement", 0.5,
                            "--escalate-calibration", labels)
    assert code == 0 and "every pair goes to the teacher" in stderr
    assert all(r["decided_by"] == "teacher" for r in rows(out))


def interrupted(monkeypatch, run, rule: str, nth: int, size: int | None = None) -> None:
    """``run()`` stopped by the ``nth`` call of the ``rule`` judge (of ``size`` pairs, if given) failing."""
    original, calls = RuleJudge.raw_outputs, [0]

    def failing(self, records):
        if self.rule == rule and size in (None, len(records)):
            calls[0] += 1
            if calls[0] == nth:
                raise RuntimeError("the machine went away")
        return original(self, records)

    monkeypatch.setattr(RuleJudge, "raw_outputs", failing)
    code, _, stderr = run()  # a judge that fails mid-run: exit 3 naming it, the checkpoint kept
    assert code == 3 and "went away" in stderr
    monkeypatch.setattr(RuleJudge, "raw_outputs", original)


def test_resume_escalates_each_pair_exactly_once(judges, tmp_path, monkeypatch):
    fast, teacher = judges
    src = pairs_file(tmp_path / "in.jsonl", DIFFS * 3)
    whole = tmp_path / "whole.jsonl"
    args = ("--escalate", teacher, "--escalate-share", 0.3, "--chunk-size", 4)
    code, summary, _ = score(fast, src, whole, *args)
    assert code == 0
    out = tmp_path / "out.jsonl"
    # the teacher's third call fails (1: its self-test, 2: the first chunk that sends pairs, 3: the next)
    interrupted(monkeypatch, lambda: score(fast, src, out, *args), "shorter", 3)
    progress = json.loads((tmp_path / "out.jsonl.progress.json").read_text())
    assert 0 < progress["line"] < 24 and progress["tally"]["escalated"] > 0
    code, resumed, _ = score(fast, src, out, *args, "--resume")
    assert code == 0 and out.read_bytes() == whole.read_bytes()
    assert resumed == summary.replace(str(whole), str(out))  # the counts, escalated ones too, span both runs
    assert sum(r["decided_by"] == "teacher" for r in rows(out)) == math.floor(0.3 * 24)
    # a resumed run asks for the same escalation
    interrupted(monkeypatch, lambda: score(fast, src, out, *args), "shorter", 3)
    code, _, stderr = score(fast, src, out, "--escalate", teacher, "--escalate-share", 0.5, "--chunk-size", 4,
                            "--resume")
    assert code == 2 and "escalate was" in stderr


def test_a_calibrated_run_resumes_with_the_same_threshold(judges, tmp_path, monkeypatch):
    fast, teacher = judges
    cal = calibration_file(tmp_path / "cal.jsonl")
    src, whole, out = pairs_file(tmp_path / "in.jsonl", DIFFS * 2), tmp_path / "whole.jsonl", tmp_path / "out.jsonl"
    args = ("--escalate", teacher, "--escalate-agreement", 0.9, "--escalate-calibration", cal, "--chunk-size", 4)
    assert score(fast, src, whole, *args)[0] == 0
    interrupted(monkeypatch, lambda: score(fast, src, out, *args), "longer", 3, size=4)  # the third chunk
    assert json.loads((tmp_path / "out.jsonl.progress.json").read_text())["line"] == 8
    assert score(fast, src, out, *args, "--resume")[0] == 0 and out.read_bytes() == whole.read_bytes()
    assert 0 < sum(r["decided_by"] == "teacher" for r in rows(out)) < 16


def test_a_pair_the_teacher_cannot_take_keeps_the_judges_decision(judges, tmp_path, monkeypatch):
    fast, teacher = judges
    original = RuleJudge.raw_outputs

    def picky(self, records):
        if self.rule == "shorter" and any(r.id == "p5" for r in records):
            raise ValueError("cannot encode p5")
        return original(self, records)

    monkeypatch.setattr(RuleJudge, "raw_outputs", picky)
    src, out = pairs_file(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    assert score(fast, src, out, "--escalate", teacher, "--escalate-share", 0.25, "--chunk-size", 3)[0] == 0
    got = {r["id"]: r for r in rows(out)}
    assert got["p5"]["decided_by"] == "judge" and "cannot encode p5" in got["p5"]["teacher_error"]
    assert got["p6"]["decided_by"] == "teacher"


@pytest.mark.parametrize("extra, message", [
    (("--escalate-share", "1.5"), "--escalate-share must be in [0, 1], got 1.5"),
    (("--escalate-share", "-0.1"), "--escalate-share must be in [0, 1], got -0.1"),
    ((), "--escalate takes --escalate-share F or --escalate-agreement A"),
    (("--escalate-share", "0.1", "--escalate-agreement", "0.9"), "--escalate takes --escalate-share F or"),
    (("--escalate-agreement", "0.9"), "--escalate-agreement needs --escalate-calibration"),
    (("--escalate-agreement", "1.2", "--escalate-calibration", "x"), "--escalate-agreement must be in (0, 1]"),
    (("--escalate-agreement", "0.9", "--escalate-calibration", "nowhere.jsonl"), "nowhere.jsonl: no such file"),
    (("--escalate-share", "0.1", "--escalate-delta", "0"), "--escalate-delta must be in (0, 1)"),
    (("--escalate-share", "0.1", "--task", "score"), "--escalate applies to pairs (compare)"),
    (("--escalate-share", "0.1", "--engine", "ray"), "--escalate applies to --engine local"),
])
def test_bad_escalation_options_are_one_line_errors(judges, tmp_path, extra, message):
    fast, teacher = judges
    src, out = pairs_file(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    code, _, stderr = score(fast, src, out, "--escalate", teacher, *extra)
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_a_missing_teacher_or_an_option_without_escalate_is_refused(judges, tmp_path):
    fast, _ = judges
    src, out = pairs_file(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    code, _, stderr = score(fast, src, out, "--escalate", tmp_path / "no-teacher", "--escalate-share", 0.1)
    assert code == 2 and f"--escalate {tmp_path / 'no-teacher'}: no such judge directory" in stderr
    code, _, stderr = score(fast, src, out, "--escalate-share", 0.1)
    assert code == 2 and "--escalate-share applies with --escalate TEACHER" in stderr
    assert not out.exists()


def test_the_escalator_as_a_function(judges):
    from clfjudge.data.records import PairRecord
    from clfjudge.scoring.escalation import EscalationSpec

    fast, teacher = judges
    judge = Judge.load(fast)
    spec = EscalationSpec(str(teacher), share=0.5)
    escalator = spec.escalator(judge, "compare", symmetric=False, load=LoadOptions())
    chunk = [(i + 1, PairRecord(id=f"r{i}", question="Q?", answer_a="x" * (10 + d), answer_b="x" * 10, verdict=None))
             for i, d in enumerate([4, -1, 8, 2])]
    got, errors, sent = escalator.score(judge, chunk, "test", done=0)
    assert not errors and sent == 2
    assert [row["decided_by"] for _, row in got] == ["judge", "teacher", "judge", "teacher"]
    assert [row["p_a"] for _, row in got][1] == pytest.approx(0.9)  # -1: A is shorter, the teacher says A


# -- clfjudge audit --escalate ---------------------------------------------------------------------------------

def test_the_audit_draws_the_escalation_curve_with_its_reading_cost(judges, tmp_path):
    fast, teacher = judges
    diffs = [d for d in range(-20, 21) if d]  # gold: the shorter answer wins, as the teacher says; the fast
    gold = tmp_path / "gold.jsonl"            # judge (longer wins) is wrong on every pair
    gold.write_text("".join(json.dumps({"id": f"g{i}", "question": f"Q{i}?", "answer_a": "x" * (30 + d),
                                        "answer_b": "x" * 30, "verdict": "B" if d > 0 else "A"}) + "\n"
                            for i, d in enumerate(diffs)))
    out = tmp_path / "audit"
    assert main(["audit", str(fast), "--escalate", str(teacher), "--sets", str(gold), "--out", str(out),
                 "--suites", "cross-scheme", "--bootstrap", "0"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    (points,) = metrics["escalation"]["judges"][str(fast)].values()
    assert [p["share"] for p in points] == [0.0, 0.1, 0.25, 0.5, 1.0]
    assert [p["teacher_pairs"] for p in points] == [0, 4, 10, 20, 40]
    assert [p["accuracy"] for p in points] == pytest.approx([0.0, 0.1, 0.25, 0.5, 1.0])
    assert points[0]["teacher_seconds"] == 0 and points[-1]["teacher_seconds"] > 0
    assert all(p["judge_seconds"] > 0 for p in points)
    report = (out / "report.md").read_text()
    assert "## Escalation" in report and "| 25% | 10 | 25.0 |" in report
    LOADS.update(fast=0, teacher=0)  # a second audit reads its cached readings: neither judge reads again
    assert main(["audit", str(fast), "--escalate", str(teacher), "--sets", str(gold), "--out", str(out),
                 "--suites", "cross-scheme", "--bootstrap", "0"]) == 0
    assert LOADS["teacher"] == 0
    assert main(["audit", str(fast), "--escalate", str(tmp_path / "nobody"), "--sets", str(gold), "--out",
                 str(tmp_path / "audit2")]) == 2


def test_an_output_over_the_teachers_or_the_calibrations_files_is_refused(judges, tmp_path):
    fast, teacher = judges
    src = pairs_file(tmp_path / "in.jsonl")
    cal = tmp_path / "cal.jsonl"
    cal.write_text(json.dumps({"question": "Q?", "answer_a": "aa", "answer_b": "a", "p_a": 0.2}) + "\n")
    code, _, stderr = score(fast, src, teacher / "judge_card.json", "--escalate", teacher, "--escalate-share", 0.5)
    assert code == 2 and "a file of the --escalate judge" in stderr
    code, _, stderr = score(fast, src, cal, "--escalate", teacher, "--escalate-agreement", 0.9,
                            "--escalate-calibration", cal)
    assert code == 2 and "--escalate-calibration" in stderr and len(stderr.strip().splitlines()) == 1
    assert json.loads(cal.read_text())["p_a"] == 0.2
