"""docs/extending.md, recipe by recipe: each test registers a toy source, head, trainer, judge kind (its loader,
trainer and exporter), runtime, audit judge adapter or audit suite as the doc says and uses it end to end at the
smallest scale.

The toy modules are written out below, each under the heading of its recipe. Registries are process-global, so a
test registers for its own duration: ``REGISTRY.override(name, item)`` (the ``override`` fixture) where the doc says
``REGISTRY.register(name, item)``, ``kinds.registered_kind(name, kind)`` where it says ``register_kind(name, kind)``,
``runtimes.registered_runtime(name, runtime)`` where it says ``register_runtime(name, runtime)``, and
``monkeypatch.setitem`` for the plain dict ``SUITES``.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from clfjudge.audit import run_audit
from clfjudge.audit.judges import AUDIT_JUDGES, AuditJudge, NotApplicable, Predictions
from clfjudge.audit.suites import SUITES, AuditData, Table
from clfjudge.card import JudgeCard
from clfjudge.cli import main
from clfjudge.data.readers import iter_jsonl
from clfjudge.data.records import LoadResult, Loc, PairRecord, RecordError, Verdict
from clfjudge.data.sources import SOURCES, Source
from clfjudge.data.sources.common import Collector, Fields
from clfjudge.export.directory import ExportResult
from clfjudge.export.options import ExportOptions
from clfjudge.judges.base import DEFAULT_BATCH_SIZE, Budget, Judge, LoadOptions, loads
from clfjudge.kinds import EXPORTERS, KINDS, LOADERS, TRAINERS, JudgeKind, register_kind, registered_kind
from clfjudge.models.heads import HEADS, Head, PairOutputs, _mean_over_items, _pair_metrics
from clfjudge.runtimes import PROVIDERS, Provider, Runtime, fact, register_runtime, registered_runtime
from clfjudge.training.config import TrainConfig
from clfjudge.training.data import build_splits

FIXTURES = Path(__file__).parent / "fixtures" / "data"


# -- recipe 1: a source (a module in clfjudge/sources/ + SOURCES.register + a line in its _MODULES) ---------

TOY_SOURCE = "toy-pairs"
_WINNER = {"a": Verdict.A, "b": Verdict.B, "tie": Verdict.TIE}


def load_toy(path: Path) -> LoadResult:
    """JSONL of {"q", "a", "b", "winner": "a" | "b" | "tie"}; lines marked "flagged" are excluded (counted)."""
    out = Collector(TOY_SOURCE)
    for line, obj in iter_jsonl(path):
        f = Fields(obj, Loc(str(path), line))
        if f.has("flagged"):
            out.exclude("flagged by an annotator")
            continue
        out.pair(f.loc, id=f"{TOY_SOURCE}:{line}", question=f.text("q"), answer_a=f.text("a"),
                 answer_b=f.text("b"), verdict=f.choice("winner", _WINNER))
    return out.result()


TOY = Source(name=TOY_SOURCE, arity="pair", role="train", default_path="toy/pairs.jsonl", loader=load_toy)


def write_toy_data(root: Path) -> Path:
    """16 pairs on 16 questions (the longer answer always wins), 2 of them ties, plus one flagged line."""
    rows = [{"q": f"Question {i}?", "a": "long answer " * (1 + i % 3), "b": "short", "winner": "a"}
            if i % 2 else {"q": f"Question {i}?", "a": "short", "b": "long answer " * (1 + i % 3), "winner": "b"}
            for i in range(14)]
    rows += [{"q": f"Question {i}?", "a": "same", "b": "same", "winner": "tie"} for i in (14, 15)]
    rows.append({"q": "Question 16?", "a": "x", "b": "y", "winner": "a", "flagged": True})
    path = root / TOY.default_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture()
def toy_source(tmp_path, monkeypatch, override):
    """The toy source registered (as ``SOURCES.register(TOY_SOURCE, TOY)``) over a data root holding its file."""
    write_toy_data(tmp_path / "data")
    monkeypatch.setenv("CLFJUDGE_DATA", str(tmp_path / "data"))
    return override(SOURCES, TOY_SOURCE, TOY)


def test_a_source_loads_through_the_registry_data_stats_and_build_splits(toy_source, capsys):
    from clfjudge.data import sources

    result = sources.load(TOY_SOURCE)
    assert len(result.records) == 16 and result.excluded == {"flagged by an annotator": 1}
    assert {r.source for r in result.records} == {TOY_SOURCE}

    assert main(["data", "stats", "--source", TOY_SOURCE, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["records"], row["ties"], row["excluded"], row["available"]) == (16, 2, 1, True)

    cfg = TrainConfig(sources=[TOY_SOURCE], dev_fraction=0.25)
    splits = build_splits(cfg, HEADS.get("cls3")())
    assert splits.counts["train"] + splits.counts["dev"] == 16
    assert splits.sources["train"][TOY_SOURCE]["excluded_by_loader"] == {"flagged by an annotator": 1}


def test_a_bad_toy_line_is_an_error_naming_file_line_and_field(toy_source, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": "Q?", "a": "x", "b": "y", "winner": "a"}\n{"q": "Q2?", "a": "x", "b": "y", "winner": 2}\n')
    with pytest.raises(RecordError, match=r"bad\.jsonl:2: field 'winner': must be one of"):
        toy_source.load(bad)


# -- recipe 2: a head (models/heads.py: @HEADS.register; CALIBRATORS if calibrated) ------------------------

class BinaryHead(Head):
    """Pairwise, two classes (A better / B better): ties are neither learned nor predicted."""

    name, arity, num_labels = "binary", "pair", 2
    problem_type, scheme_suffix, best_metric = "single_label_classification", "pair", "accuracy"

    def _unusable(self, record):
        tie = isinstance(record, PairRecord) and record.verdict is Verdict.TIE
        return "tie (binary head needs a winner)" if tie else super()._unusable(record)

    def label(self, record: PairRecord) -> int:
        return 0 if record.verdict is Verdict.A else 1

    def loss(self, outputs, labels, num_items_in_batch=None):
        import torch.nn.functional as F

        per = F.cross_entropy(outputs["logits"].view(-1, 2).float(), labels.view(-1), reduction="none")
        return _mean_over_items(per, num_items_in_batch)

    def outputs(self, logits: np.ndarray) -> PairOutputs:
        z = np.asarray(logits, dtype=np.float64).reshape(-1, 2)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        return PairOutputs(p_a=p[:, 0], p_tie=np.zeros(len(p)), p_b=p[:, 1])

    def evaluate(self, outputs, records, swapped=None):
        return _pair_metrics(outputs, records, swapped)

    def id2label(self) -> dict[int, str]:
        return {0: "A", 1: "B"}

    def card_fields(self):
        return {"label_map": {"0": "A", "1": "B"}, "score_scale": None, "calibration": {}}


def test_a_head_trains_on_a_tiny_backbone_and_its_judge_loads_and_compares(toy_source, tiny_bert_dir, tmp_path,
                                                                           override):
    from clfjudge.training.trainer import train

    override(HEADS, "binary", BinaryHead)
    cfg = TrainConfig.from_dict({
        "backbone": str(tiny_bert_dir), "head": "binary", "sources": [TOY_SOURCE], "max_length": 128,
        "dev_fraction": 0.3, "batch_size": 4, "max_steps": 1, "logging_steps": 1, "early_stopping_patience": 0,
        "output_dir": str(tmp_path / "judge")})
    out = train(cfg)
    card = JudgeCard.load(out)
    assert (card.head, card.scheme, card.label_map) == ("binary", "encoder-pair", {"0": "A", "1": "B"})
    assert card.training["sources"]["train"][TOY_SOURCE]["excluded_for_head"] == {
        "tie (binary head needs a winner)": 2}
    assert 0.0 <= card.validation["dev"]["accuracy"] <= 1.0

    judge = Judge.load(out)  # the fine-tuned kind (a head in HEADS) on torch: the head says what it can do
    assert judge.backend_name == "torch" and judge.tasks == {"compare"}
    (c,) = judge.compare_batch([{"question": "Q?", "answer_a": "long answer", "answer_b": "short"}])
    assert c.p_tie == 0.0 and c.p_a + c.p_b == pytest.approx(1.0) and c.verdict in (Verdict.A, Verdict.B)


# -- recipe 3: a trainer (kinds.py: register_kind(name, JudgeKind(trainer="module:function"))) --------------

def train_longer(cfg: TrainConfig) -> Path:
    """``head: toy-longer``: no network; how often the longer answer wins the training split's decisive pairs."""
    splits = build_splits(cfg, HEADS.get("cls3")())  # the records a pair head learns from: labelled pairs
    decisive = [r for r in splits.train if r.verdict is not Verdict.TIE]
    wins = sum((len(r.answer_a) > len(r.answer_b)) == (r.verdict is Verdict.A) for r in decisive)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    JudgeCard(kind="toy-longer", arity="pair", backbone="none", scheme="none", max_length=0,
              training={"sources": splits.sources, "split": splits.counts},
              runtime={"backend": "toy-longer", "p_longer": wins / max(len(decisive), 1)}).save(out)
    return out


