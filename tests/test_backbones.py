"""Backbone resolution (aliases, hub ids, local dirs), family detection, tokenizers and heads."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from clfjudge.models.backbones import (
    BackboneNotAvailableError,
    family_of,
    load_causal_lm,
    load_seq_cls,
    load_tokenizer,
    resolve_backbone,
)
from clfjudge.models.offline_weights import OFFLINE_WEIGHTS

torch.set_num_threads(1)

TEXTS = ["Which answer is better?", "The first response explains why the capital of France is Paris, clearly."]


def run_python(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"), **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env, timeout=300
    )


# ---- family detection ------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["llama", "mistral", "gemma", "gemma2", "gemma3_text", "qwen2", "gpt2"])
def test_decoder_families(model_type):
    assert family_of({"model_type": model_type}) == "decoder"


@pytest.mark.parametrize("model_type",
                         ["bert", "mpnet", "deberta-v2", "deberta", "roberta", "xlm-roberta", "modernbert"])
def test_encoder_families(model_type):
    assert family_of({"model_type": model_type}) == "encoder"


def test_family_from_architectures_and_errors():
    assert family_of({"model_type": "custom-lm", "architectures": ["CustomForCausalLM"]}) == "decoder"
    assert family_of({"model_type": "custom-enc", "architectures": ["CustomForMaskedLM"]}) == "encoder"
    with pytest.raises(ValueError, match="encoder-decoder models \\(t5\\) are not supported"):
        family_of({"model_type": "t5", "is_encoder_decoder": True})
    with pytest.raises(ValueError, match="x/config.json: field 'model_type': cannot tell whether 'mystery'"):
        family_of({"model_type": "mystery", "architectures": ["MysteryModel"]}, "x/config.json")


def test_family_of_tiny_configs(tiny_deberta_dir, tiny_llama_dir, tiny_bert_dir):
    expected = {tiny_deberta_dir: ("encoder", "deberta-v2"), tiny_llama_dir: ("decoder", "llama"),
                tiny_bert_dir: ("encoder", "bert")}
    for directory, (family, arch) in expected.items():
        info = resolve_backbone(directory)
        assert (info.family, info.arch, info.source) == (family, arch, "local")
        assert info.path_or_id == str(directory.resolve())


# ---- resolution ---------------------------------------------------------------------------------------


def test_resolve_minilm_alias_and_full_name():
    by_alias = resolve_backbone("minilm")
    assert (by_alias.family, by_alias.arch, by_alias.source) == ("encoder", "bert", "offline:minilm")
    assert Path(by_alias.path_or_id, "model.safetensors").is_file()
    assert resolve_backbone("sentence-transformers/all-MiniLM-L6-v2") == by_alias


@pytest.mark.slow  # materialises the packages on first use (assembly ~7 s, GGUF conversion ~30 s)
def test_resolve_mpnet_and_smollm2_aliases_and_full_names():
    mpnet = resolve_backbone("mpnet")
    assert (mpnet.family, mpnet.arch, mpnet.source) == ("encoder", "mpnet", "offline:mpnet")
    assert resolve_backbone("sentence-transformers/all-mpnet-base-v2") == mpnet
    assert Path(mpnet.path_or_id) == OFFLINE_WEIGHTS.get("mpnet").path()
    smol = resolve_backbone("smollm2")
    assert (smol.family, smol.arch, smol.source) == ("decoder", "llama", "offline:smollm2")
    assert resolve_backbone("HuggingFaceTB/SmolLM2-135M-Instruct") == smol


def test_local_dir_errors(tmp_path):
    with pytest.raises(BackboneNotAvailableError, match="local model directory ./no/such/dir does not exist"):
        resolve_backbone("./no/such/dir")
    with pytest.raises(BackboneNotAvailableError, match=f"{tmp_path}/config.json does not exist"):
        resolve_backbone(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: invalid JSON"):
        resolve_backbone(tmp_path)


def test_hub_ids_offline_without_cache_give_a_clear_error(tmp_path):
    proc = run_python(
        """
        from clfjudge.models.backbones import resolve_backbone, BackboneNotAvailableError
        for spec in ["microsoft/deberta-v3-large", "lmsys/vicuna-7b-v1.5"]:
            try:
                resolve_backbone(spec)
            except BackboneNotAvailableError as exc:
                print(exc)
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2
    for spec, line in zip(["microsoft/deberta-v3-large", "lmsys/vicuna-7b-v1.5"], lines):
        assert line.startswith(f"model '{spec}' is not available offline")
        assert "minilm (sentence-transformers/all-MiniLM-L6-v2)" in line
        assert "smollm2 (HuggingFaceTB/SmolLM2-135M-Instruct)" in line


