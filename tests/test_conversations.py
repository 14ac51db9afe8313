"""Conversations as the model reads them: a system prompt, earlier turns and list content reach a decoder reward
model through its own chat template, and a fine-tuned decoder judge through the chat template written into its
tokenizer, with the numbers transformers' ``apply_chat_template`` + forward pass and TRL's ``GRPOTrainer`` reward
scoring give (conversational and standard data)."""
from __future__ import annotations

import json
import logging

import pytest
import torch
from foreign_models import tiny_reward_model
from tiny_judges import make_judge

from clfjudge.data.formats import item_record
from clfjudge.data.records import Loc
from clfjudge.judges.base import Judge
from clfjudge.prompts.chat_template import carry_prompt
from clfjudge.serving.reward import reward_function

TOLERANCE = 1e-5  # float32 on one machine: padding and batching change the last bits only


def _text(*parts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": p} for p in parts]


PROMPTS = [
    [{"role": "system", "content": "Be terse."},
     {"role": "user", "content": _text("The capital ", "of France?")},
     {"role": "assistant", "content": "Paris."},
     {"role": "user", "content": "And Italy?"}],
    [{"role": "user", "content": _text("Name a prime.")}],
    [{"role": "system", "content": _text("One word.")}, {"role": "user", "content": "Why is the sky blue?"}],
]
COMPLETIONS = [[{"role": "assistant", "content": "Rome."}], [{"role": "assistant", "content": _text("7")}],
               [{"role": "assistant", "content": " Scattering. "}]]
STANDARD = [("The capital of France? ", "Paris."), ("Name a prime. ", "7"), ("Why is the sky blue?", " Scattering.")]
# A template that treats the system prompt, string and list content as Qwen / Gemma templates do, and trims.
LIST_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}[SYS] {% else %}"
                 "<{{ m['role'] }}> {% endif %}{% if m['content'] is string %}{{ m['content'] | trim }}{% else %}"
                 "{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}</s>\n{% endfor %}")


