"""The generative baseline: loss only on the judgement tokens, greedy decoding, released-judge parsers, parse
failures counted and never scored as a verdict."""
from __future__ import annotations

import pytest

from clfjudge.card import JudgeCard
from clfjudge.data.records import PairRecord, PointRecord, Verdict
from clfjudge.judges.generative import GenerativeReader, PromptEncoder
from clfjudge.paths import data_root
from clfjudge.prompts.truncation import TruncationPolicy
from clfjudge.training.config import TrainConfig
from clfjudge.training.generative import GenerativeHead, evaluate

REAL_DATA = (data_root() / "pandalm" / "data" / "testset-v1.json").exists()
needs_data = pytest.mark.skipif(not REAL_DATA, reason="needs ../shared/data (present in CI)")

PAIR = PairRecord(id="p", question="Name a prime.", answer_a="7", answer_b="9", verdict=Verdict.A)


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from clfjudge.models.backbones import load_tokenizer, resolve_backbone

    return load_tokenizer(resolve_backbone(tiny_llama_dir), padding_side="left")


def test_loss_covers_only_the_target_and_eos(tokenizer):
    enc = PromptEncoder(tokenizer, "decoder-pair-gen", TruncationPolicy(max_length=384))
    ex = enc.example(PAIR)
    n_target = sum(label != -100 for label in ex["labels"])
    assert ex["labels"][-n_target:] == ex["input_ids"][-n_target:]
    assert ex["input_ids"][-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ex["input_ids"][-n_target:], skip_special_tokens=True) == "1"  # PandaLM's "A" wins
    assert ex["input_ids"][:-n_target] == enc.prompt_ids(PAIR)
    assert tokenizer.decode(enc.prompt_ids(PAIR)).rstrip().endswith("[Feedback]")


def test_head_keeps_only_records_the_scheme_can_write():
    head = GenerativeHead("decoder-pair-gen")
    point = PointRecord(id="s", question="q", answer="a", score=3.0, scale=(1.0, 5.0))
    unlabelled = PairRecord(id="u", question="q", answer_a="a", answer_b="b")
    kept, excluded = head.select([PAIR, point, unlabelled])
    assert kept == [PAIR] and sum(excluded.values()) == 2
    assert GenerativeHead("decoder-point-gen").arity == "point"


