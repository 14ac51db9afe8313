"""Heads and the shared encoding: losses on hand cases, output mapping, position invariance of the reward
head, decoder last-token pooling under padding, truncation within max_length."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from clfjudge.data.records import Loc, PairRecord, PointRecord, Verdict
from clfjudge.models.backbones import load_seq_cls, load_tokenizer, resolve_backbone
from clfjudge.models.heads import (
    HEADS,
    Cls3Head,
    RegressionHead,
    RewardHead,
    bradley_terry_loss,
    davidson_probs,
    fit_davidson,
)
from clfjudge.prompts.encoding import Encoder, collate
from clfjudge.prompts.truncation import TruncationPolicy

LONG = "Paris is the capital city of France and a large river runs through it. " * 40


def pair(verdict: str = "A", answer_a: str = "Paris.", answer_b: str = "The cat sat on the mat.") -> PairRecord:
    return PairRecord.build(Loc("mem", 1), question="What is the capital of France?", answer_a=answer_a,
                            answer_b=answer_b, verdict=verdict)


def max_len(info) -> int:
    # tiny encoders have 128 positions; the tiny LLaMA (RoPE) takes the long "[INST]" template
    return 128 if info.family == "encoder" else 400


def _logits(head, model, tokenizer, encoder, records):
    batch = collate(tokenizer, [head.features(r, encoder) for r in records],
                    torch.float32 if head.label_is_float else torch.long)
    batch.pop("labels")
    with torch.no_grad():
        return model(**batch).logits.numpy()


def test_registry_names():
    assert set(HEADS.names()) >= {"cls3", "regression", "reward"}


def test_bradley_terry_loss_hand_case():
    r_a, r_b = torch.tensor([2.0, 2.0, 2.0]), torch.tensor([0.5, 0.5, 0.5])
    loss = bradley_terry_loss(r_a, r_b, torch.tensor([1.0, 0.0, 0.5]))
    sig = 1 / (1 + math.exp(-1.5))
    assert loss[0].item() == pytest.approx(-math.log(sig), abs=1e-6)  # A better: -log sigma(rA - rB)
    assert loss[1].item() == pytest.approx(-math.log(1 - sig), abs=1e-6)  # B better: -log sigma(rB - rA)
    assert loss[2].item() == pytest.approx(0.5 * (loss[0] + loss[1]).item(), abs=1e-6)  # tie: both halves


def test_reward_head_loss_reads_interleaved_logits():
    head = RewardHead()
    logits = torch.tensor([[2.0], [0.5], [0.0], [1.0]])  # pair 0: rA=2, rB=.5; pair 1: rA=0, rB=1
    labels = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # [target, offset_A, offset_B] per pair
    loss = head.loss({"logits": logits}, labels)
    expected = (-math.log(1 / (1 + math.exp(-1.5))) - math.log(1 / (1 + math.exp(-1.0)))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    # with gradient accumulation the Trainer passes the label entries of the whole accumulated batch (3 a pair)
    assert head.loss({"logits": logits}, labels, num_items_in_batch=12).item() == \
        pytest.approx(expected / 2, abs=1e-6)
    # length offsets enter the margin: pair 1 with offset_B = -1 becomes a tie of rewards 0 and 1 - 1
    shifted = head.loss({"logits": logits}, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0]]))
    assert shifted.item() == pytest.approx((-math.log(1 / (1 + math.exp(-1.5))) + math.log(2)) / 2, abs=1e-6)


def test_length_coefficient_fits_the_length_preference():
    """beta of the length-only Bradley-Terry fit: positive when longer answers win, negative when they lose,
    and offsets enter every prediction through adjust()."""
    short, long_ = "Paris.", "Paris is the capital of France, on the Seine."
    longer_wins = [pair("A", long_, short)] * 8 + [pair("B", short, long_)] * 8 + [pair("A", short, long_)] * 2
    head = RewardHead(length_covariate=True)
    head.fit(longer_wins)
    assert head.length_coef > 0
    head.fit([pair("B", long_, short)] * 8 + [pair("A", short, long_)] * 8)  # the shorter answer wins
    assert head.length_coef < 0
    head = RewardHead(length_coef=2.0)
    adjusted = head.adjust(np.zeros((2, 1)), [pair("A", long_, short)])
    assert adjusted[0, 0] - adjusted[1, 0] == pytest.approx(2.0 * (math.log1p(len(long_)) - math.log1p(len(short))))
    assert head.outputs(adjusted).verdicts() == [Verdict.A]
    card = type("Card", (), {"calibration": head.card_fields()["calibration"]})
    assert RewardHead.from_card(card).length_coef == 2.0
    np.testing.assert_array_equal(RewardHead().adjust(np.ones((2, 1)), [pair()]), np.ones((2, 1)))  # off: as is


def test_tie_loss_is_minimal_at_equal_rewards():
    d = torch.linspace(-3, 3, 61)
    loss = bradley_terry_loss(d, torch.zeros_like(d), torch.full_like(d, 0.5))
    assert d[int(loss.argmin())].item() == pytest.approx(0.0, abs=1e-6)


def test_davidson_argmax_is_a_tie_threshold():
    margins = np.linspace(-5, 5, 201)
    head = RewardHead(scale=1.3, nu=2.0)
    verdicts = head.outputs(np.stack([margins, np.zeros_like(margins)], axis=1)).verdicts()
    threshold = head.tie_threshold()
    assert threshold == pytest.approx(2 * math.log(2.0) / 1.3)
    for m, v in zip(margins, verdicts):
        expected = Verdict.TIE if abs(m) < threshold else Verdict.A if m > 0 else Verdict.B
        if abs(abs(m) - threshold) > 1e-9:
            assert v is expected, m


def test_without_a_tie_model_p_tie_is_exactly_zero_and_equal_rewards_tie():
    """nu = 0 (an uncalibrated reward model): Bradley-Terry, no tie probability at all; equal rewards (identical
    answers) are a tie, not a win for the first answer."""
    outputs = RewardHead().outputs(np.array([[1.0, 1.0], [3.0, 1.0], [1.0, 3.0], [-800.0, 800.0]]))
    assert outputs.p_tie.tolist() == [0.0] * 4
    assert outputs.p_a[0] == outputs.p_b[0] == 0.5
    assert outputs.verdicts() == [Verdict.TIE, Verdict.A, Verdict.B, Verdict.B]
    assert Cls3Head().outputs(np.array([[0.0, 2.0, 2.0]])).verdicts() == [Verdict.TIE]  # P(A) == P(B) > P(TIE)


def test_fit_davidson_recovers_parameters():
    rng = np.random.default_rng(0)
    margins = rng.normal(0, 2, 4000)
    p = davidson_probs(margins, 1.5, 0.8)
    draws = [rng.choice(3, p=row) for row in p]
    verdicts = [(Verdict.A, Verdict.TIE, Verdict.B)[k] for k in draws]
    scale, nu = fit_davidson(margins, verdicts)
    assert scale == pytest.approx(1.5, rel=0.15)
    assert nu == pytest.approx(0.8, rel=0.15)
    # no ties in the data: the tie weight collapses and the head never predicts one
    scale, nu = fit_davidson(margins, [Verdict.A if m > 0 else Verdict.B for m in margins])
    assert RewardHead(scale, nu).tie_threshold() < 0


def test_cls3_outputs_follow_the_study_class_order():
    head = Cls3Head()
    logits = np.array([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0]])  # TIE 0, A 1, B 2
    assert head.outputs(logits).verdicts() == [Verdict.TIE, Verdict.A, Verdict.B]
    assert [head.label(pair(v)) for v in ("TIE", "A", "B")] == [0, 1, 2]
    assert head.card_fields()["label_map"] == {"0": "TIE", "1": "A", "2": "B"}


def test_regression_normalises_by_scale_and_maps_back():
    head = RegressionHead()
    recs = [PointRecord.build(Loc("mem", i), question="q", answer="a", score=s, scale=(1, 5))
            for i, s in enumerate([1, 3, 5])]
    head.fit(recs)
    assert [head.label(r) for r in recs] == [0.0, 0.5, 1.0]
    assert head.outputs(np.array([[0.0], [0.5], [1.0], [1.7]])).scores.tolist() == [1.0, 3.0, 5.0, 5.0]
    assert RegressionHead.from_card(type("Card", (), {"score_scale": [1.0, 5.0]})()).scale == (1.0, 5.0)
    mixed = recs + [PointRecord.build(Loc("mem", 9), question="q", answer="a", score=7, scale=(1, 10))]
    with pytest.raises(ValueError, match="several score scales"):
        head.fit(mixed)


def test_regression_select_turns_scored_pairs_into_points_and_counts_the_rest():
    scored = PairRecord.build(Loc("mem", 1), question="q", answer_a="a", answer_b="b", scores=[8, 3],
                              meta={"scale": [1, 10]})
    points, excluded = RegressionHead().select([scored, pair("A")])
    assert [p.score for p in points] == [8.0, 3.0]
    assert excluded == {"pair without a score pair (regression head needs scores)": 1}
    kept, excluded = Cls3Head().select([points[0], pair("A")])
    assert len(kept) == 1 and sum(excluded.values()) == 1


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_deberta_dir", "tiny_llama_dir"])
def test_reward_head_is_position_invariant(fixture, request):
    info = resolve_backbone(str(request.getfixturevalue(fixture)))
    tokenizer = load_tokenizer(info)
    head = RewardHead(scale=1.0, nu=0.5)
    model = load_seq_cls(info, head.num_labels, head.problem_type, tokenizer=tokenizer).eval()
    encoder = Encoder(tokenizer, head.default_scheme(info.family), TruncationPolicy(max_length=max_len(info)))
    records = [pair("A", answer_a=LONG), pair("B", answer_b="Lyon, which is a city.")]
    fwd = head.outputs(_logits(head, model, tokenizer, encoder, records))
    rev = head.outputs(_logits(head, model, tokenizer, encoder, [r.swapped() for r in records]))
    np.testing.assert_allclose(fwd.margin, -rev.margin, atol=1e-5)
    np.testing.assert_allclose(fwd.p_a, rev.p_b, atol=1e-5)
    np.testing.assert_allclose(fwd.p_tie, rev.p_tie, atol=1e-5)
    # each answer gets the full length budget: the long answer is cut, the question/short answer is not
    assert encoder.report.truncated == 2 and encoder.report.to_dict()["fields"].keys() == {"answer"}


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_decoder_pools_the_last_real_token_under_padding(tiny_llama_dir, padding_side):
    info = resolve_backbone(str(tiny_llama_dir))
    tokenizer = load_tokenizer(info, padding_side=padding_side)
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    head = Cls3Head()
    model = load_seq_cls(info, head.num_labels, head.problem_type, tokenizer=tokenizer).eval()
    assert model.config.pad_token_id == tokenizer.pad_token_id
    encoder = Encoder(tokenizer, head.default_scheme(info.family), TruncationPolicy(max_length=max_len(info)))
    short, long = pair("A"), pair("B", answer_a=LONG[:300])
    alone = _logits(head, model, tokenizer, encoder, [short])
    padded = _logits(head, model, tokenizer, encoder, [short, long])
    features = [head.features(r, encoder) for r in (short, long)]
    assert len(features[0]["input_ids"][0]) < len(features[1]["input_ids"][0])  # the short one is padded
    np.testing.assert_allclose(padded[0], alone[0], atol=1e-5)


@pytest.mark.parametrize("fixture,max_length", [("tiny_bert_dir", 128), ("tiny_deberta_dir", 256)])
def test_encoding_truncates_within_max_length(fixture, max_length, request):
    info = resolve_backbone(str(request.getfixturevalue(fixture)))
    tokenizer = load_tokenizer(info)
    encoder = Encoder(tokenizer, "encoder-pair", TruncationPolicy(max_length=max_length))
    records = [pair("A", answer_a=LONG, answer_b=LONG[::-1]), pair("B")]
    for rec in records:
        assert len(encoder.encode(rec)["input_ids"]) <= max_length
    assert encoder.report.records == 2 and encoder.report.truncated == 1
    assert set(encoder.report.to_dict()["fields"]) == {"answer_a", "answer_b"}
    text = encoder.text(records[0])
    assert text.count("…") == 2 and text.startswith("Please rate")  # both answers cut, none dropped


def test_encoder_drops_the_reference_unless_asked(tiny_bert_dir):
    tokenizer = load_tokenizer(resolve_backbone(str(tiny_bert_dir)))
    rec = PairRecord.build(Loc("mem", 1), question="q", answer_a="a", answer_b="b", verdict="A",
                           reference="the reference answer")
    policy = TruncationPolicy(max_length=128)
    assert "Reference" not in Encoder(tokenizer, "encoder-pair", policy).text(rec)
    assert "Reference" in Encoder(tokenizer, "encoder-pair", policy, use_reference=True).text(rec)