def test_a_trainer_is_dispatched_by_train_for_its_head_name(toy_source, tmp_path):
    from clfjudge.training.trainer import train

    settings = {"head": "toy-longer", "sources": [TOY_SOURCE], "dev_fraction": 0.25, "output_dir": str(tmp_path)}
    with pytest.raises(KeyError, match="unknown head 'toy-longer'"):
        TrainConfig.from_dict(settings)  # not registered yet: refused when the config is read
    with registered_kind("toy-longer", JudgeKind(trainer=f"{__name__}:train_longer")):
        out = train(TrainConfig.from_dict(settings))
    card = JudgeCard.load(out)
    assert card.kind == "toy-longer" and card.runtime["p_longer"] == 1.0  # the longer answer always wins here
    assert card.training["split"]["train"] + card.training["split"]["dev"] == 16


# -- recipe 4: a judge kind's loader (judges/: a Judge subclass, a loader; JudgeKind(loaders=...)) ----------

class LongerJudge(Judge):
    """Compares answers by length alone: the longer wins with the card's ``p_longer``, equal lengths tie."""

    backend_name = "toy-longer"
    position_invariant = True

    def __init__(self, card: JudgeCard, budget: Budget | int = DEFAULT_BATCH_SIZE) -> None:
        super().__init__(card, ("compare",), budget)
        self.p_longer = float(card.runtime["p_longer"])

    def raw_outputs(self, records):
        return np.array([[np.sign(len(r.answer_a) - len(r.answer_b))] for r in records], dtype=np.float64)

    def pair_outputs(self, raw: np.ndarray) -> PairOutputs:
        sign = raw[:, 0]
        p_a = np.where(sign > 0, self.p_longer, np.where(sign < 0, 1.0 - self.p_longer, 0.0))
        p_tie = (sign == 0).astype(np.float64)
        return PairOutputs(p_a=p_a, p_tie=p_tie, p_b=1.0 - p_a - p_tie)