def test_hub_id_is_passed_through_to_transformers_cache(tmp_path):
    """A user with a filled Hugging Face cache gets the hub id resolved through transformers (offline)."""
    snapshot = tmp_path / "hf-home" / "hub" / "models--acme--tiny-judge" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "deberta-v2", "hidden_size": 64}))
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")
    proc = run_python(
        """
        from clfjudge.models.backbones import resolve_backbone
        print(resolve_backbone("acme/tiny-judge"))
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert ("BackboneInfo(path_or_id='acme/tiny-judge', family='encoder', arch='deberta-v2', source='hub')"
            in proc.stdout)


def test_importing_loads_nothing_heavy(tmp_path):
    proc = run_python(
        """
        import sys
        import clfjudge.models.backbones, clfjudge.models.offline_weights, clfjudge.testing, clfjudge.cli.models
        heavy = sorted(m for m in ("torch", "transformers", "huggingface_hub", "sentencepiece", "tokenizers")
                       if m in sys.modules)
        print(heavy)
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ---- tokenizers -------------------------------------------------------------------------------------------


def test_tiny_deberta_tokenizer_really_tokenizes(tiny_deberta_dir):
    tok = load_tokenizer(resolve_backbone(tiny_deberta_dir))
    assert len(tok) > 7  # DebertaV2Tokenizer(vocab_file=...) would give 7 tokens
    pieces = tok.tokenize("the judge explains why the first answer is better")
    assert len(pieces) > 7
    ids = tok("the judge explains why the first answer is better")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == "the judge explains why the first answer is better"


def test_decoder_tokenizer_pad_distinct_from_eos(tiny_llama_dir):
    tok = load_tokenizer(resolve_backbone(tiny_llama_dir))
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0 != tok.eos_token_id
    assert tok.padding_side == "right"
    assert load_tokenizer(resolve_backbone(tiny_llama_dir), padding_side="left").padding_side == "left"


def test_decoder_with_pad_equal_to_eos_pads_with_unk(tiny_llama_dir, tmp_path):
    """Llama-2 / Vicuna style: no distinct pad, but an <unk> token, which becomes the pad."""
    copy = tmp_path / "vicuna-style"
    shutil.copytree(tiny_llama_dir, copy)
    tok = load_tokenizer(resolve_backbone(copy))
    tok.add_special_tokens({"unk_token": "<unk>"})
    tok.pad_token = tok.eos_token
    tok.save_pretrained(copy)
    tok = load_tokenizer(resolve_backbone(copy))
    assert tok.pad_token == "<unk>" and tok.pad_token_id == tok.unk_token_id != tok.eos_token_id


def test_decoder_without_a_usable_pad_gets_one_and_the_model_is_resized(tiny_llama_dir, tmp_path):
    """GPT-2 style: eos == pad == the only candidate -> a new <pad> token; embeddings follow."""
    copy = tmp_path / "gpt2-style"
    shutil.copytree(tiny_llama_dir, copy)
    tok = load_tokenizer(resolve_backbone(copy))
    tok.eos_token = tok.pad_token = "<|endoftext|>"
    tok.save_pretrained(copy)

    info = resolve_backbone(copy)
    tok = load_tokenizer(info)
    assert tok.pad_token == "<pad>" and tok.pad_token_id not in (None, tok.eos_token_id)
    model = load_seq_cls(info, 3, "single_label_classification", tokenizer=tok)
    assert model.get_input_embeddings().num_embeddings == len(tok)
    assert model.config.pad_token_id == tok.pad_token_id
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        assert model(**batch).logits.shape == (2, 3)


# ---- heads ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["tiny_deberta_dir", "tiny_llama_dir", "tiny_bert_dir"])
def test_seq_cls_forward_and_loss(fixture, request):
    info = resolve_backbone(request.getfixturevalue(fixture))
    tok = load_tokenizer(info)
    batch = tok(TEXTS, padding=True, truncation=True, max_length=64, return_tensors="pt")

    clf = load_seq_cls(info, 3, "single_label_classification", tokenizer=tok)
    assert clf.config.pad_token_id == tok.pad_token_id
    out = clf(**batch, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad is not None for n, p in clf.named_parameters() if not n.startswith(clf.base_model_prefix))

    reg = load_seq_cls(info, 1, "regression", tokenizer=tok)
    out = reg(**batch, labels=torch.tensor([0.5, -1.0]))
    assert out.logits.shape == (2, 1) and torch.isfinite(out.loss)


def test_seq_cls_head_is_fresh_unless_asked(tiny_deberta_dir):
    from safetensors.torch import load_file

    saved = load_file(tiny_deberta_dir / "model.safetensors")["classifier.weight"]
    info = resolve_backbone(tiny_deberta_dir)
    assert not torch.equal(load_seq_cls(info, 3).classifier.weight, saved)
    assert torch.equal(load_seq_cls(info, 3, fresh_head=False).classifier.weight, saved)
    kept = load_seq_cls(info, 3)
    assert torch.equal(kept.deberta.embeddings.word_embeddings.weight,
                       load_file(tiny_deberta_dir / "model.safetensors")["deberta.embeddings.word_embeddings.weight"])


def logits_at_last_real_token(model, batch) -> torch.Tensor:
    """What a decoder seq-cls head should output with right padding: the score of the last attended token."""
    hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    last = batch["attention_mask"].sum(dim=1) - 1
    return model.score(hidden[torch.arange(len(last)), last])


def test_decoder_pooling_uses_last_non_pad_token(tiny_llama_dir):
    info = resolve_backbone(tiny_llama_dir)
    tok = load_tokenizer(info)
    model = load_seq_cls(info, 3, "single_label_classification", tokenizer=tok).eval()
    texts = [TEXTS[0] + tok.eos_token, TEXTS[1]]  # a sequence ending in EOS is pooled at EOS, not before
    batch = tok(texts, padding=True, return_tensors="pt")
    assert batch["attention_mask"][0, -1] == 0  # the first text really is padded
    with torch.inference_mode():
        padded = model(**batch).logits
        single = torch.cat([model(**tok([t], return_tensors="pt")).logits for t in texts])
        expected = logits_at_last_real_token(model, batch)
    torch.testing.assert_close(padded, single, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(padded, expected, atol=1e-6, rtol=1e-5)


def test_causal_lm(tiny_llama_dir, tiny_bert_dir):
    info = resolve_backbone(tiny_llama_dir)
    tok = load_tokenizer(info, padding_side="left")
    lm = load_causal_lm(info, tokenizer=tok)
    ids = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        assert lm(**ids).logits.shape == (2, ids["input_ids"].shape[1], len(tok))
    with pytest.raises(ValueError, match="is an encoder \\(bert\\); a causal LM needs a decoder"):
        load_causal_lm(resolve_backbone(tiny_bert_dir))


# ---- real backbones -------------------------------------------------------------------------------------


def test_real_minilm_seq_cls():
    info = resolve_backbone("minilm")
    tok = load_tokenizer(info)
    model = load_seq_cls(info, 3, "single_label_classification", tokenizer=tok).eval()
    assert type(model).__name__ == "BertForSequenceClassification"
    with torch.inference_mode():
        logits = model(**tok(TEXTS, padding=True, return_tensors="pt")).logits
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()


@pytest.mark.slow
def test_real_smollm2_seq_cls_pools_at_last_real_token():
    info = resolve_backbone("smollm2")
    tok = load_tokenizer(info)
    assert tok.pad_token_id == 0 != tok.eos_token_id
    model = load_seq_cls(info, 3, "single_label_classification", tokenizer=tok).eval()
    assert type(model).__name__ == "LlamaForSequenceClassification" and model.config.pad_token_id == 0
    texts = [TEXTS[0] + tok.eos_token, TEXTS[1]]  # ends in EOS: pooled at EOS, not one token early
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        padded = model(**batch).logits
        single = torch.cat([model(**tok([t], return_tensors="pt")).logits for t in texts])
        expected = logits_at_last_real_token(model, batch)
    torch.testing.assert_close(padded, single, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(padded, expected, atol=1e-5, rtol=1e-4)