class _Scripted:
    """A stand-in LM that writes fixed texts, to check what happens to each kind of output."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts = tokenizer, list(texts)

    def eval(self):
        return self

    def generate(self, input_ids, attention_mask, **_):
        import torch

        rows = [self.tokenizer(self.texts.pop(0), add_special_tokens=False)["input_ids"] for _ in input_ids]
        width = max(map(len, rows))
        new = torch.tensor([r + [self.tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, new], dim=1)


def test_parse_failures_are_counted_and_scored_wrong(tokenizer):
    records = [PAIR, PAIR.swapped(), PAIR]
    # forward: right, right, unparseable; swapped order: consistent, consistent, "Tie"
    judge = GenerativeReader(_Scripted(tokenizer, ["1", "2", "the first one", "2", "1", "Tie"]), tokenizer,
                            "decoder-pair-gen", max_length=384, max_new_tokens=4, batch_size=8)
    metrics = evaluate(judge, records)
    assert metrics["n"] == 3 and metrics["n_failed"] == 1 and metrics["accuracy"] == pytest.approx(2 / 3)
    assert metrics["consistency"] == pytest.approx(2 / 3) and metrics["outputs"] == 6
    assert judge.stats.to_dict()["pandalm-pair"]["failed"] == 1


@needs_data
@pytest.mark.parametrize("source, scheme", [("pandalm-test:40", None), ("prometheus-vicuna:30", "decoder-point-gen")])
def test_generative_baseline_trains_decodes_and_loads(tiny_llama_dir, tmp_path, source, scheme):
    from clfjudge.training.trainer import train

    cfg = TrainConfig.from_dict({
        "backbone": str(tiny_llama_dir), "head": "generative", "sources": [source], "max_length": 384,
        "dev_fraction": 0.25, "batch_size": 4, "max_steps": 2, "logging_steps": 1, "swap_aug": 0.5,
        "early_stopping_patience": 0, "output_dir": str(tmp_path / "gen"), **({"scheme": scheme} if scheme else {})})
    out = train(cfg)
    card = JudgeCard.load(out)
    dev = card.validation["dev"]
    assert card.kind == "generative" and card.training["global_steps"] == 2
    assert dev["n"] == card.training["split"]["dev"] and dev["n_failed"] <= dev["n"]
    stats = next(iter(card.runtime["parse_stats"].values()))
    assert stats["total"] == dev["outputs"]  # every generated output went through the parser
    judge = GenerativeReader.load(out)
    records = [PAIR] if card.arity == "pair" else [PointRecord(id="s", question="q", answer="a", score=3.0,
                                                              scale=(1.0, 5.0))]
    got = judge.verdicts(records) if card.arity == "pair" else judge.scores(records)
    assert len(got) == 1 and judge.stats.total(judge.parser.name) == 1


@needs_data
def test_audit_runs_a_zero_shot_generative_judge(tiny_llama_dir, tmp_path):
    from clfjudge.audit import run_audit

    spec = f"gen:{tiny_llama_dir}@decoder-pair-gen"
    m = run_audit([spec, "baseline:longer"], tmp_path, suites=["cross-scheme", "position"], limit=6,
                  bootstrap=0, progress=False, sets=["llmbar-natural"])
    name = next(n for n in m["judges"] if n.startswith("gen:"))
    row = m["suites"]["cross-scheme"]["rows"][name]["llmbar-natural"]
    failed_outputs = int(row["notes"][0].split()[0])  # "<k> outputs did not parse (pandalm-pair)"
    assert 0 <= row["n_failed"] <= 6 and row["n_failed"] <= failed_outputs <= 2 * row["n_failed"]
    assert row["n_failed"] < 6 or row["accuracy"] == 0.0 == row["consistency"]  # a failure is never right


# -- through the one judge interface (clfjudge.judges.base.Judge) ---------------------------------------------

SEVEN_NINE = {"question": "Name a prime.", "answer_a": "seven", "answer_b": "nine"}
NINE_SEVEN = {"question": "Name a prime.", "answer_a": "nine", "answer_b": "seven"}
GIBBERISH = {"question": "GIBBERISH?", "answer_a": "seven", "answer_b": "nine"}


@pytest.fixture(scope="module")
def gen_dir(tiny_llama_dir, tmp_path_factory):
    from tiny_judges import make_generative_judge

    return make_generative_judge(tiny_llama_dir, tmp_path_factory.mktemp("gen") / "judge")


def _scripted(judge):
    from tiny_judges import ScriptedLM, prefers_seven

    judge.generator.model = ScriptedLM(judge.generator.tokenizer, prefers_seven)
    return judge


def test_judge_load_opens_a_generative_directory(gen_dir):
    from clfjudge.judges.base import Comparison, Judge
    from clfjudge.judges.generative import GenerativeJudge

    judge = Judge.load(gen_dir, batch_size=2)
    assert isinstance(judge, GenerativeJudge) and judge.backend_name == "generate" and judge.tasks == {"compare"}
    got = judge.compare_batch([SEVEN_NINE, NINE_SEVEN, GIBBERISH])  # the random tiny LM writes what it writes
    assert len(got) == 3 and all(isinstance(c, Comparison) for c in got)
    assert all((c.verdict is not None) == c.parsed and len(c.generated) == 1 for c in got)
    assert all(len(c.generated) == 2 for c in judge.compare_batch([SEVEN_NINE], symmetric=True))
    assert judge.generator.stats.total(judge.generator.parser.name) == 5  # every output went through the parser
    with pytest.raises(ValueError, match="generative judge \\(pair\\) cannot score"):
        judge.score("Name a prime.", "seven")


def test_generative_judge_compares_and_flags_what_does_not_parse(gen_dir):
    import json
    import math

    from clfjudge.judges.base import Judge

    judge = _scripted(Judge.load(gen_dir))
    a, b, bad = judge.compare_batch([SEVEN_NINE, NINE_SEVEN, GIBBERISH])
    assert (a.verdict, a.p_a, a.p_b, a.parsed, a.generated) == (Verdict.A, 1.0, 0.0, True, ("1",))
    assert b.verdict is Verdict.B and b.p_b == 1.0
    assert bad.verdict is None and not bad.parsed and bad.generated == ("the first one",)
    assert all(math.isnan(p) for p in (bad.p_a, bad.p_tie, bad.p_b))  # not a tie, not a default
    row = json.loads(json.dumps(bad.to_dict(), allow_nan=False))
    assert row == {"p_a": None, "p_tie": None, "p_b": None, "verdict": None, "parsed": False,
                   "generated": ["the first one"]}
    sym = judge.compare_batch([SEVEN_NINE, GIBBERISH], symmetric=True)
    assert sym[0].verdict is Verdict.A and sym[0].generated == ("1", "2") and not sym[1].parsed
    assert judge.rank("Name a prime.", ["nine", "seven"]) == [-1.0, 1.0]
    assert all(math.isnan(x) for x in judge.rank("GIBBERISH?", ["nine", "seven"]))  # no parsed game: no score


def test_symmetric_compare_of_a_position_biased_generative_judge_is_a_tie(gen_dir):
    from tiny_judges import ScriptedLM

    from clfjudge.judges.base import Judge

    judge = Judge.load(gen_dir)
    judge.generator.model = ScriptedLM(judge.generator.tokenizer, lambda _prompt: "1")  # always the first answer
    c = judge.compare(SEVEN_NINE["question"], "seven", "nine", symmetric=True)
    assert (c.verdict, c.p_a, c.p_tie, c.p_b) == (Verdict.TIE, 0.5, 0.0, 0.5)


def test_a_pointwise_generative_judge_scores(tiny_llama_dir, tmp_path):
    import math

    from tiny_judges import ScriptedLM, make_generative_judge

    from clfjudge.judges.base import Judge, Score

    judge = Judge.load(make_generative_judge(tiny_llama_dir, tmp_path / "gen-point", "decoder-point-gen"))
    assert judge.tasks == {"score"}
    judge.generator.model = ScriptedLM(judge.generator.tokenizer, lambda p: "no idea" if "GIBBERISH" in p else "4")
    good, bad = judge.score_batch([{"question": "Name a prime.", "answer": "seven"},
                                   {"question": "GIBBERISH?", "answer": "seven"}])
    assert isinstance(good, Score) and (good.value, good.parsed) == (4.0, True)
    assert math.isnan(bad.value) and bad.to_dict() == {"score": None, "parsed": False, "generated": ["no idea"]}
    with pytest.raises(ValueError, match="generative judge \\(point\\) cannot compare"):
        judge.compare_batch([SEVEN_NINE])


def test_score_cli_runs_a_generative_judge(gen_dir, tmp_path, monkeypatch, capsys):
    import json

    from tiny_judges import ScriptedLM, prefers_seven

    import clfjudge.models.backbones
    from clfjudge.cli import main

    monkeypatch.setattr(clfjudge.models.backbones, "load_causal_lm",
                        lambda info, tokenizer=None, **_: ScriptedLM(tokenizer, prefers_seven))
    src, out = tmp_path / "pairs.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", **p}) + "\n"
                           for i, p in enumerate([SEVEN_NINE, NINE_SEVEN, GIBBERISH])))
    assert main(["score", str(gen_dir), "--input", str(src), "--output", str(out), "--batch-size", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["verdict"], r["parsed"]) for r in rows] == [("p0", "A", True), ("p1", "B", True),
                                                                     ("p2", None, False)]
    assert rows[2]["generated"] == ["the first one"] and rows[2]["p_a"] is None
    assert "lines read 3: scored 3, rejected 0" in capsys.readouterr().out
    assert main(["score", str(gen_dir), "--input", str(src), "--output", str(out), "--symmetric"]) == 0
    assert [json.loads(line)["generated"] for line in out.read_text().splitlines()][0] == ["1", "2"]


def test_audit_cache_key_of_a_generative_directory(gen_dir, tmp_path):
    import shutil

    from clfjudge.audit import _cache_path

    judge = shutil.copytree(gen_dir, tmp_path / "judge")
    before = _cache_path(tmp_path, str(judge), "llmbar-natural")
    assert _cache_path(tmp_path, f"gen:{judge}", "llmbar-natural") == before  # the deprecated alias: same judge
    card = JudgeCard.load(judge)
    card.training = {"global_steps": 1}  # re-trained in place
    card.save(judge)
    assert _cache_path(tmp_path, str(judge), "llmbar-natural") != before


@needs_data
def test_audit_runs_a_generative_judge_directory(gen_dir, tmp_path):
    from clfjudge.audit import run_audit

    m = run_audit([str(gen_dir)], tmp_path, suites=["cross-scheme", "position"], limit=4, bootstrap=0,
                  progress=False, sets=["llmbar-natural"])
    name = next(n for n, spec in m["judges"].items() if spec == str(gen_dir))
    assert "generative" in name
    row = m["suites"]["cross-scheme"]["rows"][name]["llmbar-natural"]
    failed_outputs = int(row["notes"][0].split()[0])  # "<k> outputs did not parse (pandalm-pair)"
    assert row["n_failed"] <= failed_outputs <= 2 * row["n_failed"] <= 8