@loads()  # runs in this process on the CPU, keeps no readings
def load_longer(directory: Path, card: JudgeCard, options: LoadOptions) -> Judge:
    return LongerJudge(card, options.budget)


def test_a_judge_kind_is_loaded_by_judge_load_and_compares_and_serves(tmp_path):
    from starlette.testclient import TestClient

    from clfjudge.serving.server import create_app

    JudgeCard(kind="toy-longer", arity="pair", backbone="none", scheme="none", max_length=0,
              runtime={"backend": "toy-longer", "p_longer": 0.8}).save(tmp_path)
    with pytest.raises(ValueError, match="field 'kind': 'toy-longer' is no registered judge kind"):
        Judge.load(tmp_path)  # not registered yet: the card names a kind nobody loads
    with registered_kind("toy-longer", JudgeKind(loaders={"toy-longer": load_longer})):
        judge = Judge.load(tmp_path, backend="toy-longer")
        assert isinstance(judge, LongerJudge) and judge.card.kind == "toy-longer"
        results = judge.compare_batch([{"question": "Q?", "answer_a": "a longer answer", "answer_b": "short"},
                                       {"question": "Q?", "answer_a": "short", "answer_b": "a longer answer"},
                                       {"question": "Q?", "answer_a": "same", "answer_b": "same"}])
        assert [c.verdict for c in results] == [Verdict.A, Verdict.B, Verdict.TIE]
        assert results[0].p_a == pytest.approx(0.8) and results[1].p_b == pytest.approx(0.8)
        with TestClient(create_app(judge)) as client:
            got = client.post("/compare", json={"question": "Q?", "answer_a": "a longer answer", "answer_b": "short"})
            assert got.status_code == 200 and got.json()["verdict"] == "A"
        assert isinstance(Judge.load(tmp_path), type(judge))  # backend="auto" reads the card's runtime.backend
    assert ("toy-longer", "toy-longer") not in LOADERS  # the block undid the registration


