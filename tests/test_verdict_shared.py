"""The verdict judge reads what answers to one question share once: its prompts split where the question ends, the
shared tokens read once and each answer's own after them from their key/value cache, equal to reading each prompt
whole; templates filled in one pass (data is never re-expanded) and prompts held to the model's context."""
from __future__ import annotations

import numpy as np
import pytest

from clfjudge import testing
from clfjudge.data.records import PairRecord, PointRecord
from clfjudge.judges.base import Judge
from clfjudge.judges.verdict import VerdictQuestion, open_reader, presets, questions_from, verdict_card

QUESTION = ("Explain in two sentences why the sky is blue, for a child, and name the physical effect that causes it "
            "so that the child can look it up later.")
ANSWERS = ["Because of Rayleigh scattering.", "7", "The sky reflects the ocean, which is blue.",
           "Blue light scatters more than red light in air; that is Rayleigh scattering.", "{answer} {question}"]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return testing.tiny_llama(tmp_path_factory.mktemp("chat-llama"), chat=True)


def reader(model, question="correct", **kw):
    return open_reader(verdict_card(str(model), questions_from([question], "test"), precision="fp32"), **kw)


def points(question=QUESTION, answers=ANSWERS):
    return [PointRecord(id=str(i), question=question, answer=a, score=None) for i, a in enumerate(answers)]


def test_the_shared_prefix_is_the_question_and_is_read_once(chat_model, monkeypatch):
    shared, whole = reader(chat_model), reader(chat_model, share_prefix=False)
    q = shared.questions[0]
    prompts = [shared.prompt(q, p) for p in points()]
    # every answer's prompt begins with the same tokens, ending after the question, and then differs
    heads = {tuple(ids[:n]) for ids, n in prompts}
    assert len(heads) == 1 and all(n >= 16 for _, n in prompts)
    head = shared.tokenizer.decode(list(next(iter(heads))))
    assert QUESTION in head and ANSWERS[0] not in head
    # the same ids as a prompt rendered and tokenized whole
    assert [ids for ids, _ in prompts] == [whole.prompt_ids(q, p) for p in points()]
    reads = []
    module = shared.modules[0]
    original = type(module).prefix
    monkeypatch.setattr(type(module), "prefix",
                        lambda self, ids, mask: reads.append(int(mask.any(1).sum())) or original(self, ids, mask))
    records = points() + points("Another question entirely, with its own words, asked twice?", ["Yes.", "No."])
    np.testing.assert_allclose(shared.log_odds(records), whole.log_odds(records), atol=1e-5)
    assert sum(reads) == 2  # one prefix a question, not one per answer


def test_pairs_and_pairwise_questions_share_the_question(chat_model, tmp_path):
    point_card = verdict_card(str(chat_model), questions_from(["correct"], "t"), precision="fp32")
    pair_card = verdict_card(str(chat_model), questions_from(["better"], "t"), precision="fp32")
    items = [{"question": QUESTION, "answer_a": a, "answer_b": b} for a, b in zip(ANSWERS, ANSWERS[1:])]
    for name, card in (("point", point_card), ("pair", pair_card)):
        (tmp_path / name).mkdir()
        card.save(tmp_path / name)
        on, off = Judge.load(tmp_path / name), Judge.load(tmp_path / name)
        off.reader.share_prefix = False
        a = [c.p_a for c in on.compare_batch(items, symmetric=True)]
        b = [c.p_a for c in off.compare_batch(items, symmetric=True)]
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_data_holding_placeholders_is_read_as_written(chat_model):
    r = reader(chat_model, question="better")
    q = r.questions[0]
    pair = PairRecord(id="x", question="{answer_a}", answer_a="{answer_b}", answer_b="{question} {answer}")
    user = q.messages(pair, lambda text, field: text)[-1]["content"]
    assert user.count("{answer_b}") == 1 and user.count("{question} {answer}") == 1
    assert user.index("{answer_b}") < user.index("{question} {answer}")
    point = PointRecord(id="p", question="{answer}" * 2000, answer="{question}", score=None)
    ids = r.prompt_ids(presets()["correct"], point)
    assert len(ids) < 384 + 512 + 200  # the question cut to its budget, never re-expanded


def test_prompts_are_cut_to_the_models_context(chat_model):
    r = reader(chat_model)
    r.max_prompt_tokens = 300
    long = PointRecord(id="l", question="word " * 400, answer="answer " * 600, score=None)
    ids, shared = r.prompt(r.questions[0], long)
    assert len(ids) <= 300 and 0 < shared < len(ids)
    assert np.isfinite(r.log_odds([long])).all()


def test_a_template_with_the_answer_first_shares_nothing_it_should_not(chat_model):
    q = VerdictQuestion.from_dict("answer-first", {"user": "{answer}\n\nIs that a good answer to: {question}?",
                                                   "positive": "Yes", "negative": "No"}, "t")
    assert q.shared_end == 0
    r = open_reader(verdict_card(str(chat_model), [q], precision="fp32"))
    whole = open_reader(verdict_card(str(chat_model), [q], precision="fp32"), share_prefix=False)
    np.testing.assert_allclose(r.log_odds(points()), whole.log_odds(points()), atol=1e-5)


def test_the_verdict_judge_runs_on_cuda_or_says_why_not(chat_model, tmp_path):
    import torch

    (tmp_path / "judge").mkdir()
    verdict_card(str(chat_model), questions_from(["correct"], "t"), precision="auto").save(tmp_path / "judge")
    if torch.cuda.is_available():
        assert Judge.load(tmp_path / "judge", provider="cuda").runtime_choice["provider"] == "cuda"
    else:
        with pytest.raises(ValueError, match="provider 'cuda' does not run on this machine: torch sees no CUDA"):
            Judge.load(tmp_path / "judge", provider="cuda")
    with pytest.raises(ValueError, match="runs on the CPU or on CUDA"):
        Judge.load(tmp_path / "judge", provider="openvino")
