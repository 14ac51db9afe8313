"""Tiny random-weight models with locally trained tokenizers, for fast tests (no hub, no real weights).

Each builder writes a complete HF directory (config, weights, tokenizer) that ``resolve_backbone`` and
``AutoModel*/AutoTokenizer.from_pretrained`` load like a real checkpoint:
- ``tiny_deberta``: DeBERTa-v3 style (relative attention, spm.model) with a sequence-classification head;
- ``tiny_llama``: a LLaMA causal LM with a byte-level BPE tokenizer, pad ``<|endoftext|>`` (0) != eos;
- ``tiny_bert``: a BERT encoder with a WordPiece tokenizer.
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SEED = 0
T = TypeVar("T")

_WORDS = (
    "the a an judge model answer question response first second better worse both equally helpful "
    "accurate correct wrong reference rubric score assistant user explain why because however and or "
    "not very clear short long detailed concise relevant harmless polite capital france paris city "
    "river water cat mat sat dog runs quickly slowly number two three four five code python function "
    "returns list sorted order summary story poem write please thanks"
).split()


def corpus(n: int = 400, seed: int = SEED) -> list[str]:
    """Deterministic pseudo-sentences to train the tiny tokenizers on."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = rng.choices(_WORDS, k=rng.randint(4, 14))
        lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
    return lines


def _seeded_init(build: Callable[[], T]) -> T:
    """Build a model under a fixed seed without disturbing the caller's RNG state."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        return build()


def tiny_deberta(out_dir: str | Path, num_labels: int = 3) -> Path:
    """DeBERTa-v3 style classifier (random init) + a SentencePiece unigram tokenizer trained here.

    The tokenizer is built with ``AutoTokenizer.from_pretrained(dir with spm.model)``:
    ``DebertaV2Tokenizer(vocab_file=...)`` silently yields a 7-token vocabulary in transformers 5."""
    import sentencepiece as spm
    from transformers import AutoTokenizer, DebertaV2Config, DebertaV2ForSequenceClassification

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()),
        model_prefix=str(out / "spm"),
        vocab_size=120,
        model_type="unigram",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        pad_piece="[PAD]",
        unk_piece="[UNK]",
        bos_piece="[CLS]",
        eos_piece="[SEP]",
        user_defined_symbols=["[MASK]"],
        minloglevel=2,
    )
    (out / "spm.vocab").unlink()
    specials = {"bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]", "sep_token": "[SEP]",
                "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}
    config_json = {"tokenizer_class": "DebertaV2Tokenizer", "split_by_punct": False, **specials}
    (out / "tokenizer_config.json").write_text(json.dumps(config_json, indent=2))
    tokenizer = AutoTokenizer.from_pretrained(out)
    config = DebertaV2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=512,
        relative_attention=True,
        position_buckets=256,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        type_vocab_size=0,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=num_labels,
    )
    _seeded_init(lambda: DebertaV2ForSequenceClassification(config)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _wrap(tokenizer_object, out: Path, **special_tokens) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer_object, model_max_length=128, **special_tokens)
    tokenizer.save_pretrained(out)
    return tokenizer


# A ChatML-style template (what Qwen and SmolLM2 use), for tests of judges that ask a chat model.
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


def tiny_llama(out_dir: str | Path, chat: bool = False) -> Path:
    """LLaMA causal LM (random init) + a byte-level BPE tokenizer; pad ``<|endoftext|>`` (id 0) != eos. ``chat``: a
    chat template (``CHAT_TEMPLATE``) and room for 1024 positions, for judges that prompt a chat model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(corpus(), trainer)
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bpe.token_to_id("<s>"))]
    )
    tokenizer = _wrap(bpe, out, pad_token="<|endoftext|>", bos_token="<s>", eos_token="</s>")
    if chat:
        tokenizer.chat_template, tokenizer.model_max_length = CHAT_TEMPLATE, 1024
        tokenizer.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024 if chat else 128,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    _seeded_init(lambda: LlamaForCausalLM(config)).save_pretrained(out)
    return out