# -- recipe 4b: a whole judge kind, registered once (clfjudge/kinds.py: register_kind) -------------------------

def export_longer(judge_dir: Path, out_dir: Path, options: ExportOptions) -> ExportResult:
    """``clfjudge export`` of a toy-longer judge: it has no network to convert, so its export is its card, marked
    as exported; the options that do not apply to it are refused, as every kind refuses them."""
    options.refuse({name: "a toy-longer judge has no network to quantize" for name in ("int8", "int4", "optimize")},
                   f"{judge_dir}: a toy-longer judge")
    card = JudgeCard.load(judge_dir)
    card.runtime = {**card.runtime, "exported_from": str(judge_dir)}
    Path(out_dir).mkdir(parents=True)
    card.save(out_dir)
    return ExportResult(out_dir=Path(out_dir), primary="judge_card.json", report={"variants": {}})


@pytest.fixture()
def toy_kind():
    """The toy-longer kind, as ``register_kind("toy-longer", JudgeKind(...))`` in clfjudge/kinds.py registers it."""
    kind = JudgeKind(loaders={"toy-longer": f"{__name__}:load_longer"}, trainer=f"{__name__}:train_longer",
                     exporter=f"{__name__}:export_longer")
    with registered_kind("toy-longer", kind):
        yield kind
    assert all("toy-longer" not in r for r in (KINDS, TRAINERS, EXPORTERS))  # undone when the test ends


def test_a_judge_kind_registered_once_is_trainable_loadable_and_exportable(toy_source, toy_kind, tmp_path):
    from clfjudge.export.onnx import export_judge
    from clfjudge.training.trainer import train

    kind = toy_kind

    judge_dir = train(TrainConfig.from_dict({"head": "toy-longer", "sources": [TOY_SOURCE], "dev_fraction": 0.25,
                                             "output_dir": str(tmp_path / "judge")}))
    judge = Judge.load(judge_dir)  # the card names the backend the kind registered
    assert isinstance(judge, LongerJudge) and judge.p_longer == 1.0
    (c,) = judge.compare_batch([{"question": "Q?", "answer_a": "a longer answer", "answer_b": "short"}])
    assert c.verdict is Verdict.A
    exported = export_judge(judge_dir, tmp_path / "exported")
    again = Judge.load(exported.out_dir)
    assert isinstance(again, LongerJudge) and again.card.runtime["exported_from"] == str(judge_dir)
    with pytest.raises(ValueError, match=r"a toy-longer judge cannot honour --int8 \(int8=True\): a toy-longer "
                                         "judge has no network to quantize"):
        export_judge(judge_dir, tmp_path / "int8", int8=True)
    with pytest.raises(ValueError, match="judge kind 'toy-longer', judge loader 'toy-longer/toy-longer', trainer "
                                         "'toy-longer', exporter 'toy-longer' is registered already"):
        register_kind("toy-longer", kind)  # one registration per kind
    assert KINDS.get("toy-longer") is kind


