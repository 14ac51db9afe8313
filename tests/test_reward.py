"""The in-loop reward adapter and best-of-n, on tiny real judges."""
from __future__ import annotations

import pytest
from tiny_judges import make_judge

from clfjudge.judges.base import Judge
from clfjudge.serving.reward import as_text, best_of_n, reward_function


@pytest.fixture(scope="module")
def judges(tiny_bert_dir, tmp_path_factory):
    return {head: Judge.load(make_judge(tiny_bert_dir, tmp_path_factory.mktemp(head), head))
            for head in ("cls3", "reward", "regression")}


def test_pointwise_reward_equals_the_judges_score(judges):
    for head in ("reward", "regression"):
        fn = reward_function(judges[head])
        got = fn(prompts=["Name a prime.", "Say hi."], completions=["7", "hello"])
        want = [judges[head].score("Name a prime.", "7").value, judges[head].score("Say hi.", "hello").value]
        assert got == pytest.approx(want, abs=1e-5)


def test_pairwise_reward_needs_and_uses_a_reference(judges):
    fn = reward_function(judges["cls3"])
    with pytest.raises(ValueError, match="reference"):
        fn(prompts=["q"], completions=["a"])
    got = fn(prompts=["q"], completions=["a"], reference=["b"])
    c = judges["cls3"].compare("q", "a", "b", symmetric=True)
    assert got == pytest.approx([c.p_a - c.p_b], abs=1e-6)


def test_conversational_formats():
    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Name a prime."}]
    assert as_text(prompt, "prompts") == "Name a prime."
    assert as_text([{"role": "assistant", "content": "7"}], "completions") == "7"
    with pytest.raises(ValueError, match="completions"):
        as_text(42, "completions")


def test_best_of_n(judges):
    cands = ["7", "9 is prime", "2 is the smallest prime."]
    for judge in judges.values():
        best, scores = best_of_n(judge, "Name a prime.", cands)
        assert len(scores) == 3 and scores[best] == max(scores)
