"""The main job: data check -> train the default judge -> export it to ONNX behind the parity gate (fp32, int8
and the bf16 runs this machine has gated side by side; the fastest that passed is served) -> audit it beside the
released judges and SemScore -> report.

Each step is one function in ``STEPS`` reading what earlier steps left in ``RunState`` and the run directory;
``run.json`` records every step's wall time and outputs, so a run is self-describing. ``--quick`` swaps in
the CI profile: the same path on a small real slice.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .configs import config_path
from .outputs import write_whole
from .registry import Registry

_log = logging.getLogger(__name__)

DEFAULT_RECIPE = config_path("recipes/main-smollm2.yaml")
# Judges audited beside the trained one: the released judges' prediction files and the reference metric.
REFERENCE_JUDGES = ("released:pandalm-7b", "released:gpt-3.5-turbo", "released:auto-j-13b", "semscore")


@dataclass(frozen=True)
class Profile:
    """How big a run is. ``full`` is the README's main job; ``quick`` is the CI slice of the same path."""

    train_overrides: tuple[str, ...] = ()
    audit_limit: int | None = None
    # (set, cap) where a set needs a smaller sample than audit_limit
    audit_set_limits: tuple[tuple[str, int], ...] = ()
    bootstrap: int = 1000
    parity_records: int | None = None
    parity_overrides: tuple[str, ...] = ()  # clfjudge/configs/parity.yaml thresholds changed for this profile
    providers: tuple[str, ...] = ("openvino-bf16",)  # gated beside onnxruntime where this machine has them
    # the export step's other ExportOptions (beside fallback, the gate's records and thresholds, and providers)
    export: tuple[tuple[str, Any], ...] = (("int8", True),)
    # the audit reads the trained judge instead of its export where the export serves only an fp32 run and the
    # trained judge reads in a lower precision here (a decoder in bf16 beats every fp32 run of it)
    audit_faster_trained: bool = False
    recipe: str | None = None  # the profile's own recipe (package data, configs/recipes/); None: the main job's
    steps: tuple[str, ...] = ("data", "train", "export", "audit")  # what a run of this profile does by default


PROFILES: Registry[Profile] = Registry("run profile")
# The full run audits every set, the big ones as seeded samples, so that `make main` from an empty embedding cache
# stays within 45 minutes on a 2-core machine without AMX (where the default judge reads ~6 answers/s in ONNX fp32)
# and the audit's report still covers every set: PandaLM 600 of 999 pairs, Auto-J 300 of 1,392 (its answers are
# long: 600 pairs are 290k tokens), Prometheus MT-Bench / Vicuna-Bench 160 of 320 answers each, LLMBar whole.
# The scoreboard (docs/results.md) reads every set whole.
# Its parity gate reads 200 records: enough that a lossy run's 99.5% (bf16) or 99% (int8) can tolerate one or two
# flipped decisions; 64 could not resolve either (one flip is 1.6%).
PROFILES.register("full", Profile(audit_limit=600, parity_records=200, audit_set_limits=(
    ("autoj-test", 300), ("prometheus-mtbench", 160), ("prometheus-vicuna", 160))))
PROFILES.register("quick", Profile(
    train_overrides=("max_train_records=160", "max_dev_records=64", "eval_sources=[]", "max_steps=8", "batch_size=8",
                     "eval_every=4", "early_stopping_patience=0", "max_length=256"),
    audit_limit=40, bootstrap=100, parity_records=32,
    # an 8-step judge has near-zero margins, so int8 noise tips some of its 32 decisions: the gate still runs
    # and reports, with looser int8 bounds (the full profile keeps clfjudge/configs/parity.yaml's 99% / 1 point)
    parity_overrides=("int8.min_agreement=0.9", "int8.max_metric_delta=0.1")))
