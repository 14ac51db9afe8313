"""The embedding judge and the shared features / baselines: fast unit tests on tiny synthetic records with the
real (small) MiniLM encoder, plus a short real check on a slice of PandaLM."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from clfjudge.batching import Budget
from clfjudge.card import JudgeCard
from clfjudge.data.records import Loc, PairRecord, PointRecord, Verdict
from clfjudge.embedders.sentence import TextEmbedder
from clfjudge.judges.base import Judge
from clfjudge.judges.embedding import PAIR_FEATURES, EmbeddingModel, PairView, neighbour_negatives, verdicts_from_proba
from clfjudge.judges.features import (
    char_lengths,
    information_lengths,
    lengths,
    log_information_length_difference,
    log_length_difference,
    longer_answer_wins,
    majority_score,
    majority_verdict,
    row_cosine,
    word_lengths,
)
from clfjudge.judges.linear_head import PickleRefused, load_head

FACTS = [
    ("the Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889."),
    ("photosynthesis", "Photosynthesis is how plants turn light, water and carbon dioxide into sugar and oxygen."),
    ("the Pacific Ocean", "The Pacific Ocean is the largest and deepest ocean on Earth."),
    ("Python lists", "A Python list is a mutable ordered sequence; append adds an item at the end."),
    ("the French Revolution", "The French Revolution began in 1789 and ended the absolute monarchy in France."),
    ("black holes", "A black hole is a region of spacetime whose gravity is so strong that light cannot escape."),
    ("the violin", "The violin is a bowed string instrument with four strings tuned in fifths."),
    ("vaccines", "Vaccines train the immune system to recognise a pathogen without causing the disease."),
    ("the Great Wall of China", "The Great Wall of China is a series of fortifications built across northern China."),
    ("inflation", "Inflation is the rate at which the general level of prices for goods and services rises."),
    ("DNA", "DNA is a double-helix molecule that carries the genetic instructions of living organisms."),
    ("the Moon", "The Moon is Earth's only natural satellite and causes the ocean tides."),
    ("coffee", "Coffee is a brewed drink made from roasted coffee beans, rich in caffeine."),
    ("volcanoes", "A volcano is a rupture in the crust through which lava, ash and gases escape."),
    ("the Roman Empire", "The Roman Empire ruled the Mediterranean world from 27 BC until the fall of Rome in 476."),
    ("chess", "Chess is a two-player strategy board game played on an eight-by-eight grid."),
    ("rainbows", "A rainbow appears when sunlight is refracted and reflected inside raindrops."),
    ("the heart", "The heart is a muscular organ that pumps blood through the circulatory system."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ("honey bees", "Honey bees live in colonies and make honey from flower nectar."),
    ("electric cars", "Electric cars are powered by batteries and electric motors instead of petrol engines."),
    ("the piano", "The piano is a keyboard instrument whose hammers strike strings when keys are pressed."),
    ("glaciers", "A glacier is a persistent body of dense ice that moves slowly under its own weight."),
    ("the printing press", "Gutenberg's printing press, around 1440, made books cheap to produce in Europe."),
]
LOC = Loc("synthetic.jsonl", 1)


def _pairs(facts, start: int = 0, ties: bool = False) -> list[PairRecord]:
    """Relevant answer vs the answer to another question (label: the relevant one), alternating sides."""
    out = []
    for i, (topic, fact) in enumerate(facts):
        other = facts[(i + 7) % len(facts)][1]
        q = f"Tell me about {topic}."
        a, b, verdict = (fact, other, "A") if (i + start) % 2 == 0 else (other, fact, "B")
        out.append(PairRecord.build(LOC, id=f"p{start + i}", question=q, answer_a=a, answer_b=b, verdict=verdict,
                                    source="synthetic"))
        if ties:
            out.append(PairRecord.build(LOC, id=f"t{start + i}", question=q, answer_a=fact, answer_b=fact + " ",
                                        verdict="TIE", source="synthetic"))
    return out


EVASIONS = ("I am not sure what {t} is.", "Sorry, I cannot help with questions about {t}.",
            "That is a good question about {t}; you could look it up.")


def _evasive_pairs(facts, start: int = 0) -> list[PairRecord]:
    """The answer vs an evasion of the same question (label: the answer), alternating sides. Unlike ``_pairs``
    (where every fact is once the right and once the wrong answer, so the best *linear reward* is zero), a
    reward r(answer) can learn these."""
    out = []
    for i, (topic, fact) in enumerate(facts):
        evasion = EVASIONS[i % len(EVASIONS)].format(t=topic)
        a, b, verdict = (fact, evasion, "A") if (i + start) % 2 == 0 else (evasion, fact, "B")
        out.append(PairRecord.build(LOC, id=f"e{start + i}", question=f"Tell me about {topic}.", answer_a=a,
                                    answer_b=b, verdict=verdict, source="synthetic"))
    return out


@pytest.fixture(scope="module")
def embedder() -> TextEmbedder:
    return TextEmbedder("minilm")


@pytest.fixture(scope="module")
def pair_judge(embedder) -> EmbeddingModel:
    return EmbeddingModel(embedder=embedder, head_params={"C": 1.0}).fit(_pairs(FACTS[:18]))


# ---------------------------------------------------------------------------------------------------
# judges/features.py


def test_lengths_and_differences():
    texts = ["one two  three", "", "a"]
    assert char_lengths(texts).tolist() == [14, 0, 1]
    assert word_lengths(texts).tolist() == [3, 0, 1]
    assert lengths(texts, "words").tolist() == [3, 0, 1]
    with pytest.raises(ValueError, match="unknown length unit"):
        lengths(texts, "tokens")
    d = log_length_difference(["long answer here", "x"], ["short", "xx yy"])
    assert d.shape == (2, 2)
    np.testing.assert_allclose(d, -log_length_difference(["short", "xx yy"], ["long answer here", "x"]))
    assert d[0, 0] > 0 and d[1, 1] < 0


def test_information_length_discounts_repetition():
    answer = "Paris is the capital of France and its largest city."
    padded = " ".join([answer] * 8)
    varied = " ".join(f"{answer[:-1]}, fact {i}: {w}." for i, w in enumerate("abcdefgh"))
    info = information_lengths(["", answer, padded, varied, "caf\ud83d"])  # a lone surrogate is measured
    assert info[0] == 0 and info[1] > 0 and info[4] > 0
    # eight copies cost 8x the characters but barely more information; varied text of that length costs more
    assert len(padded) > 7 * len(answer) and info[2] < 1.5 * info[1] < info[3]
    d = log_information_length_difference([padded, answer], [answer, varied])
    assert d.shape == (2, 1)
    np.testing.assert_allclose(d, -log_information_length_difference([answer, varied], [padded, answer]))


def test_info_length_diff_is_a_length_group_of_one_side_terms(embedder):
    pairs = _evasive_pairs(FACTS[:18])
    options = dict(embedder=embedder, features=["diff", "info_length_diff"], use_length=False, head_params={"C": 1.0})
    judge = EmbeddingModel(**options).fit(pairs)
    assert judge.decomposable and judge.widths_[-1] == 1
    test = _evasive_pairs(FACTS[18:], start=18)
    r_a, r_b = (judge.rewards([PointRecord.build(LOC, question=p.question, answer=getattr(p, side), unlabelled=True)
                               for p in test]) for side in ("answer_a", "answer_b"))
    proba = judge.predict_proba(test)
    np.testing.assert_array_equal(np.sign(proba[:, 0] - proba[:, 2]), np.sign(r_a - r_b))
    assert (np.sign(r_a - r_b) == [1 if p.verdict == "A" else -1 for p in test]).all()
    # length_at_prediction scales it as it scales the character-length groups
    removed = EmbeddingModel(**options, length_at_prediction=0.0).fit(pairs)
    assert judge.model_.coef[:, -1].any() and not removed.model_.coef[:, -1].any()
    np.testing.assert_array_equal(removed.model_.coef[:, :-1], judge.model_.coef[:, :-1])


def test_row_cosine():
    u = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    v = np.array([[0.0, 2.0], [2.0, 2.0], [1.0, 0.0]])
    np.testing.assert_allclose(row_cosine(u, v), [0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="shapes differ"):
        row_cosine(u, v[:2])


def test_baselines():
    pairs = [
        PairRecord.build(LOC, question="q", answer_a="a much longer answer", answer_b="short", verdict="B"),
        PairRecord.build(LOC, question="q", answer_a="tiny", answer_b="a longer one", verdict="B"),
        PairRecord.build(LOC, question="q", answer_a="same", answer_b="four", verdict="TIE"),
    ]
    assert longer_answer_wins(pairs) == [Verdict.A, Verdict.B, Verdict.TIE]
    assert longer_answer_wins([p.swapped() for p in pairs]) == [Verdict.B, Verdict.A, Verdict.TIE]
    assert longer_answer_wins(pairs, unit="words") == [Verdict.A, Verdict.B, Verdict.TIE]
    assert majority_verdict(pairs) == Verdict.B
    assert majority_verdict(pairs[1:]) == Verdict.B  # equal counts resolve A, then B, then TIE
    assert majority_verdict([pairs[2], pairs[0].swapped()]) == Verdict.A
    with pytest.raises(ValueError, match="at least one labelled pair"):
        majority_verdict([])
    points = [PointRecord.build(LOC, question="q", answer="a", score=s) for s in (4, 2, 4, 2, 5)]
    assert majority_score(points) == 2.0  # equal counts: the smallest score


# ---------------------------------------------------------------------------------------------------
# feature groups and the tie rule (no model needed)


@pytest.mark.parametrize("name", PAIR_FEATURES.names())
def test_pair_feature_groups_are_symmetric_or_antisymmetric(name):
    rng = np.random.default_rng(0)
    q, a, b = (rng.normal(size=(4, 8)) for _ in range(3))
    a_stats, b_stats = (rng.normal(size=(4, 7)) for _ in range(2))
    a_verdict, b_verdict = (rng.normal(size=(4, 2)) for _ in range(2))
    view = PairView(q, a, b, ["what?", "why is it so?", "q", "hm"], ["a b c", "x", "long " * 9, "z"],
                    ["d", "e f g h", "y", "short z"], a_stats, b_stats, a_verdict, b_verdict)
    group = PAIR_FEATURES.get(name)
    forward, backward = group.compute(view), group.compute(view.swapped())
    assert forward.shape == backward.shape and forward.shape[0] == 4
    expected = -forward if group.symmetry == "anti" else forward
    np.testing.assert_allclose(backward, expected, atol=1e-12)


def test_verdicts_from_proba_tie_rule():
    proba = np.array([[0.6, 0.1, 0.3], [0.2, 0.3, 0.5], [0.2, 0.5, 0.3], [0.4, 0.2, 0.4]])
    assert verdicts_from_proba(proba) == [Verdict.A, Verdict.B, Verdict.TIE, Verdict.TIE]


# ---------------------------------------------------------------------------------------------------
# TextEmbedder (real MiniLM)


def test_embedder_encodes_each_distinct_text_once(embedder, monkeypatch, tmp_path):
    fresh = TextEmbedder("minilm")
    fresh._model = embedder.model  # reuse the loaded weights
    calls = []
    original = fresh.model.encode
    monkeypatch.setattr(fresh.model, "encode", lambda texts, **kw: calls.append(list(texts)) or original(texts, **kw))
    emb = fresh.embed(["alpha", "beta", "alpha", "beta", "gamma"])
    assert calls == [["alpha", "beta", "gamma"]]
    assert emb.shape == (5, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(emb[0], emb[2])
    fresh.embed(["gamma", "alpha"])
    assert len(calls) == 1  # nothing new to encode
    with pytest.raises(ValueError, match="at least one text"):
        fresh.embed([])

    path = fresh.save_cache(tmp_path / "minilm.npz")
    other = TextEmbedder("minilm")
    assert other.load_cache(path) == 3
    np.testing.assert_array_equal(other.embed(["beta"]), emb[1:2])  # served from the cache, no model load
    assert other._model is None
    with pytest.raises(ValueError, match="embedding cache of encoder 'minilm'"):
        TextEmbedder("mpnet").load_cache(path)


# ---------------------------------------------------------------------------------------------------
# EmbeddingModel (real MiniLM, synthetic records)


def test_pair_judge_learns_relevance_and_is_position_invariant(pair_judge):
    held_out = _pairs(FACTS[18:], start=18)
    assert pair_judge.training_["n_records"] == 18 and pair_judge.training_["n_rows"] == 36
    verdicts = pair_judge.predict(held_out)
    accuracy = np.mean([v == r.verdict for v, r in zip(verdicts, held_out)])
    assert accuracy >= 5 / 6

    proba = pair_judge.predict_proba(held_out)
    assert proba.shape == (6, 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(proba[:, 1], 0.0)  # no ties in training: P(TIE) is 0
    swapped = [p.swapped() for p in held_out]
    np.testing.assert_allclose(pair_judge.predict_proba(swapped), proba[:, ::-1], atol=1e-12)
    assert pair_judge.predict(swapped) == [v.swapped() for v in verdicts]


@pytest.mark.parametrize("head", ["logreg", "gbdt"])
def test_pair_heads_with_ties(embedder, head):
    judge = EmbeddingModel(embedder=embedder, head=head, head_params={"max_iter": 30} if head == "gbdt" else None)
    judge.fit(_pairs(FACTS, ties=True))
    assert judge.training_["labels"] == {"A": 12, "B": 12, "TIE": 24}
    pairs = _pairs(FACTS[:6], ties=True)
    proba = judge.predict_proba(pairs)
    assert (proba[:, 1] > 0).all()
    np.testing.assert_allclose(judge.predict_proba([p.swapped() for p in pairs]), proba[:, ::-1], atol=1e-12)


def test_use_length_switch(embedder):
    """Answers that differ only by trailing spaces embed identically: only the length features tell them apart."""
    def pairs(start):
        out = []
        for i, (topic, fact) in enumerate(FACTS):
            longer = fact + " " * 40
            a, b, verdict = (longer, fact, "A") if (i + start) % 2 == 0 else (fact, longer, "B")
            out.append(PairRecord.build(LOC, id=f"l{i}", question=f"About {topic}?", answer_a=a, answer_b=b,
                                        verdict=verdict))
        return out

    train, test = pairs(0), pairs(1)
    # one batch for all answers: equal token ids then give bit-identical vectors (across batches of other shapes
    # they differ by float noise, which the scaler would blow up into a signal for the blind judge)
    one_batch = TextEmbedder("minilm", budget=Budget(128))
    one_batch._model = embedder.model
    with_length = EmbeddingModel(embedder=one_batch, use_length=True, head_params={"C": 1.0}).fit(train)
    blind = EmbeddingModel(embedder=one_batch, use_length=False, head_params={"C": 1.0}).fit(train)
    assert with_length.training_["n_features"] - blind.training_["n_features"] == 8
    assert with_length.predict(test) == [r.verdict for r in test]
    assert blind.predict(test) == [Verdict.TIE] * len(test)  # P(A) == P(B) exactly


def test_point_judge_scores_relevance_within_scale(embedder):
    def points(facts, start):
        out = []
        for i, (topic, fact) in enumerate(facts):
            out.append(PointRecord.build(LOC, id=f"g{start + i}", question=f"Tell me about {topic}.", answer=fact,
                                         score=5, reference=fact))
            other = facts[(i + 5) % len(facts)][1]
            out.append(PointRecord.build(LOC, id=f"b{start + i}", question=f"Tell me about {topic}.", answer=other,
                                         score=1, reference=fact))
        return out

    judge = EmbeddingModel(arity="point", embedder=embedder).fit(points(FACTS[:18], 0))
    assert judge.head == "ridge" and judge.scale_ == (1.0, 5.0)
    test = points(FACTS[18:], 18)
    scores = judge.predict(test)
    assert scores.shape == (12,) and ((scores >= 1) & (scores <= 5)).all()
    gold = np.array([r.score for r in test])
    assert scores[gold == 5].mean() > scores[gold == 1].mean() + 1.0

    with_ref = EmbeddingModel(arity="point", embedder=embedder, features=("cos", "ref_cos"), head="gbdt",
                              head_params={"max_iter": 20}).fit(points(FACTS[:18], 0))
    assert with_ref.predict(test).shape == (12,)
    no_ref = [PointRecord.build(LOC, id="noref", question="q?", answer="a", score=3)]
    with pytest.raises(ValueError, match="record noref: field 'reference' is missing"):
        with_ref.predict(no_ref)


def test_save_and_load_round_trip(pair_judge, embedder, tmp_path):
    pair_judge.save(tmp_path / "judge", validation={"accuracy": 1.0})
    card = JudgeCard.load(tmp_path / "judge")
    assert (card.kind, card.arity, card.backbone, card.max_length) == ("embedding", "pair", "minilm", 256)
    assert card.label_map == {"proba_columns": ["A", "TIE", "B"]}
    assert card.runtime["sklearn_model"] == "head.safetensors" and card.validation == {"accuracy": 1.0}
    assert card.runtime["format"] == "safetensors-linear"  # arrays, not a pickle
    assert card.training["sources"] == {"train": {"synthetic": {"used": 18}}}  # the training cards' layout
    assert sorted(p.name for p in (tmp_path / "judge").iterdir()) == ["head.safetensors", "judge_card.json"]

    loaded = EmbeddingModel.load(tmp_path / "judge", embedder=embedder)
    pairs = _pairs(FACTS[18:], start=18)
    np.testing.assert_array_equal(loaded.predict_proba(pairs), pair_judge.predict_proba(pairs))
    assert loaded.groups == pair_judge.groups

    data = json.loads((tmp_path / "judge" / "judge_card.json").read_text())
    data["kind"] = "fine-tuned"
    (tmp_path / "judge" / "judge_card.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="field 'kind' is 'fine-tuned'"):
        EmbeddingModel.load(tmp_path / "judge")


def test_bad_inputs_are_named(embedder, pair_judge):
    with pytest.raises(ValueError, match="unknown arity .triple."):
        EmbeddingModel(arity="triple")
    with pytest.raises(KeyError, match="unknown pair head 'ridge'"):
        EmbeddingModel(head="ridge")
    with pytest.raises(KeyError, match="unknown pair feature group 'q'"):
        EmbeddingModel(features=("q",))
    with pytest.raises(ValueError, match="switched by use_length"):
        EmbeddingModel(features=("diff", "length_diff"))
    with pytest.raises(ValueError, match="embedder uses backbone 'minilm'"):
        EmbeddingModel(backbone="mpnet", embedder=embedder)
    with pytest.raises(RuntimeError, match="not fitted"):
        EmbeddingModel(embedder=embedder).predict(_pairs(FACTS[:2]))
    unlabelled = PairRecord.build(LOC, id="u1", question="q", answer_a="a", answer_b="b", unlabelled=True)
    with pytest.raises(ValueError, match="record u1: field 'verdict' is missing"):
        EmbeddingModel(embedder=embedder).fit([unlabelled])
    point = PointRecord.build(LOC, id="pt1", question="q", answer="a", score=3)
    with pytest.raises(ValueError, match="record pt1: a pair judge needs PairRecord"):
        pair_judge.predict([point])
    with pytest.raises(ValueError, match="all training pairs are ties"):
        EmbeddingModel(embedder=embedder).fit([r for r in _pairs(FACTS[:3], ties=True) if r.verdict == Verdict.TIE])
    with pytest.raises(ValueError, match="predict_proba is for pair judges"):
        EmbeddingModel(arity="point", embedder=embedder).predict_proba([])


def test_neighbour_negatives_pair_a_question_with_a_neighbours_answer(embedder):
    records = _pairs(FACTS[:8], ties=True)
    negatives = neighbour_negatives(records, embedder, seed=1)
    assert len(negatives) == 8 and {r.source for r in negatives} == {"neighbour-negatives"}
    own = {f"Tell me about {topic}.": fact for topic, fact in FACTS[:8]}
    for r in negatives:
        good, bad = (r.answer_a, r.answer_b) if r.verdict == Verdict.A else (r.answer_b, r.answer_a)
        assert good == own[r.question]
        assert bad == own[r.meta["neighbour_question"]] and r.meta["neighbour_question"] != r.question
    assert {r.verdict for r in negatives} == {Verdict.A, Verdict.B}
    assert [r.answer_a for r in neighbour_negatives(records, embedder, seed=1)] == [r.answer_a for r in negatives]
    with pytest.raises(ValueError, match="at least two distinct questions"):
        neighbour_negatives(records[:1], embedder)


# ---------------------------------------------------------------------------------------------------
# short real checks (real data slices, real MiniLM)


@pytest.mark.slow
def test_real_pandalm_slice(embedder, tmp_path):
    """On real pairs: exact position invariance, a save/load round trip, and a length-only head that learns
    PandaLM's human preference for the longer answer (an accuracy on 100 pairs would be too noisy to test)."""
    from clfjudge.data import sources
    from clfjudge.data.splits import group_kfold
    from clfjudge.metrics import position_consistency

    records = sources.load("pandalm-test").records[:400]
    train_idx, test_idx = group_kfold(records, 4, seed=0)[0]
    train, test = [records[i] for i in train_idx], [records[i] for i in test_idx]
    judge = EmbeddingModel(embedder=embedder).fit(train)
    proba = judge.predict_proba(test)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    forward, backward = judge.predict(test), judge.predict([p.swapped() for p in test])
    assert position_consistency(forward, backward).consistency == 1.0
    judge.save(tmp_path / "pandalm")
    np.testing.assert_array_equal(EmbeddingModel.load(tmp_path / "pandalm", embedder).predict_proba(test), proba)

    length_only = EmbeddingModel(embedder=embedder, features=()).fit(train).predict(test)
    decisive = [(v, lw) for v, lw in zip(length_only, longer_answer_wins(test)) if v != Verdict.TIE]
    assert len(decisive) > len(test) / 2
    assert np.mean([v == lw for v, lw in decisive]) > 0.9


