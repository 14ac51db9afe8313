"""Training end to end on tiny random backbones and a small real slice."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from clfjudge.batching import Budget
from clfjudge.card import JudgeCard
from clfjudge.cli import main
from clfjudge.data.records import PointRecord
from clfjudge.judges.base import Judge
from clfjudge.models.heads import RewardHead
from clfjudge.paths import REPO_ROOT, data_root
from clfjudge.training.config import TrainConfig

REAL_DATA = (data_root() / "pandalm" / "data" / "testset-v1.json").exists()
needs_data = pytest.mark.skipif(not REAL_DATA, reason="needs ../shared/data (present in CI)")


def _config(backbone: Path, out: Path, head: str, **extra) -> TrainConfig:
    sources = ["prometheus-vicuna:40"] if head == "regression" else ["pandalm-test:40"]
    # the decoder templates alone take ~200 tokens of the tiny byte-level BPE (rotary positions: no table limit)
    max_length = 384 if "llama" in str(backbone) else 128
    return TrainConfig.from_dict({
        "backbone": str(backbone), "head": head, "sources": sources, "max_length": max_length, "dev_fraction": 0.3,
        "batch_size": 4, "max_steps": 2, "eval_every": 2, "logging_steps": 1, "output_dir": str(out),
        "early_stopping_patience": 0, **extra})


BACKBONES = ["tiny_bert_dir", "tiny_deberta_dir", "tiny_llama_dir"]


@needs_data
@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("head", ["cls3", "reward", "regression"])
def test_each_head_trains_and_loads(request, tmp_path, head, backbone):
    from clfjudge.training.trainer import train

    # an eval source of another size than dev: its predictions must not be scored against the dev split
    extra = {} if head == "regression" else {"eval_sources": ["llmbar-natural:10"]}
    out = train(_config(request.getfixturevalue(backbone), tmp_path / head, head, **extra))
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
    recipes += sorted((REPO_ROOT / "clfjudge" / "configs" / "recipes").glob("*.yaml"))  # the bundled defaults
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


@pytest.mark.parametrize("key, meant", [("lr_rate", "lr"), ("backbon", "backbone"), ("learning_rate", "lr"),
                                        ("batchsize", "batch_size")])
def test_a_misspelt_key_names_the_close_key_with_its_help(key, meant):
    help_text = {f.name: f.metadata["help"] for f in fields(TrainConfig)}[meant]
    with pytest.raises(ValueError) as err:
        TrainConfig.from_dict({"sources": ["pandalm-test"], key: "1"}, where="r.yaml")
    message = str(err.value)
    assert message.startswith(f"r.yaml: unknown config key(s) [{key!r}]; did you mean:")
    assert f"  {meant}: " in message and " ".join(message.split()).count(help_text) == 1
    with pytest.raises(ValueError, match="clfjudge train --help` lists the known keys"):
        TrainConfig.from_dict({"sources": ["pandalm-test"], "zzz": 1})


def test_every_config_key_has_help():
    for f in fields(TrainConfig):
        assert isinstance(f.metadata.get("help"), str) and f.metadata["help"].strip(), f.name


def test_train_help_lists_the_recipe_keys(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # unwrapped
    # the help names where the keys live, by their current module path (not a pre-layout one)
    assert "clfjudge.training.config.TrainConfig" in out and "train_config" not in out
    for f in fields(TrainConfig):
        assert f"{f.name}: {f.metadata['help']}" in out, f.name
    assert "lr: peak learning rate (AdamW) (default: 2e-05)" in out
    assert "backbone: offline alias" in out and "(default: minilm)" in out
    assert "sources: train sources" in out and "(default: [])" in out


@pytest.mark.parametrize("command", [["train"], ["run"], ["distill", "teacher", "--pool", "p", "--out", "o"]])
@pytest.mark.parametrize("spelling", ["--recipe", "--config"])
def test_every_command_takes_the_recipe_as_recipe_and_still_as_config(command, spelling, capsys):
    from clfjudge.cli import build_parser

    args = build_parser().parse_args([*command, spelling, "r.yaml"])
    assert str(args.recipe) == "r.yaml"
    err = capsys.readouterr().err
    assert ("--config is deprecated, use --recipe" in err) == (spelling == "--config")


@pytest.mark.parametrize("command", ["train", "run", "distill"])
def test_the_recipe_option_is_shown_as_recipe_only(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "--recipe" in out and "--config" not in out


def test_cli_help_stays_cheap():
    """``clfjudge --help`` builds every sub-parser but imports neither training.config (the recipe keys are listed
    only by ``clfjudge train --help``) nor torch; training.config itself imports no torch / transformers."""
    code = ("import sys\nfrom clfjudge.cli import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in ('torch', 'transformers', 'clfjudge.training.config') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    code = ("import sys\nimport clfjudge.training.config\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("text, where, words", [
    ("backbone: minilm\nsources: [pandalm-test\nlr: 1\n", ":3:", "not valid YAML"),
    ("- backbone: minilm\n", ":?:", "a recipe must be a mapping of config keys, got list"),
    ("backbone: minilm\nsources: [pandalm-test]\nswap_aug: 2\n", ": ", "swap_aug must be in [0, 1]"),
    ("backbone: minilm\nsources: [pandalm-test]\nhead: forest\n", ": ", "unknown head 'forest'"),
    ("backbone: minilm\nsources: [pandalm-test]\npreset: huge\n", ": preset: ", "unknown"),
])
def test_recipe_errors_name_the_file(tmp_path, text, where, words):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises((ValueError, KeyError)) as err:
        TrainConfig.from_yaml(path)
    message = err.value.args[0]
    assert message.startswith(f"{path}{where}") and words in message
    path.write_bytes(b"backbone: \xff\n")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        TrainConfig.from_yaml(path)


@needs_data
def test_cli_train_on_a_real_slice(tiny_bert_dir, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(f"backbone: {tiny_bert_dir}\nhead: reward\nsources: [alpacaeval-gpt4:64]\n"
                    "decontaminate_against: [pandalm-test]\nmax_length: 128\nbatch_size: 8\nmax_steps: 2\n"
                    f"early_stopping_patience: 0\noutput_dir: {tmp_path / 'judge'}\n")
    assert main(["train", "--config", str(path), "--set", "dev_fraction=0.25"]) == 0
    card = JudgeCard.load(tmp_path / "judge")
    assert card.training["split"]["decontaminated_by_set"].keys() == {"pandalm-test"}


@needs_data
@pytest.mark.parametrize("head", ["cls3", "reward"])
def test_decoder_judge_ignores_padding(tiny_llama_dir, tmp_path, head):
    """A decoder pools the last non-pad token (pad != eos): padding a short pair in a batch with a long one
    must not change its verdict probabilities."""
    from clfjudge.training.trainer import train

    judge = Judge.load(train(_config(tiny_llama_dir, tmp_path / head, head)))
    short = {"question": "Name a prime.", "answer_a": "7", "answer_b": "9"}
    long = {"question": "Explain photosynthesis. " * 8, "answer_a": "Light to sugar. " * 10, "answer_b": "No."}
    alone = judge.compare_batch([short])[0]
    padded = judge.compare_batch([short, long])[0]
    assert (padded.p_a, padded.p_tie, padded.p_b) == pytest.approx((alone.p_a, alone.p_tie, alone.p_b), abs=1e-5)


def test_swap_augmentation_swaps_answers_and_labels():
    import random

    from clfjudge.data.records import PairRecord, Verdict
    from clfjudge.training.data import swap_augment

    recs = [PairRecord(id=f"p{i}", question=f"q{i}", answer_a=f"a{i}", answer_b=f"b{i}", verdict=v,
                       scores=(9.0, 1.0)) for i, v in enumerate([Verdict.A, Verdict.B, Verdict.TIE])]
    out = swap_augment(recs, 1.0, random.Random(0))
    assert out[:3] == recs and len(out) == 6
    added = {r.id: r for r in out[3:]}
    for r in recs:
        s = added[r.id]
        expected = (r.answer_b, r.answer_a, r.verdict.swapped(), (1.0, 9.0))
        assert (s.answer_a, s.answer_b, s.verdict, s.scores) == expected
    assert len(swap_augment(recs, 1 / 3, random.Random(0))) == 4


def test_randomize_order_swaps_about_half_with_their_labels_and_is_seeded():
    from clfjudge.data.records import PairRecord, Verdict
    from clfjudge.training.data import randomize_order

    recs = [PairRecord(id=f"p{i}", question=f"q{i}", answer_a=f"base{i}", answer_b=f"model{i}", verdict=Verdict.A)
            for i in range(400)]
    out, n = randomize_order(recs, seed=1)
    swapped = [r for r in out if r.answer_a.startswith("model")]
    assert n == len(swapped) and 160 < n < 240
    assert all(r.verdict is Verdict.B for r in swapped)
    assert [r.id for r in out] == [r.id for r in recs]  # same records, same order
    assert randomize_order(recs, seed=1) == (out, n) and randomize_order(recs, seed=2)[0] != out


@needs_data
def test_fixed_order_source_needs_randomize_order_for_an_order_sensitive_head():
    from clfjudge.models.heads import HEADS
    from clfjudge.training.data import build_splits

    cfg = {"head": "cls3", "sources": ["alpacaeval-gpt4:400"], "test_fraction": 0.25}
    with pytest.raises(ValueError, match=r"alpacaeval-gpt4.*randomize_order: true"):
        build_splits(TrainConfig.from_dict(cfg), HEADS.get("cls3")())
    build_splits(TrainConfig.from_dict({**cfg, "head": "reward"}), HEADS.get("reward")())  # invariant: allowed
    splits = build_splits(TrainConfig.from_dict({**cfg, "randomize_order": True}), HEADS.get("cls3")())
    everything = splits.train + splits.dev + splits.test
    assert splits.counts["order_swapped"] == sum(r.meta.get("swapped", False) for r in everything) > 100
    # output_1 (the baseline) loses most of AlpacaEval's comparisons: in the original order "B" is the
    # majority; randomized, the majority class is no better than a coin on the pairs without a tie
    verdicts = [r.verdict.name for r in everything]
    assert max(verdicts.count("A"), verdicts.count("B")) / len(verdicts) < 0.6


@needs_data
def test_extra_train_sources_join_training_only_and_never_leak_a_held_out_question():
    from clfjudge.data.splits import contamination_keys
    from clfjudge.models.heads import HEADS
    from clfjudge.training.data import build_splits

    base = {"head": "reward", "sources": ["pandalm-test"], "cv_folds": 5, "cv_fold": 0}
    plain = build_splits(TrainConfig.from_dict(base), HEADS.get("reward")())
    mixed = build_splits(TrainConfig.from_dict({**base, "extra_train_sources": ["alpacaeval-gpt4"]}),
                         HEADS.get("reward")())
    # the primary source's split is untouched: same dev and test, its training records all still there
    assert [r.id for r in mixed.dev] == [r.id for r in plain.dev]
    assert [r.id for r in mixed.test] == [r.id for r in plain.test]
    extra = [r for r in mixed.train if r.source == "alpacaeval-gpt4"]
    assert len(mixed.train) == len(plain.train) + len(extra) and len(extra) == mixed.counts["extra_train"]
    # AlpacaEval shares prompts with the PandaLM test set: the ones in this test fold or dev are removed
    held = {k for r in (*mixed.test, *mixed.dev) for k in contamination_keys(r.question)}
    assert mixed.counts["extra_decontaminated"] > 0
    assert not any(held & set(contamination_keys(r.question)) for r in extra)
    assert mixed.sources["train"]["alpacaeval-gpt4"]["role"].startswith("extra_train")
    with pytest.raises(ValueError, match=r"\['pandalm-test'\] are both train and extra_train"):
        build_splits(TrainConfig.from_dict({**base, "extra_train_sources": ["pandalm-test"]}), HEADS.get("reward")())
    with pytest.raises(ValueError, match=r"\['llmbar-natural'\] are both extra_train and evaluation"):
        build_splits(TrainConfig.from_dict({**base, "extra_train_sources": ["llmbar-natural"],
                                            "eval_sources": ["llmbar-natural"]}), HEADS.get("reward")())


@needs_data
def test_neighbour_negatives_come_from_the_training_split_only():
    from clfjudge.data.records import Verdict
    from clfjudge.models.heads import HEADS
    from clfjudge.training.data import build_splits

    cfg = {"head": "reward", "sources": ["pandalm-test:120"], "test_fraction": 0.25, "length_covariate": True}
    plain = build_splits(TrainConfig.from_dict(cfg), HEADS.get("reward")())
    head = HEADS.get("reward")()
    head.length_covariate = True
    hard = build_splits(TrainConfig.from_dict({**cfg, "neighbour_negatives": 2}), head)
    negatives = [r for r in hard.train if r.source == "neighbour-negatives"]
    assert len(negatives) == hard.counts["neighbour_negatives_added"] > 10
    assert len(hard.train) == len(plain.train) + len(negatives)
    assert [r.id for r in hard.test] == [r.id for r in plain.test]
    assert len({r.id for r in negatives}) == len(negatives)  # the copies are distinct records
    own = {}
    for r in plain.train:
        own.setdefault(r.question, set()).update({r.answer_a, r.answer_b})
    for r in negatives:
        good, bad = (r.answer_a, r.answer_b) if r.verdict is Verdict.A else (r.answer_b, r.answer_a)
        assert good in own[r.question] and bad in own[r.meta["neighbour_question"]]
        assert r.meta["neighbour_question"] != r.question
    assert head.length_coef > 0  # fitted on the real pairs before the negatives were added


@needs_data
def test_swap_aug_in_splits_only_for_position_dependent_heads():
    from clfjudge.models.heads import HEADS
    from clfjudge.training.data import build_splits

    for head in ("cls3", "reward"):
        cfg = TrainConfig.from_dict({"head": head, "sources": ["pandalm-test:40"], "dev_fraction": 0.25,
                                     "swap_aug": 1.0})
        splits = build_splits(cfg, HEADS.get(head)())
        n = splits.counts["train"]
        assert n > 20 and len(splits.train) == n + splits.counts["swap_aug_added"]
        assert splits.counts["swap_aug_added"] == (n if head == "cls3" else 0)
        assert splits.counts["swap_aug_skipped"] is (head == "reward")


@needs_data
def test_early_stopping_stops_when_dev_metric_stalls(tiny_bert_dir, tmp_path):
    from clfjudge.training.trainer import train

    # lr 0: the dev metric never improves, so patience 1 stops after the second evaluation
    out = train(_config(tiny_bert_dir, tmp_path / "es", "cls3", lr=0.0, max_steps=8, eval_every=1,
                        early_stopping_patience=1))
    card = JudgeCard.load(out)
    assert card.training["global_steps"] == 2
    assert sum("eval_accuracy" in row for row in card.training["log_history"]) == 2


@needs_data
def test_cv_fold_holds_out_the_group_kfold_fold():
    from clfjudge.data import sources
    from clfjudge.data.splits import group_kfold
    from clfjudge.models.heads import HEADS
    from clfjudge.training.data import build_splits

    cfg = TrainConfig.from_dict({"head": "cls3", "sources": ["pandalm-test"], "cv_folds": 5, "cv_fold": 2})
    splits = build_splits(cfg, HEADS.get("cls3")())
    records = sources.load("pandalm-test").records
    held = group_kfold(records, 5, 0)[2][1]
    assert [r.id for r in splits.test] == [records[i].id for i in held]
    test_questions = {r.question for r in splits.test}
    assert not any(r.question in test_questions for r in splits.train + splits.dev)


@pytest.mark.parametrize("bad, message", [
    ({"cv_folds": 5, "cv_fold": 5}, "cv_fold must be in"),
    ({"cv_folds": 1}, "cv_folds must be 0"),
    ({"cv_folds": 5, "test_fraction": 0.2}, "either cv_folds or test_fraction"),
])
def test_bad_cv_settings_are_clear(bad, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict({"sources": ["pandalm-test"], **bad})


@needs_data
def test_length_hint_reaches_the_judge(tiny_bert_dir, tmp_path):
    """The hint shows the untruncated length even when the answer is cut, and the loaded judge encodes with it."""
    from clfjudge.data.records import PointRecord
    from clfjudge.prompts.encoding import length_bucket
    from clfjudge.training.trainer import train

    judge = Judge.load(train(_config(tiny_bert_dir, tmp_path / "hint", "reward", length_hint=True)))
    assert judge.encoder.length_hint
    answer = "word " * 400
    text = judge.encoder.text(PointRecord(id="x", question="q", answer=answer, score=None))
    assert f"length {length_bucket(answer)}:" in text and len(text) < len(answer)
    assert length_bucket("") == 0 and length_bucket("a" * 1000) > length_bucket("a" * 500)


@needs_data
def test_length_covariate_is_fitted_and_used_by_the_loaded_judge(tiny_bert_dir, tmp_path):
    """The reward judge trained with the length offset stores beta and scores with it (PyTorch judge)."""
    from clfjudge.models.heads import answer_length
    from clfjudge.training.trainer import train

    judge = Judge.load(train(_config(tiny_bert_dir, tmp_path / "lc", "reward", length_covariate=True)))
    beta = judge.card.calibration["length_coef"]
    assert beta != 0.0 and judge.head.length_coef == beta
    short, long_ = "Seven.", "Seven is prime: its only divisors are one and itself."
    gap = judge.score("Name a prime.", long_).value - judge.score("Name a prime.", short).value
    plain = RewardHead.rewards(judge.backend(judge.tokenizer.pad(
        [judge.encode(PointRecord(id=str(i), question="Name a prime.", answer=a, score=None))[0]
         for i, a in enumerate((long_, short))], padding=True, return_tensors="np")))
    assert gap == pytest.approx(plain[0] - plain[1] + beta * (answer_length(long_) - answer_length(short)), abs=1e-4)


@needs_data
def test_validation_predictions_are_in_record_order(tiny_bert_dir, tmp_path):
    """Early stopping, calibration and the card's metrics see predictions matched to their records: the loaded
    judge, predicting record by record, reproduces them. (transformers' group_by_length also length-groups
    evaluation with a shuffling sampler; predictions then came back permuted and every dev metric was noise.)"""
    from clfjudge.models.heads import HEADS, fit_davidson
    from clfjudge.training.data import build_splits
    from clfjudge.training.trainer import train

    cfg = _config(tiny_bert_dir, tmp_path / "order", "reward", test_fraction=0.3, group_by_length=True,
                  eval_batch_size=2)
    judge = Judge.load(train(cfg))
    splits = build_splits(cfg, HEADS.get("reward")())
    raw = judge.raw_outputs(splits.dev)
    scale, nu = fit_davidson(raw[:, 0] - raw[:, 1], [r.verdict for r in splits.dev])
    # the tie fit is flat near nu = 0: batch padding noise moves its optimum by ~0.3%, a permutation by ~50%
    assert (judge.card.calibration["scale"], judge.card.calibration["nu"]) == pytest.approx((scale, nu), rel=0.02)
    for split, records in (("dev", splits.dev), ("test", splits.test)):
        verdicts = [c.verdict for c in judge.compare_batch(records)]
        accuracy = sum(v == r.verdict for v, r in zip(verdicts, records)) / len(records)
        assert judge.card.validation[split]["accuracy"] == pytest.approx(accuracy), split


def test_length_covariate_needs_the_reward_head():
    with pytest.raises(ValueError, match="reward-head option"):
        TrainConfig.from_dict({"sources": ["pandalm-test"], "head": "cls3", "length_covariate": True})


@pytest.mark.slow
@needs_data
def test_cli_trains_minilm_on_real_pandalm_pairs(tmp_path):
    """The real backbone through the CLI on 64 PandaLM pairs: a few steps, a loadable judge that scores."""
    path = tmp_path / "r.yaml"
    path.write_text("backbone: minilm\nhead: cls3\nsources: [pandalm-test:64]\nswap_aug: 1.0\nmax_length: 128\n"
                    "batch_size: 8\nmax_steps: 3\ndev_fraction: 0.25\nearly_stopping_patience: 0\n"
                    f"output_dir: {tmp_path / 'judge'}\n")
    assert main(["train", "--config", str(path)]) == 0
    card = JudgeCard.load(tmp_path / "judge")
    assert card.training["global_steps"] == 3 and card.training["split"]["swap_aug_added"] > 0
    assert card.validation["dev"]["n"] == card.training["split"]["dev"]
    c = Judge.load(tmp_path / "judge").compare("Name a prime.", "7", "9")
    assert c.p_a + c.p_tie + c.p_b == pytest.approx(1.0)


@needs_data
@pytest.mark.parametrize("source, arity", [("pandalm-test:60", "pair"), ("prometheus-vicuna:40", "point")])
def test_embedding_head_trains_on_a_decoder_and_serves(tiny_llama_dir, tmp_path, source, arity):
    """head: embedding: a frozen decoder + scikit-learn head on the shared splits, a judge the runtime loads."""
    from clfjudge.audit.judges import trained_on

    path = tmp_path / "r.yaml"
    path.write_text(f"backbone: {tiny_llama_dir}\nhead: embedding\nsources: [{source}]\ncv_folds: 3\n"
                    f"dev_fraction: 0.2\nswap_aug: 1.0\nembedding: {{arity: {arity}, features: "
                    f"{'[diff, abs_diff]' if arity == 'pair' else '[a, cos]'}, layer: 1}}\n"
                    f"output_dir: {tmp_path / 'judge'}\n")
    assert main(["train", "--config", str(path)]) == 0
    card = JudgeCard.load(tmp_path / "judge")
    assert card.kind == "embedding" and card.arity == arity
    assert card.runtime["embedder"]["type"] == "decoder" and card.runtime["embedder"]["layer"] == 1
    assert trained_on(card) == {source.split(":")[0]}  # an audit marks the set as seen in training
    split = card.training["split"]
    assert card.training["n_records"] == split["train"] and split["test"] > 0 and split["dev"] > 0
    assert split["swap_aug_skipped"] and split["swap_aug_added"] == 0  # invariant by construction
    test = card.validation["test"]
    assert test["n"] == split["test"]
    if arity == "pair":
        assert card.training["chosen_C"] > 0 and test["consistency"] == 1.0
        assert set(test["baselines"]) >= {"majority-class", "longer-answer-wins"}
    judge = Judge.load(tmp_path / "judge")
    if arity == "pair":
        assert judge.compare("q?", "yes", "no").verdict in {"A", "B", "TIE"}
    else:
        assert 1.0 <= judge.score("q?", "yes").value <= 5.0


def test_embedding_options_are_checked(tmp_path):
    """The recipe's embedding block is an EmbeddingOptions: values coerced to each key's type, an unknown key
    refused naming the file, the block and every known key with its help."""
    from clfjudge.training.embedding import model_from_config
    from clfjudge.training.embedding_config import EmbeddingOptions

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("backbone: minilm\nhead: embedding\nsources: [pandalm-test]\nembedding: {layers: 3}\n")
    with pytest.raises(ValueError, match=r"recipe.yaml: embedding: unknown option\(s\) \['layers'\]; known: arity: "
                                         r"pair \(verdicts\)"):
        TrainConfig.from_yaml(recipe)
    recipe.write_text("backbone: minilm\nhead: embedding\nsources: [pandalm-test]\n"
                      "embedding: {arity: point, use_length: 'no', batch_size: '8'}\n")
    cfg = TrainConfig.from_yaml(recipe, ["embedding.head=gbdt"])
    assert cfg.embedding == EmbeddingOptions(arity="point", use_length=False, batch_size=8, head="gbdt")
    assert cfg.embedding.reader_options() == {"budget": Budget(8)}
    assert cfg.with_overrides(["seed=1"]).embedding == cfg.embedding  # survives the round trip through a dict
    model = model_from_config(cfg)
    assert (model.arity, model.head, model.use_length) == ("point", "gbdt", False)
    with pytest.raises(ValueError, match=r"--set: embedding.use_length: expected bool"):
        cfg.with_overrides(["embedding.use_length=maybe"])


def test_capped_sources_are_nested_samples():
    """name:N samples a prefix of what name:M (M > N) samples: a pool shrunk or grown keeps its records."""
    import random

    from clfjudge.models.heads import HEADS
    from clfjudge.training.data import load_source_records

    head = HEADS.get("cls3")()
    small, stats = load_source_records("llmbar-natural:10", head, random.Random(0))
    large, _ = load_source_records("llmbar-natural:40", head, random.Random(0))
    assert [r.id for r in small] == [r.id for r in large[:10]] and stats["used"] == 10
    assert len({r.id for r in large}) == 40