# A chat model's own verdict (Qwen2.5-Coder-1.5B-Instruct asked whether each answer is correct and helpful; a
# verdict judge, judges/verdict.py): right on obvious pairs where the default judge counts words, at about one
# answer a second on 2 cores, so its audit reads 100 pairs of each set (several hours with the released judges'
# files). Its export makes the int8 variant that kept most of a 1.5B's decisions (int8 but for the MLPs' down
# projections, docs/speed.md; a judge with wide margins may pass it) and gates it and OpenVINO bf16 against PyTorch
# fp32; the audit reads the fastest run that passed, or the trained judge in bf16 where only fp32 passed. The int4
# copy (slower than fp32 on a CPU) and the other variants (each a quantization of minutes on a 1.5B, and they
# flipped more of its decisions) are not made.
PROFILES.register("quality", Profile(recipe="recipes/quality-verdict.yaml", audit_limit=100, bootstrap=1000,
                                     export=(("openvino", ("ov-int8-mixed",)), ("int4", False)),
                                     audit_faster_trained=True))


@dataclass
class RunConfig:
    out: Path
    recipe: Path | None = None  # None: the profile's recipe, else the main job's (DEFAULT_RECIPE)
    overrides: Sequence[str] = ()
    profile: str = "full"
    steps: Sequence[str] | None = None  # default: all, in order
    judges: Sequence[str] = REFERENCE_JUDGES


@dataclass
class RunState:
    config: RunConfig
    profile: Profile
    outputs: dict[str, Any] = field(default_factory=dict)  # step name -> what it produced (JSON-able)

    @property
    def recipe(self) -> Path:
        return Path(recipe_of(self.config))

    def path(self, *parts: str) -> Path:
        return self.config.out.joinpath(*parts)


Step = Callable[[RunState], dict[str, Any]]
STEPS: Registry[Step] = Registry("pipeline step")
ORDER = ("data", "train", "export", "audit")


@STEPS.register("data")
def check_data(state: RunState) -> dict[str, Any]:
    """Load every source present under data_root(); fail loudly on malformed files before hours of work."""
    from .data.sources import SOURCES
    from .data.sources.stats import source_stats

    rows = [row.as_dict() for _, source in SOURCES.items() for row in source_stats(source)]
    write_whole(state.path("data_stats.json"), json.dumps(rows, indent=2) + "\n")
    totals = [r for r in rows if r["split"] == "all"]
    return {"file": "data_stats.json", "sources_available": sum(r["available"] for r in totals),
            "sources_missing": [r["source"] for r in totals if not r["available"]],
            "records": sum(r["records"] for r in totals), "excluded": sum(r["excluded"] or 0 for r in totals),
            "excluded_by_source": {r["source"]: r["excluded_by_reason"] for r in totals if r["excluded"]}}


@STEPS.register("train")
def train_judge(state: RunState) -> dict[str, Any]:
    from .card import JudgeCard
    from .training.config import TrainConfig
    from .training.trainer import train

    overrides = [*state.profile.train_overrides, *state.config.overrides, f"output_dir={state.path('judge')}"]
    cfg = TrainConfig.from_yaml(state.recipe, overrides)
    judge_dir = train(cfg)
    card = JudgeCard.load(judge_dir)
    return {"judge_dir": str(judge_dir), "recipe": str(state.recipe), "overrides": overrides,
            "wall_time_s": card.training.get("wall_time_s"), "validation": _headline(card.validation)}