@pytest.mark.slow
def test_real_prometheus_vicuna_regression(embedder):
    from clfjudge.data import sources
    from clfjudge.data.splits import group_kfold
    from clfjudge.metrics import correlations

    records = sources.load("prometheus-vicuna").records
    train_idx, test_idx = group_kfold(records, 4, seed=0)[0]
    judge = EmbeddingModel(arity="point", embedder=embedder).fit([records[i] for i in train_idx])
    test = [records[i] for i in test_idx]
    scores = judge.predict(test)
    assert ((scores >= 1) & (scores <= 5)).all()
    assert correlations([r.score for r in test], scores.tolist()).pearson > 0.2


class _Planted:
    """Unpickling this object writes a marker file: stands for any code an attacker puts in a pickle."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code from the judge directory ran')",))


def test_a_planted_pickle_is_not_executed_by_default(tmp_path, pair_judge):
    judge_dir = pair_judge.save(tmp_path / "judge")
    marker = tmp_path / "pwned"
    with open(judge_dir / "head.joblib", "wb") as f:
        pickle.dump(_Planted(str(marker)), f)
    card = json.loads((judge_dir / "judge_card.json").read_text())
    card["runtime"].update(sklearn_model="head.joblib", format="joblib")  # what clfjudge 0.1 wrote
    (judge_dir / "judge_card.json").write_text(json.dumps(card))

    with pytest.raises(PickleRefused, match="--trust-pickle"):
        EmbeddingModel.load(judge_dir, embedder=pair_judge.embedder)
    with pytest.raises(PickleRefused):
        Judge.load(judge_dir)
    assert not marker.exists()
    # the flag says the caller trusts the directory: then (and only then) the pickle runs
    load_head(judge_dir, card["runtime"], trust_pickle=True)
    assert marker.exists()


def test_cli_refuses_a_pickled_head_unless_trusted(pair_judge, tmp_path, capsys):
    from clfjudge.cli import main

    judge_dir = pair_judge.save(tmp_path / "judge")
    import joblib

    joblib.dump(load_head(judge_dir, {"sklearn_model": "head.safetensors", "format": "safetensors-linear"}),
                judge_dir / "head.joblib")
    card = json.loads((judge_dir / "judge_card.json").read_text())
    card["runtime"].update(sklearn_model="head.joblib", format="joblib")
    (judge_dir / "judge_card.json").write_text(json.dumps(card))
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"question": "q?", "answer_a": "a", "answer_b": "b"}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["score", str(judge_dir), "--input", str(src), "--output", str(out)]) == 3  # the judge refused
    assert "--trust-pickle" in capsys.readouterr().err
    assert main(["score", str(judge_dir), "--input", str(src), "--output", str(out), "--trust-pickle"]) == 0


def test_training_weights_balance_length_and_sources():
    from clfjudge.judges.embedding import training_weights

    def pair(i, source, longer_wins):
        a, b = ("a long answer", "short") if i % 2 else ("short", "a long answer")
        verdict = ("A" if i % 2 else "B") if longer_wins else ("B" if i % 2 else "A")
        return PairRecord.build(LOC, id=f"w{i}", question="q", answer_a=a, answer_b=b, verdict=verdict,
                                source=source)

    records = [pair(i, "big", i < 6) for i in range(8)] + [pair(i, "small", True) for i in range(8, 10)]
    w = training_weights(records, ["length"])
    assert w[:6].sum() == pytest.approx(w[6:8].sum())  # longer wins = shorter wins within "big"
    np.testing.assert_allclose(w[8:], w[8])  # "small" has no shorter-wins pair to balance against
    w = training_weights(records, ["source"])
    assert w[:8].sum() == pytest.approx(w[8:].sum())
    assert w.mean() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown weighting"):
        training_weights(records, ["age"])


def test_length_at_prediction_removes_the_length_coefficients(embedder):
    pairs = _pairs(FACTS[:18])
    full = EmbeddingModel(embedder=embedder, head_params={"C": 1.0}).fit(pairs)
    removed = EmbeddingModel(embedder=embedder, head_params={"C": 1.0}, length_at_prediction=0.0).fit(pairs)
    # the same fitted model (equal up to float rounding, which differs between BLAS builds and CPUs)
    np.testing.assert_allclose(removed.fitted_.predict_proba(np.zeros((1, removed.model_.n_features_in_))),
                               full.fitted_.predict_proba(np.zeros((1, full.model_.n_features_in_))), atol=1e-12)
    length_columns = sum(w for g, w in zip(removed.groups, removed.widths_) if g.startswith("length"))
    assert length_columns == 8 and not removed.model_.coef[:, -length_columns:].any()
    assert full.model_.coef[:, -length_columns:].any()
    with pytest.raises(ValueError, match="needs use_length=True"):
        EmbeddingModel(embedder=embedder, use_length=False, length_at_prediction=0.0)


def test_a_judge_of_difference_features_scores_each_answer(embedder):
    """features diff + length_diff and a linear head: P(A) > P(B) exactly when r(A) > r(B), and the runtime
    offers score (the reward) beside compare."""
    from clfjudge.card import JudgeCard
    from clfjudge.judges.embedding import EmbeddingJudge

    judge = EmbeddingModel(embedder=embedder, features=("diff", "length_diff"), use_length=False,
                           head_params={"C": 1.0}).fit(_evasive_pairs(FACTS[:18]))
    assert judge.decomposable and judge.model_.coef.any()
    test = _evasive_pairs(FACTS[18:], start=18)
    r_a = judge.rewards([PointRecord.build(LOC, question=p.question, answer=p.answer_a, unlabelled=True)
                         for p in test])
    r_b = judge.rewards([PointRecord.build(LOC, question=p.question, answer=p.answer_b, unlabelled=True)
                         for p in test])
    proba = judge.predict_proba(test)
    np.testing.assert_array_equal(np.sign(proba[:, 0] - proba[:, 2]), np.sign(r_a - r_b))
    runtime = EmbeddingJudge(JudgeCard(kind="embedding", arity="pair", backbone="minilm", scheme="embedding",
                                     max_length=256), judge)
    assert runtime.tasks == {"compare", "score"}
    scores = runtime.score_batch([{"question": p.question, "answer": p.answer_a} for p in test])
    np.testing.assert_allclose([s.value for s in scores], r_a)
    assert not EmbeddingModel(embedder=embedder, head_params={"C": 1.0}).fit(_pairs(FACTS[:18])).decomposable


def test_neighbour_negatives_can_be_capped_and_length_matched(embedder):
    pairs = _pairs(FACTS[:18])
    capped = neighbour_negatives(pairs, embedder, limit=5, candidates=3)
    assert len(capped) == 5
    for r in capped:
        good, bad = (r.answer_a, r.answer_b) if r.verdict is Verdict.A else (r.answer_b, r.answer_a)
        own = {p.answer_a if p.verdict is Verdict.A else p.answer_b for p in pairs if p.question == r.question}
        assert good in own and bad not in own and r.meta["neighbour_question"] != r.question
