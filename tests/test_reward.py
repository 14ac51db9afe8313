"""The in-loop reward adapter and best-of-n, on tiny real judges."""
from __future__ import annotations

import pytest
from tiny_judges import make_judge

from clfjudge.data.records import RecordError
from clfjudge.judges.base import Judge
from clfjudge.serving.reward import as_record, best_of_n, reward_function


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


def test_a_conversational_prompt_reaches_the_judge_whole():
    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Name a prime."},
              {"role": "assistant", "content": "2."},
              {"role": "user", "content": [{"type": "text", "text": "Another."}]}]
    record = as_record(prompt, [{"role": "assistant", "content": [{"type": "text", "text": "7"}]}], 0)
    assert record.question == "System: be brief\n\nUser: Name a prime.\n\nAssistant: 2.\n\nUser: Another."
    assert record.answer == "7"
    assert as_record([{"role": "user", "content": "Name a prime."}], "7", 0).question == "Name a prime."
    with pytest.raises(RecordError, match="completion"):
        as_record("q", 42, 3)
    with pytest.raises(RecordError, match=r"reward batch:1: field 'prompt\[0\]\.content\[0\]': only text parts"):
        as_record([{"role": "user", "content": [{"type": "image", "image": "x.png"}]}], "7", 0)


@pytest.mark.parametrize("head", ["reward", "regression", "cls3"])
def test_an_earlier_turn_changes_the_reward(judges, head):
    """The system prompt and the earlier turns are part of what is judged: changing one changes the reward, and
    the last turn alone is judged differently from the whole conversation."""
    fn = reward_function(judges[head], reference="I do not know.")
    last = {"role": "user", "content": "And the next one?"}
    history = [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "2."}]
    prompts = [[{"role": "system", "content": "Answer in French."}, *history, last],
               [{"role": "system", "content": "Answer in Klingon."}, *history, last],
               [last]]
    completion = [{"role": "assistant", "content": "3."}]
    rewards = fn(prompts=prompts, completions=[completion] * 3)
    assert len(set(rewards)) == 3, rewards


def test_best_of_n(judges):
    cands = ["7", "9 is prime", "2 is the smallest prime."]
    for judge in judges.values():
        best, scores = best_of_n(judge, "Name a prime.", cands)
        assert len(scores) == 3 and scores[best] == max(scores)