@STEPS.register("export")
def export(state: RunState) -> dict[str, Any]:
    from .export.gate import ParityConfig, served
    from .export.onnx import export_judge
    from .export.options import ExportOptions
    from .models.onnx_session import gate_key, runnable_providers

    def summary(report: dict[str, Any]) -> dict[str, Any]:
        keys = ("max_abs_diff", "agreement", "metric_delta", "on_boundary", "records_per_s", "passed")
        return {name: {k: v[k] for k in keys if k in v} for name, v in report["variants"].items()}

    judge_dir = _needs(state, "train", "judge_dir")
    parity = ParityConfig.load(overrides=state.profile.parity_overrides)
    # Lossy runs (int8, a bf16 provider that runs on this machine) are gated beside fp32; those whose decisions
    # differ are dropped and run.json says why (one export, one gate read); the fastest run that passed is served.
    providers, not_run = runnable_providers(state.profile.providers)
    options = ExportOptions(fallback=True, providers=tuple(providers), n_records=state.profile.parity_records,
                            parity=parity, **dict(state.profile.export))
    result = export_judge(judge_dir, state.path("judge-onnx"), options)
    refused = result.report.get("refused")
    if refused:
        _log.warning("%s", refused["reason"])
        refused = {"reason": refused["reason"], "parity": summary({"variants": refused["variants"]})}
    runs = served(result.report)
    runs["precision"] = result.report["variants"][gate_key(runs["file"], runs["provider"])]["precision"]
    return {"onnx_dir": str(result.out_dir), "primary": result.primary, "served": runs,
            "parity": summary(result.report), "refused": refused,
            "providers": {"gated": providers, "not_run_here": not_run}}


@STEPS.register("audit")
def audit(state: RunState) -> dict[str, Any]:
    from .audit import run_audit

    judge, why = audited_judge(state)
    judges = [judge, *state.config.judges]
    metrics = run_audit(judges, state.path("audit"), limit=state.profile.audit_limit,
                        set_limits=dict(state.profile.audit_set_limits), bootstrap=state.profile.bootstrap)
    return {"report": str(state.path("audit", "report.md")), "metrics": str(state.path("audit", "metrics.json")),
            "judges": judges, "reads": {"judge": judge, "why": why}, "suites": sorted(metrics.get("suites", {}))}


def audited_judge(state: RunState) -> tuple[str, str]:
    """The judge the audit reads, and why: the export where the run has one (the profile's steps), run as it
    serves (the fastest run its gate passed); else the trained judge. With ``audit_faster_trained``, the trained
    judge where the export serves an fp32 run and the trained judge reads in a lower precision on this machine."""
    from .card import JudgeCard
    from .machine import decoder_precision

    if not ("export" in (state.config.steps or state.profile.steps) or "export" in state.outputs):
        return _needs(state, "train", "judge_dir"), "the run has no export"
    onnx_dir, served = _needs(state, "export", "onnx_dir"), state.outputs["export"].get("served") or {}
    exported = ("the export, as it serves" + (f": {served['file']} on {served['provider']} ({served['precision']})"
                                              if "precision" in served else ""))
    if not state.profile.audit_faster_trained or served.get("precision") != "fp32":
        return onnx_dir, exported
    judge_dir = _needs(state, "train", "judge_dir")
    asked = JudgeCard.load(judge_dir).runtime.get("precision")
    if asked is None:
        return onnx_dir, exported
    precision, why = decoder_precision(asked)
    if precision == "fp32":
        return onnx_dir, f"{exported}; the trained judge would read in fp32 too ({why})"
    return judge_dir, (f"the trained judge in {precision} ({why}): the export's gate passed only fp32 runs "
                       f"(served: {served['file']} on {served['provider']})")


def _needs(state: RunState, step: str, key: str) -> Any:
    """An output of an earlier step: from this run, or from run.json of a previous run in the same dir."""
    if step not in state.outputs:
        previous = state.path("run.json")
        if previous.exists():
            state.outputs.update(json.loads(previous.read_text()).get("outputs", {}))
    try:
        return state.outputs[step][key]
    except KeyError:
        raise ValueError(f"step needs the output {key!r} of step {step!r}: run it first "
                         f"(clfjudge run --out {state.config.out} --steps {step})") from None


def _headline(validation: dict[str, Any]) -> dict[str, Any]:
    keep = ("accuracy", "f1", "agreement", "position_consistency", "pearson", "n")
    return {split: {k: v for k, v in m.items() if k in keep} for split, m in validation.items() if isinstance(m, dict)}


