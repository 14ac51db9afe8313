"""Judge directories built from the tiny random backbones (clfjudge.testing) without training, laid out as
``clfjudge train`` writes them: HF save_pretrained (model + tokenizer) + judge_card.json."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from clfjudge import testing
from clfjudge.card import JudgeCard
from clfjudge.models.backbones import load_seq_cls, load_tokenizer, resolve_backbone
from clfjudge.models.heads import FINE_TUNED, HEADS, RegressionHead
from clfjudge.prompts.encoding import Encoder
from clfjudge.prompts.truncation import TruncationPolicy

# Tiny encoders have 128 positions; the tiny LLaMA (RoPE) takes the long "[INST]" decoder template.
MAX_LENGTH = {"encoder": 128, "decoder": 320}


def make_judge(backbone_dir: str | Path, out_dir: str | Path, head: str = "cls3", gain: float = 40.0) -> Path:
    """An untrained judge whose output layer is scaled by ``gain``, so its decisions are not near-ties of
    ~0.01-sized random logits (a quantized export could not agree with them on anything). A regression
    judge's output (an encoder's) is centred on the middle of its scale so that its scores are not clipped."""
    info = resolve_backbone(str(backbone_dir))
    tokenizer = load_tokenizer(info)
    judge_head = RegressionHead(scale=(1.0, 5.0)) if head == "regression" else HEADS.get(head)()
    model = load_seq_cls(info, judge_head.num_labels, judge_head.problem_type, tokenizer=tokenizer)
    model.config.id2label = judge_head.id2label()
    model.config.label2id = {v: k for k, v in judge_head.id2label().items()}
    output_layer = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        output_layer.weight.mul_(gain)
        if head == "regression":
            probe = tokenizer(testing.corpus(16), padding=True, return_tensors="pt")
            output_layer.bias -= model(**probe).logits.mean() - 0.5
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    scheme = judge_head.default_scheme(info.family)
    encoder = Encoder(tokenizer, scheme, TruncationPolicy(max_length=MAX_LENGTH[info.family]))
    JudgeCard(kind=FINE_TUNED, head=judge_head.name, arity=judge_head.arity, backbone=str(backbone_dir), scheme=scheme,
              max_length=encoder.policy.max_length, truncation=encoder.card_entry(),
              **judge_head.card_fields()).save(out)
    return out


def make_generative_judge(backbone_dir: str | Path, out_dir: str | Path, scheme: str = "decoder-pair-gen",
                          max_new_tokens: int = 4) -> Path:
    """An untrained generative judge (a tiny decoder's causal LM), laid out as ``train_generative`` writes it."""
    from clfjudge.judges.generative import GENERATIVE
    from clfjudge.models.backbones import load_causal_lm
    from clfjudge.prompts.schemes import SCHEMES

    info = resolve_backbone(str(backbone_dir))
    tokenizer = load_tokenizer(info, padding_side="left")
    out = Path(out_dir)
    load_causal_lm(info, tokenizer=tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    policy = TruncationPolicy(max_length=MAX_LENGTH["decoder"] - max_new_tokens)
    JudgeCard(kind=GENERATIVE, arity=SCHEMES.get(scheme).arity, backbone=str(backbone_dir), scheme=scheme,
              max_length=MAX_LENGTH["decoder"], truncation={"policy": asdict(policy), "use_reference": False},
              label_map={"parser": SCHEMES.get(scheme).parser},
              runtime={"backend": "generate", "max_new_tokens": max_new_tokens, "decoding": "greedy"}).save(out)
    return out


class ScriptedLM:
    """A stand-in causal LM that writes ``reply(prompt text)`` (then EOS): the outputs a test chooses, per prompt,
    whatever order the judge batches the prompts in."""

    def __init__(self, tokenizer, reply: Callable[[str], str]) -> None:
        self.tokenizer, self.reply = tokenizer, reply

    def eval(self) -> ScriptedLM:
        return self

    def generate(self, input_ids, attention_mask, **_):
        prompts = self.tokenizer.batch_decode(input_ids, skip_special_tokens=True)
        rows = [self.tokenizer(self.reply(p), add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
                for p in prompts]
        width = max(map(len, rows))
        new = torch.tensor([r + [self.tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, new], dim=1)


def prefers_seven(prompt: str) -> str:
    """PandaLM-style output ("1" / "2") of a position-consistent judge that prefers the answer "seven" to "nine";
    an output no parser reads when the question mentions GIBBERISH; "1" for a pair of neither (the made-up pair of a
    start-up's ``Judge.self_test``)."""
    if "GIBBERISH" in prompt:
        return "the first one"
    if "seven" not in prompt or "nine" not in prompt:
        return "1"
    return "1" if prompt.index("seven") < prompt.index("nine") else "2"