@pytest.fixture(scope="module")
def chat_rm(tmp_path_factory):
    from transformers import AutoTokenizer

    directory = tiny_reward_model("llama", tmp_path_factory.mktemp("rm") / "chat")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = LIST_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def plain_rm(tmp_path_factory):
    """A decoder reward model whose tokenizer has no chat template (TRL's RewardTrainer on plain-text data)."""
    directory = tiny_reward_model("llama", tmp_path_factory.mktemp("rm") / "plain")
    (directory / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def fine_tuned(tiny_llama_dir, tmp_path_factory):
    """A fine-tuned decoder reward judge laid out as training leaves it: its scheme as its tokenizer's chat
    template (``carry_prompt``, what ``train`` and ``export`` do)."""
    from transformers import AutoTokenizer

    directory = make_judge(tiny_llama_dir, tmp_path_factory.mktemp("judge") / "reward", "reward")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert carry_prompt(tokenizer, Judge.load(directory).card.scheme)
    tokenizer.save_pretrained(directory)
    return directory


def _transformers(directory, conversations) -> list[float]:
    """transformers alone: the model's chat template (``apply_chat_template(tokenize=True)``), one input at a time."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory, dtype=torch.float32).eval()
    out = []
    for messages in conversations:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt")
        with torch.inference_mode():
            out.append(float(model(**ids).logits[0, 0]))
    return out


def _clfjudge(directory, prompts, completions) -> list[float]:
    """clfjudge on the same rows, as TRL's ``messages`` format (``clfjudge score``, ``serve``) and as a reward
    function: both must agree."""
    judge = Judge.load(directory)
    records = [item_record({"messages": p + c}, Loc("rows", i + 1), labelled=False)
               for i, (p, c) in enumerate(zip(prompts, completions))]
    scored = [s.value for s in judge.score_batch(records)]
    assert reward_function(judge)(prompts=prompts, completions=completions) == pytest.approx(scored, abs=1e-6)
    return scored


@pytest.mark.parametrize("which", ["chat_rm", "fine_tuned"])
def test_a_conversation_scores_as_transformers_reads_it(request, which):
    directory = request.getfixturevalue(which)
    conversations = [p + c for p, c in zip(PROMPTS, COMPLETIONS)]
    ours = _clfjudge(directory, PROMPTS, COMPLETIONS)
    assert ours == pytest.approx(_transformers(directory, conversations), abs=TOLERANCE)
    # the system prompt and the earlier turns are read: dropping them changes the score
    assert _clfjudge(directory, [PROMPTS[0][-1:]], COMPLETIONS[:1])[0] != pytest.approx(ours[0], abs=1e-4)


def test_a_released_model_reads_the_turns_a_fine_tuned_judge_reads_them_flattened(chat_rm, fine_tuned):
    from transformers import AutoTokenizer

    record = item_record({"messages": PROMPTS[0] + COMPLETIONS[0]}, Loc("rows", 1), labelled=False)
    released = Judge.load(chat_rm).encoder.text(record)
    assert released == AutoTokenizer.from_pretrained(chat_rm).apply_chat_template(PROMPTS[0] + COMPLETIONS[0],
                                                                                    tokenize=False)
    assert "[SYS] Be terse.</s>" in released and "The capital of France?</s>" in released
    judge = Judge.load(fine_tuned)
    assert "System: Be terse.\n\nUser: The capital of France?\n\nAssistant: Paris.\n\nUser: And Italy?" in \
        judge.encoder.text(record)
    assert "flattened" in judge.card.truncation["conversation"]
    assert "chat template" in Judge.load(chat_rm).card.truncation["conversation"]


def test_truncation_drops_the_oldest_turns_of_a_chat_template_input(chat_rm):
    from transformers import AutoTokenizer

    long_turn = "the judge explains why the answer is better because " * 8
    prompt = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": _text(long_turn)},
              {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}]
    record = item_record({"messages": [*prompt, {"role": "assistant", "content": "Rome."}]}, Loc("rows", 1),
                         labelled=False)
    judge, tokenizer = Judge.load(chat_rm), AutoTokenizer.from_pretrained(chat_rm)
    assert len(tokenizer.apply_chat_template(prompt)["input_ids"]) > judge.card.max_length
    kept = [prompt[0], *prompt[2:], {"role": "assistant", "content": "Rome."}]  # the oldest turn went, nothing else
    assert judge.encode(record)[0]["input_ids"] == tokenizer.apply_chat_template(kept)["input_ids"]
    assert judge.truncation["fields"]["earlier turns"]["records"] == 1


def test_a_flattening_judge_says_so_once(chat_rm, tmp_path, caplog, monkeypatch):
    from clfjudge.data import conversation

    monkeypatch.setattr(conversation, "_NOTED", set())  # as at the start of a run
    directory = tiny_reward_model("bert", tmp_path / "encoder")
    judge = Judge.load(directory)
    assert "flattened" in judge.card.truncation["conversation"] and judge.card.truncation["input"] == "text-pair"
    with caplog.at_level(logging.WARNING, logger="clfjudge.data.conversation"):
        reward_function(judge)(prompts=PROMPTS, completions=COMPLETIONS)
        reward_function(judge)(prompts=PROMPTS, completions=COMPLETIONS)
        reward_function(chat_rm)(prompts=PROMPTS, completions=COMPLETIONS)
    notes = [r.getMessage() for r in caplog.records if "flattened" in r.getMessage()]
    assert len(notes) == 1 and "text-pair" in notes[0] and "role label" in notes[0]


def test_a_non_text_part_is_refused_by_clfjudge_and_by_the_written_template(fine_tuned):
    from transformers import AutoTokenizer

    from clfjudge.data.records import RecordError

    image = [{"role": "user", "content": [{"type": "image", "url": "x.png"}]}, *COMPLETIONS[0]]
    with pytest.raises(RecordError, match=r"messages\[0\]\.content\[0\]"):
        item_record({"messages": image}, Loc("rows", 1), labelled=False)
    with pytest.raises(Exception, match="only text parts"):
        AutoTokenizer.from_pretrained(fine_tuned).apply_chat_template(image, tokenize=False)


def _grpo(tmp_path, tiny_llama_dir, reward_funcs, prompt):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    policy = tmp_path / "policy"  # GRPO needs a causal LM to train; only its reward scoring is exercised here
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    tokenizer.save_pretrained(policy)
    AutoModelForCausalLM.from_pretrained(tiny_llama_dir).save_pretrained(policy)
    args = GRPOConfig(output_dir=str(tmp_path / "run"), use_cpu=True, report_to=[], per_device_train_batch_size=3,
                      num_generations=3, max_completion_length=4, logging_strategy="no", save_strategy="no",
                      bf16=False,  # TRL defaults to bf16 (then the rewards agree to ~1e-4)
                      max_steps=1, disable_tqdm=True)
    return GRPOTrainer(model=str(policy), reward_funcs=reward_funcs, args=args,
                       train_dataset=Dataset.from_list([{"prompt": prompt}] * 3))  # only read at training


def test_trl_grpo_conversational_rewards_equal_clfjudge(chat_rm, fine_tuned, tiny_llama_dir, tmp_path):
    """TRL's conversational path: ``apply_chat_template(prompt + completion)`` of each reward model's tokenizer."""
    pytest.importorskip("trl", reason="the dev extra installs trl")
    trainer = _grpo(tmp_path, tiny_llama_dir, [str(chat_rm), str(fine_tuned)], PROMPTS[1])
    rewards = trainer._calculate_rewards([{"prompt": p} for p in PROMPTS], PROMPTS, COMPLETIONS, None)
    assert rewards[:, 0].tolist() == pytest.approx(_clfjudge(chat_rm, PROMPTS, COMPLETIONS), abs=TOLERANCE)
    assert rewards[:, 1].tolist() == pytest.approx(_clfjudge(fine_tuned, PROMPTS, COMPLETIONS), abs=TOLERANCE)


def test_trl_grpo_standard_rewards_equal_clfjudge(plain_rm, fine_tuned, tiny_llama_dir, tmp_path):
    """TRL's standard path: ``tokenizer(prompt + completion, add_special_tokens=False)``. A decoder reward model
    without a chat template reads that (clfjudge's ``text`` input); a fine-tuned judge reads its own prompt, which
    plain text cannot carry, so it goes in as ``clfjudge.reward_function``."""
    pytest.importorskip("trl", reason="the dev extra installs trl")
    prompts, completions = [p for p, _ in STANDARD], [c for _, c in STANDARD]
    trainer = _grpo(tmp_path, tiny_llama_dir, [str(plain_rm), reward_function(fine_tuned)], prompts[0])
    rewards = trainer._calculate_rewards([{"prompt": p} for p in prompts], prompts, completions, None)
    judge = Judge.load(plain_rm)
    assert judge.card.truncation["input"] == "text"
    assert rewards[:, 0].tolist() == pytest.approx([judge.score(p, c).value for p, c in STANDARD], abs=TOLERANCE)
    fine = Judge.load(fine_tuned)
    assert rewards[:, 1].tolist() == pytest.approx([fine.score(p, c).value for p, c in STANDARD], abs=TOLERANCE)


@pytest.mark.parametrize("shape", ["standard", "conversational"])
def test_a_grpo_step_rewards_the_directory_and_reward_function_alike(chat_rm, tiny_llama_dir, tmp_path, shape,
                                                                      monkeypatch):
    """A drop-in: in one GRPO training step, ``reward_funcs=[RM_DIR]`` and ``reward_funcs=[reward_function(RM_DIR)]``
    give every generated completion the same reward, on TRL's standard (plain-text) and conversational data, for a
    decoder reward model with a chat template. Read through the chat template, plain text would score otherwise."""
    pytest.importorskip("trl", reason="the dev extra installs trl")
    conversation = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a prime."}]
    prompt = STANDARD[0][0] if shape == "standard" else conversation  # (a dataset column holds one content type)
    trainer = _grpo(tmp_path, tiny_llama_dir, [str(chat_rm), reward_function(str(chat_rm))], prompt)
    seen = []
    calculate = trainer._calculate_rewards

    def recording(inputs, prompts, completions, completion_ids):
        rewards = calculate(inputs, prompts, completions, completion_ids)
        seen.append((prompts, completions, rewards.clone()))
        return rewards

    monkeypatch.setattr(trainer, "_calculate_rewards", recording)
    trainer.train()
    [(prompts, completions, rewards)] = seen
    assert len(completions) == 3 and isinstance(prompts[0], str) == (shape == "standard")
    assert rewards[:, 1].tolist() == pytest.approx(rewards[:, 0].tolist(), abs=TOLERANCE)
    as_chat = reward_function(Judge.load(chat_rm, model_input="chat-template"))(prompts=prompts,
                                                                                 completions=completions)
    if shape == "standard":  # the explicit option reads otherwise: the test tells the readings apart
        assert min(abs(a - b) for a, b in zip(as_chat, rewards[:, 0].tolist())) > 100 * TOLERANCE
    else:
        assert as_chat == pytest.approx(rewards[:, 0].tolist(), abs=TOLERANCE)