@contextlib.contextmanager
def _env_default(name: str, value: str):
    """``name`` set to ``value`` unless the caller set it, for the duration of the block only."""
    if os.environ.get(name):
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def run(config: RunConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    from .embedders.cache import ENV, default_root

    config.out.mkdir(parents=True, exist_ok=True)
    with _env_default(ENV, str(default_root())):  # a re-run reads no answer twice
        return _run(config, log)


def _run(config: RunConfig, log: Callable[[str], None]) -> dict[str, Any]:
    from .machine import describe

    state = RunState(config, PROFILES.get(config.profile))
    names = list(config.steps or state.profile.steps)
    for name in names:
        STEPS.get(name)  # unknown step names fail before any work
    record: dict[str, Any] = {
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "profile": config.profile,
        "machine": describe(), "steps": _previous_steps(state, names), "outputs": state.outputs,
    }
    for i, name in enumerate(names, 1):
        log(f"[clfjudge run] step {i}/{len(names)}: {name}")
        start = time.monotonic()
        try:
            state.outputs[name] = STEPS.get(name)(state)
        except BaseException as e:
            record["steps"][name] = {"wall_time_s": round(time.monotonic() - start, 1),
                                     "failed": f"{type(e).__name__}: {e}"}
            _write_record(state, record)
            resume = resume_command(config, names[i - 1:])
            if not isinstance(e, Exception):  # Ctrl-C: stop as asked, and say how to go on
                log(f"[clfjudge run] {name} interrupted; resume with:\n  {resume}")
                raise
            raise StepFailed(name, resume, e) from e
        record["steps"][name] = {"wall_time_s": round(time.monotonic() - start, 1)}
        _write_record(state, record)
        log(f"[clfjudge run] {name} done in {record['steps'][name]['wall_time_s']} s")
    return record


class StepFailed(RuntimeError):
    """A step of ``clfjudge run`` failed; what earlier steps wrote is kept, and ``resume`` re-runs from it."""

    def __init__(self, step: str, resume: str, cause: BaseException) -> None:
        super().__init__(f"step {step!r} failed ({type(cause).__name__}: {cause}); the earlier steps' outputs are "
                         f"kept; once the cause is fixed, resume with:\n  {resume}")
        self.step, self.resume = step, resume


def recipe_of(config: RunConfig) -> Path:
    """The recipe a run trains: the one given, else its profile's, else the main job's."""
    if config.recipe is not None:
        return Path(config.recipe)
    named = PROFILES.get(config.profile).recipe
    return config_path(named) if named else DEFAULT_RECIPE


def resume_command(config: RunConfig, steps: Sequence[str]) -> str:
    """The ``clfjudge run`` command line that re-runs ``steps`` of ``config`` (later steps reuse run.json)."""
    import shlex

    parts = ["clfjudge", "run", "--out", str(config.out)]
    if config.recipe is not None and Path(config.recipe) != DEFAULT_RECIPE:
        parts += ["--recipe", str(config.recipe)]
    for override in config.overrides:
        parts += ["--set", override]
    if config.profile != "full":
        parts += ["--profile", config.profile]
    parts += ["--steps", *steps]
    if tuple(config.judges) != REFERENCE_JUDGES:
        parts += ["--judges", *config.judges]
    return shlex.join(parts)


def _previous_steps(state: RunState, names: Sequence[str]) -> dict[str, Any]:
    """The timings a previous run in the same directory recorded for the steps this run does not repeat."""
    previous = state.path("run.json")
    if not previous.exists():
        return {}
    steps = json.loads(previous.read_text()).get("steps", {})
    return {name: timing for name, timing in steps.items() if name not in names and "failed" not in timing}


def _write_record(state: RunState, record: dict[str, Any]) -> None:
    write_whole(state.path("run.json"), json.dumps(record, indent=2, default=str) + "\n")