def tiny_verdict_judge(root: str | Path, questions: tuple[str, ...] = ("correct",)) -> Path:
    """A verdict judge directory (``root / "judge"``) asking ``questions`` of a tiny chat LLaMA (``root / "model"``),
    read in fp32."""
    from .judges.verdict import questions_from, verdict_card

    root = Path(root)
    model = tiny_llama(root / "model", chat=True)
    (root / "judge").mkdir()
    verdict_card(str(model), questions_from(list(questions), "test"), precision="fp32").save(root / "judge")
    return root / "judge"

def tiny_bert(out_dir: str | Path) -> Path:
    """BERT encoder (random init, no head) + a WordPiece tokenizer, laid out like all-MiniLM-L6-v2."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel

    out = Path(out_dir)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.decoder = decoders.WordPiece()
    wordpiece.train_from_iterator(corpus(), trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials))
    cls_id, sep_id = wordpiece.token_to_id("[CLS]"), wordpiece.token_to_id("[SEP]")
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tokenizer = _wrap(
        wordpiece, out, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    )
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )
    _seeded_init(lambda: BertModel(config)).save_pretrained(out)
    return out


# Machines users run clfjudge on, as the capability probe (``clfjudge.machine``) would see them. Facts a probe would
# import a runtime for are given, so a simulated machine never touches this one's GPU or OpenVINO.
_NO_GPU = {"torch_cuda": (False, "torch sees no CUDA device"), "cuda_bf16": (False, "no GPU"),
           "ort_cuda": (False, "this onnxruntime build lacks CUDA (onnxruntime-gpu)")}
_OPENVINO = {"openvino": (True, "FP32,INT8,BF16,EXPORT_IMPORT")}
_X86 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2"
SIMULATED_MACHINES = {
    # AMD Zen 4 / Intel Cooper Lake: AVX512-BF16, no AMX
    "avx512-bf16": ("x86_64", f"{_X86} avx512f avx512bw avx512_vnni avx512_bf16", {**_NO_GPU, **_OPENVINO}),
    # Intel Cascade Lake / Ice Lake: AVX-512 with VNNI, no bf16 (OpenVINO still lists BF16: it would emulate it)
    "avx512-vnni": ("x86_64", f"{_X86} avx512f avx512bw avx512_vnni", {**_NO_GPU, **_OPENVINO}),
    # AMD Zen 2/3, Intel client CPUs: AVX2 only
    "avx2": ("x86_64", _X86, {**_NO_GPU, "openvino": (True, "FP32,INT8,EXPORT_IMPORT")}),
    # Intel Sapphire Rapids: AMX
    "amx": ("x86_64", f"{_X86} avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_int8", {**_NO_GPU, **_OPENVINO}),
    # Apple Silicon / Graviton 2: arm64 without the BF16 extension, no OpenVINO wheel installed
    "arm64": ("arm64", "fp asimd aes crc32 atomics", {**_NO_GPU, "openvino": (False, "openvino is not installed")}),
    # a CUDA server: an A100 with onnxruntime-gpu, Intel host CPU without bf16
    "cuda": ("x86_64", f"{_X86} avx512f avx512bw avx512_vnni",
             {"torch_cuda": (True, "NVIDIA A100-SXM4-80GB"), "cuda_bf16": (True, "the GPU computes in bf16"),
              "ort_cuda": (True, "onnxruntime has CUDAExecutionProvider"), **_OPENVINO}),
}


def simulated_machine(name: str, isa_cap: str | None = None):
    """A ``clfjudge.machine.Machine`` as ``SIMULATED_MACHINES[name]`` would probe; tests put it in place of this
    machine with ``monkeypatch.setattr(clfjudge.machine, "probe", lambda: machine)``."""
    from .machine import Machine

    arch, flags, facts = SIMULATED_MACHINES[name]
    return Machine(arch=arch, cpu=f"simulated {name}", flags=frozenset(flags.split()), isa_cap=isa_cap,
                   facts=dict(facts))
