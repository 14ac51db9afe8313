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


# -- memory_items: the reader's memory, through the load options --------------------------------------------------

TOPICS = ["the Moon", "coffee", "chess", "glaciers"]


def _embedding_judge(directory, embedder):
    """A small embedding judge on ``embedder``, trained on a few answers against an evasion of the question."""
    from clfjudge.data.records import Loc, PairRecord
    from clfjudge.judges.embedding import EmbeddingModel

    pairs = [PairRecord.build(Loc("test", i + 1), id=str(i), question=f"Tell me about {t}.",
                              answer_a=f"{t} is well known." if i % 2 else "I do not know.",
                              answer_b="I do not know." if i % 2 else f"{t} is well known.",
                              verdict="A" if i % 2 else "B", source="test") for i, t in enumerate(TOPICS * 2)]
    model = EmbeddingModel(backbone=embedder.backbone, embedder=embedder, head_params={"C": 1.0})
    return model.fit(pairs).save(directory)


@pytest.fixture(scope="module")
def readers(tmp_path_factory):
    """Judge directories of every kind whose reader keeps readings, and how to reach each judge's reader."""
    from clfjudge import testing
    from clfjudge.embedders.decoder import DecoderEmbedder
    from clfjudge.embedders.sentence import TextEmbedder
    from clfjudge.judges.verdict import questions_from, verdict_card

    root = tmp_path_factory.mktemp("readers")
    llama, chat = testing.tiny_llama(root / "llama"), testing.tiny_llama(root / "chat", chat=True)
    verdict = root / "verdict"
    verdict.mkdir()
    verdict_card(str(chat), questions_from(["correct"], "test"), precision="fp32").save(verdict)
    embedded = lambda judge: judge.model.embedder  # noqa: E731
    return {"embedding, sentence reader": (_embedding_judge(root / "sentence", TextEmbedder("minilm")), embedded),
            "embedding, decoder reader": (_embedding_judge(root / "decoder", DecoderEmbedder(str(llama), layer=2)),
                                          embedded),
            "verdict": (verdict, lambda judge: judge.reader)}


@pytest.mark.parametrize("kind", ["embedding, sentence reader", "embedding, decoder reader", "verdict"])
def test_reward_function_memory_items_bounds_the_readers_memory(readers, kind):
    from clfjudge.embedders.cache import DEFAULT_MEMORY_ITEMS

    directory, reader_of = readers[kind]
    completions = [f"Answer number {i}: the Moon is Earth's satellite." for i in range(6)]
    bounded = reward_function(str(directory), reference="I do not know.", memory_items=2)
    reader = reader_of(bounded.judge)
    assert reader.memory.max_items == 2
    rewards = bounded(prompts=["Tell me about the Moon."] * 6, completions=completions)
    assert len(rewards) == 6 and 0 < len(reader.memory) <= 2  # six answers read, the two most recent kept
    free = reward_function(str(directory), reference="I do not know.")
    assert reader_of(free.judge).memory.max_items == DEFAULT_MEMORY_ITEMS
    assert free(prompts=["Tell me about the Moon."] * 6, completions=completions) == pytest.approx(rewards, abs=1e-5)
    assert len(reader_of(free.judge).memory) > 2


def test_memory_items_is_refused_where_it_cannot_apply(judges, tiny_bert_dir, tiny_llama_dir, tmp_path):
    """A judge kind that keeps no readings says so, and a judge loaded already cannot take it any more."""
    from tiny_judges import make_generative_judge

    for directory in (make_judge(tiny_bert_dir, tmp_path / "reward", "reward"),
                      make_generative_judge(tiny_llama_dir, tmp_path / "generative")):
        with pytest.raises(ValueError, match="memory_items=2: .* keeps no readings"):
            reward_function(str(directory), memory_items=2)
    with pytest.raises(ValueError, match="loaded already"):
        reward_function(judges["reward"], memory_items=2)
