"""A fine-tuned clfjudge judge is a transformers model whose tokenizer carries the judge's prompt as its chat
template: transformers, and TRL's ``GRPOTrainer(reward_funcs=["judge_dir"])``, score the text clfjudge scores and
get the same numbers. A pairwise (3-way) judge loads in transformers with its classes in ``id2label``."""
from __future__ import annotations

import pytest
import torch
from test_training import REAL_DATA, _config, needs_data

from clfjudge.data.formats import item_record
from clfjudge.data.records import Loc
from clfjudge.judges.base import Judge, as_point
from clfjudge.prompts.chat_template import carry_prompt, judge_chat_template

CONVERSATIONS = [("What is the capital of France?", "  Paris.\n"),
                 ("Why {x}?", 'Because "quotes", a \\ backslash, {{ braces }} and ünïcode.'),
                 ("Name a prime.", "7")]


def _transformers_raw(directory, conversations, system: str | None = None) -> list[float]:
    """What transformers alone computes: the chat template, tokenized without added special tokens."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory).eval()
    out = []
    for question, answer in conversations:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        with torch.inference_mode():
            out.append(float(model(**tokenizer(text, add_special_tokens=False, return_tensors="pt")).logits[0, 0]))
    return out


@pytest.fixture(scope="module")
def reward_judge(tiny_llama_dir, tmp_path_factory):
    from clfjudge.training.trainer import train

    if not REAL_DATA:
        pytest.skip("needs ../shared/data (present in CI)")
    return train(_config(tiny_llama_dir, tmp_path_factory.mktemp("judge") / "reward", "reward"))


def test_a_trained_reward_judge_scores_the_same_in_transformers(reward_judge):
    judge = Judge.load(reward_judge)
    ours = [judge.score(q, a).value for q, a in CONVERSATIONS]
    assert _transformers_raw(reward_judge, CONVERSATIONS) == pytest.approx(ours, abs=1e-5)
    # a system turn (TRL prompts often have one) is read as clfjudge reads it: before the question, labelled
    with_system = judge.score_batch([item_record({"messages": [{"role": "system", "content": "Be brief."},
                                                               {"role": "user", "content": q},
                                                               {"role": "assistant", "content": a}]}, Loc(), False)
                                     for q, a in CONVERSATIONS[:1]])
    assert _transformers_raw(reward_judge, CONVERSATIONS[:1], system="Be brief.") == pytest.approx(
        [s.value for s in with_system], abs=1e-5)


def test_trl_grpo_reward_funcs_with_the_judge_directory_score_as_clfjudge(reward_judge, tiny_llama_dir, tmp_path):
    pytest.importorskip("trl", reason="the dev extra installs trl")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    policy = tmp_path / "policy"  # GRPO needs a causal LM to train; only its reward scoring is exercised here
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    tokenizer.save_pretrained(policy)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tiny_llama_dir).save_pretrained(policy)
    prompts = [[{"role": "user", "content": q}] for q, _ in CONVERSATIONS]
    completions = [[{"role": "assistant", "content": a}] for _, a in CONVERSATIONS]
    args = GRPOConfig(output_dir=str(tmp_path / "run"), use_cpu=True, report_to=[], per_device_train_batch_size=3,
                      num_generations=3, max_completion_length=4, logging_strategy="no", save_strategy="no",
                      bf16=False)  # TRL defaults to bf16 (then the rewards agree to ~1e-4)
    trainer = GRPOTrainer(model=str(policy), reward_funcs=[str(reward_judge)], args=args,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]))
    rewards = trainer._calculate_rewards([{"prompt": p} for p in prompts], prompts, completions, None)
    judge = Judge.load(reward_judge)
    assert rewards[:, 0].tolist() == pytest.approx([judge.score(q, a).value for q, a in CONVERSATIONS], abs=1e-5)


@needs_data
def test_a_trained_regression_judge_carries_its_prompt_too(tiny_bert_dir, tmp_path):
    from clfjudge.training.trainer import train

    directory = train(_config(tiny_bert_dir, tmp_path / "regression", "regression"))
    judge = Judge.load(directory)
    raw = judge.raw_outputs([as_point({"question": q, "answer": a}) for q, a in CONVERSATIONS])[:, 0]
    assert _transformers_raw(directory, CONVERSATIONS) == pytest.approx(raw.tolist(), abs=1e-5)


def test_a_pairwise_judge_loads_in_transformers_with_its_classes_and_no_chat_template(tiny_bert_dir, tmp_path):
    from tiny_judges import make_judge
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    directory = make_judge(tiny_bert_dir, tmp_path / "cls3", "cls3")
    model = AutoModelForSequenceClassification.from_pretrained(directory)
    assert model.config.id2label == {0: "TIE", 1: "A", 2: "B"}  # the order of the head's rows
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert carry_prompt(tokenizer, "encoder-pair") is False and not tokenizer.chat_template
    with pytest.raises(ValueError, match="shows pair records"):
        judge_chat_template("encoder-pair", tokenizer)
    with pytest.raises(ValueError, match="length hints"):
        judge_chat_template("encoder-answer", tokenizer, length_hint=True)