# -- recipe 4c: a runtime (a session module + one register_runtime in clfjudge/runtimes.py) ---------------------

class ReferenceSession:
    """onnx's reference evaluator (``onnx.reference``) behind onnxruntime's session calls."""

    def __init__(self, path: Path) -> None:
        from onnx.reference import ReferenceEvaluator
        from onnx.reference.op_run import OpRun

        class GatherElements(OpRun):
            """onnx's own takes indices of the data's shape; a BERT graph gathers a prefix of its position ids."""

            def _run(self, data, indices, axis=0):
                indices = np.where(indices < 0, indices + data.shape[axis], indices)
                return (np.take_along_axis(data, indices, axis=axis),)

        self.evaluator = ReferenceEvaluator(str(path), new_ops=[GatherElements])

    def get_inputs(self):
        return [SimpleNamespace(name=name) for name in self.evaluator.input_names]

    def get_outputs(self):
        return [SimpleNamespace(name=name) for name in self.evaluator.output_names]

    def run(self, output_names, feed):
        return self.evaluator.run(output_names, feed)


def open_reference(path: Path, threads: int | None) -> ReferenceSession:
    return ReferenceSession(path)  # one NumPy thread pool: ``threads`` has nothing to set


def probe_reference() -> tuple[bool, str]:
    found = importlib.util.find_spec("onnx.reference") is not None
    return found, "onnx ships its reference evaluator" if found else "onnx is not installed"


REFERENCE = Runtime(providers={"reference": Provider(f"{__name__}:open_reference", available=fact("onnx_reference"))},
                    probes={"onnx_reference": f"{__name__}:probe_reference"},
                    help="onnx's reference evaluator: every operator as the specification defines it, in NumPy")


def test_a_runtime_registered_once_is_gated_by_the_export_and_runs_exported_judges(tiny_bert_dir, tmp_path,
                                                                                    monkeypatch, capsys):
    from tiny_judges import make_judge

    from clfjudge import machine
    from clfjudge.export.onnx import export_judge

    judge_dir = make_judge(tiny_bert_dir, tmp_path / "judge")
    assert "reference" not in PROVIDERS
    with registered_runtime("onnx-reference", REFERENCE):
        exported = export_judge(judge_dir, tmp_path / "onnx", n_records=8, providers=["reference"])
        gate = exported.report["variants"]["model.onnx @ reference"]
        assert gate["passed"] and gate["provider"] == "reference" and gate["max_abs_diff"] < 1e-4
        card = JudgeCard.load(exported.out_dir)
        assert "model.onnx @ reference" in card.runtime["onnx"]["gated"]
        assert card.runtime["machine"]["providers"] == {"reference": {"gated": True}}

        on_reference = Judge.load(exported.out_dir, provider="reference")
        assert isinstance(on_reference.backend.session, ReferenceSession)
        items = [{"question": "Q?", "answer_a": "a longer answer", "answer_b": "short"},
                 {"question": "Why?", "answer_a": "because", "answer_b": "no reason at all, really"}]
        got = [c.p_a for c in on_reference.compare_batch(items)]
        assert got == pytest.approx([c.p_a for c in Judge.load(exported.out_dir, provider="cpu").compare_batch(items)],
                                    abs=1e-5)
        src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        src.write_text("".join(json.dumps({"id": str(i), **item}) + "\n" for i, item in enumerate(items)))
        assert main(["score", str(exported.out_dir), "--input", str(src), "--output", str(out),
                     "--provider", "reference"]) == 0
        assert [json.loads(line)["p_a"] for line in out.read_text().splitlines()] == pytest.approx(got, abs=1e-6)

        # a machine whose probe says no: the export leaves the provider out, with the probe's reason
        monkeypatch.setattr(machine, "probe", lambda: machine.Machine(
            arch="x86_64", cpu="simulated", flags=frozenset(), facts={"onnx_reference": (False, "not here")}))
        elsewhere = export_judge(judge_dir, tmp_path / "elsewhere", n_records=8, providers=["reference"])
        assert list(elsewhere.report["variants"]) == ["model.onnx"]
        assert JudgeCard.load(elsewhere.out_dir).runtime["machine"]["providers"] == {
            "reference": {"gated": False, "why": "not here"}}
        with pytest.raises(ValueError, match="runtime 'onnx-reference', provider 'reference', machine fact "
                                             "'onnx_reference' is registered already"):
            register_runtime("onnx-reference", REFERENCE)  # one registration per runtime
    assert "reference" not in PROVIDERS and "onnx_reference" not in machine.PROBES  # undone when the block ends


