"""Reward models as users get them, without a judge card: tiny random sequence-classification models of each
architecture family, saved with ``save_pretrained`` beside their tokenizer (decoders with a chat template), as a
released reward model or TRL's RewardTrainer leaves them."""
from __future__ import annotations

from pathlib import Path

import torch

from clfjudge import testing

# A Llama-style template that trims each turn: the judge must call the template, not imitate it.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] | trim }}</s>\n"
                 "{% endfor %}")
GAIN = 20.0  # random heads give ~0.01-sized rewards; scaled, pairs are not all near-ties


def _decoder_config(arch: str, tokenizer, num_labels: int = 1):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id, num_labels=num_labels)
    if arch == "gemma3":
        return Gemma3TextConfig(**common, head_dim=8, sliding_window=16, layer_types=["sliding_attention",
                                                                                       "full_attention"])
    return {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": lambda **kw: Qwen3Config(**kw, head_dim=8)}[arch](
        **common)


def _save(model, tokenizer, out: Path) -> Path:
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.mul_(GAIN)
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_reward_model(arch: str, out: str | Path, num_labels: int = 1) -> Path:
    """A sequence-classification model of ``arch`` (bert, deberta-v2, llama, qwen2, qwen3, gemma3) with
    ``num_labels`` outputs (one: a reward model)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = Path(out)
    if arch == "deberta-v2":
        testing.tiny_deberta(out, num_labels=num_labels)
        model = AutoModelForSequenceClassification.from_pretrained(out)
        return _save(model, AutoTokenizer.from_pretrained(out), out)
    backbone = out.with_name(out.name + "-backbone")
    if arch == "bert":
        from transformers import BertConfig

        testing.tiny_bert(backbone)
        tokenizer = AutoTokenizer.from_pretrained(backbone)
        # a wider init than BERT's 0.02: its tanh pooler otherwise gives nearly one reward to every input
        config = BertConfig.from_pretrained(backbone, num_labels=num_labels, initializer_range=0.2)
    else:
        testing.tiny_llama(backbone)
        tokenizer = AutoTokenizer.from_pretrained(backbone)
        tokenizer.chat_template = CHAT_TEMPLATE
        config = _decoder_config(arch, tokenizer, num_labels)
    model = testing._seeded_init(lambda: AutoModelForSequenceClassification.from_config(config))
    return _save(model, tokenizer, out)


def native_rewards(directory: str | Path, conversations: list[tuple[str, str]], reading: str) -> list[float]:
    """What transformers alone computes for each (question, answer), one unpadded input at a time, read as
    ``reading`` says: "chat-template" (``apply_chat_template(tokenize=True)``, as a chat model's card shows), "text"
    (``tokenizer(question + answer, add_special_tokens=False)``, TRL's standard format) or "text-pair"
    (``tokenizer(question, answer)``)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory, dtype=torch.float32).eval()
    out = []
    for question, answer in conversations:
        if reading == "chat-template":
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt")
        elif reading == "text":
            ids = tokenizer(question + answer, add_special_tokens=False, return_tensors="pt")
        else:
            ids = tokenizer(question, answer, return_tensors="pt")
        with torch.inference_mode():
            logits = model(**{k: v for k, v in ids.items() if k != "offset_mapping"}).logits[0]
        # one output: the reward; two: the log-odds of class 1
        out.append(float(logits[0]) if len(logits) == 1 else float(logits[1] - logits[0]))
    return out


def trl_reward_model(out: str | Path, steps: int = 4) -> Path:
    """A reward model trained for ``steps`` steps by TRL's RewardTrainer on conversational preference pairs from a
    tiny Llama, saved by ``trainer.save_model`` (model, tokenizer with its chat template, training_args.bin)."""
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    out = Path(out)
    backbone = testing.tiny_llama(out.with_name(out.name + "-backbone"))
    tokenizer = AutoTokenizer.from_pretrained(backbone)
    tokenizer.chat_template = CHAT_TEMPLATE
    model = testing._seeded_init(lambda: AutoModelForSequenceClassification.from_pretrained(backbone, num_labels=1))
    rows = [{"chosen": [{"role": "user", "content": f"Question {i}?"},
                        {"role": "assistant", "content": "A detailed and helpful answer, because it explains why."}],
             "rejected": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": "no"}]}
            for i in range(16)]
    args = RewardConfig(output_dir=str(out.with_name(out.name + "-run")), max_steps=steps,
                        per_device_train_batch_size=4, learning_rate=1e-2, report_to=[], save_strategy="no",
                        logging_strategy="no", use_cpu=True, seed=0, disable_tqdm=True)
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(out))
    return out
