"""Training end to end on tiny random backbones and a small real slice."""
from __future__ import annotations

from pathlib import Path

import pytest

from clfjudge.card import JudgeCard
from clfjudge.cli import main
from clfjudge.paths import REPO_ROOT, data_root
from clfjudge.runtime import Judge
from clfjudge.training import TrainConfig

REAL_DATA = (data_root() / "pandalm" / "data" / "testset-v1.json").exists()
needs_data = pytest.mark.skipif(not REAL_DATA, reason="needs ../shared/data (present in CI)")


def _config(backbone: Path, out: Path, head: str, **extra) -> TrainConfig:
    sources = ["prometheus-vicuna:40"] if head == "regression" else ["pandalm-test:40"]
    return TrainConfig.from_dict({
        "backbone": str(backbone), "head": head, "sources": sources, "max_length": 128, "dev_fraction": 0.3,
        "batch_size": 4, "max_steps": 2, "eval_every": 2, "logging_steps": 1, "output_dir": str(out),
        "early_stopping_patience": 0, **extra})


@needs_data
@pytest.mark.parametrize("head", ["cls3", "reward", "regression"])
def test_each_head_trains_and_loads(tiny_bert_dir, tmp_path, head):
    from clfjudge.training import train

    # an eval source of another size than dev: its predictions must not be scored against the dev split
    extra = {} if head == "regression" else {"eval_sources": ["llmbar-natural:10"]}
    out = train(_config(tiny_bert_dir, tmp_path / head, head, **extra))
    card = JudgeCard.load(out)
    if extra:
        assert card.validation["eval:llmbar-natural"]["n"] == 10
    # every dev record is scored, also for heads that read two sequences per record (the Trainer's
    # last-batch trimming must not cut records)
    assert card.validation["dev"]["n"] == card.training["split"]["dev"]
    judge = Judge.load(out)
    if head == "regression":
        assert 1.0 <= judge.score("q", "a").value <= 5.0
    else:
        c = judge.compare("Name a prime.", "7", "9")
        assert c.p_a + c.p_tie + c.p_b == pytest.approx(1.0)


def test_recipes_parse():
    recipes = sorted((REPO_ROOT / "train").rglob("*.yaml"))
    assert recipes, "no recipes under train/"
    for path in recipes:
        TrainConfig.from_yaml(path)


def test_unknown_key_and_bad_override_are_clear(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("backbone: minilm\nsources: [pandalm-test]\nlearning_rate: 1e-5\n")
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['learning_rate'\]"):
        TrainConfig.from_yaml(path)
    path.write_text("backbone: minilm\nsources: [pandalm-test]\n")
    assert TrainConfig.from_yaml(path, ["lr=5e-5", "max_dev_records=10"]).lr == 5e-5
    with pytest.raises(ValueError):
        TrainConfig.from_yaml(path, ["epochs=many"])


@needs_data
def test_cli_train_on_a_real_slice(tiny_bert_dir, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(f"backbone: {tiny_bert_dir}\nhead: reward\nsources: [alpacaeval-gpt4:64]\n"
                    "decontaminate_against: [pandalm-test]\nmax_length: 128\nbatch_size: 8\nmax_steps: 2\n"
                    f"early_stopping_patience: 0\noutput_dir: {tmp_path / 'judge'}\n")
    assert main(["train", "--config", str(path), "--set", "dev_fraction=0.25"]) == 0
    card = JudgeCard.load(tmp_path / "judge")
    assert card.training["split"]["decontaminated_by_set"].keys() == {"pandalm-test"}