# -- recipe 5: an audit judge adapter (audit/judges.py: an AuditJudge, AUDIT_JUDGES.register(prefix, builder)) --

class AlwaysJudge(AuditJudge):
    """``always:A`` / ``always:B`` / ``always:TIE``: one verdict for every pair, shown in either order."""

    def __init__(self, verdict: str) -> None:
        self.verdict = Verdict(verdict)
        self.name = f"always {verdict}"

    def predict(self, set_name, arity, records):
        if arity == "point":
            raise NotApplicable("no pointwise form")
        same = [self.verdict] * len(records)
        return Predictions(forward=same, reversed=list(same))


@pytest.fixture()
def fixture_data(monkeypatch):
    monkeypatch.setenv("CLFJUDGE_DATA", str(FIXTURES))


def test_an_audit_judge_adapter_is_audited_on_the_fixture_sets(fixture_data, tmp_path, override):
    override(AUDIT_JUDGES, "always", AlwaysJudge)
    m = run_audit(["always:A"], tmp_path, suites=["cross-scheme", "position"], sets=["pandalm-test", "prometheus-ind"],
                  bootstrap=0, progress=False)
    assert m["judges"]["always A"] == "always:A"
    gold = [r.verdict for r in SOURCES.get("pandalm-test").load().records]
    row = m["suites"]["cross-scheme"]["rows"]["always A"]
    assert row["pandalm-test"]["accuracy"] == pytest.approx(gold.count(Verdict.A) / len(gold))
    assert row["prometheus-ind"] == {"n/a": "no pointwise form"}
    assert m["suites"]["position"]["rows"]["always A"]["pandalm-test"]["first_position_preference"] == 1.0
    assert "`always A`" in (tmp_path / "report.md").read_text()


# -- recipe 6: an audit suite (audit/suites.py: a function of AuditData, one entry in the SUITES dict) --------

def set_sizes(d: AuditData) -> Table:
    """Records per test set, and how many of them each judge answered."""
    return {"n": {s.name: len(d.records[s.name]) for s in d.sets},
            "answered": {j: sorted(s.name for s in d.sets if d.available(j, s.name)) for j in d.judges}}


def test_an_audit_suite_lands_in_metrics_json(fixture_data, tmp_path, monkeypatch):
    monkeypatch.setitem(SUITES, "set-sizes", set_sizes)
    m = run_audit(["baseline:longer"], tmp_path, suites=["set-sizes"], sets=["pandalm-test", "prometheus-ind"],
                  bootstrap=0, progress=False)
    table = json.loads((tmp_path / "metrics.json").read_text())["suites"]["set-sizes"]
    assert table == m["suites"]["set-sizes"]
    assert table["n"]["pandalm-test"] == len(SOURCES.get("pandalm-test").load().records)
    assert table["answered"]["baseline:longer"] == ["pandalm-test", "prometheus-ind"]
    assert table["answered"]["baseline:majority"] == ["pandalm-test"]  # no pointwise form
