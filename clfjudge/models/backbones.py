"""Backbone resolution and loading.

A backbone spec is an offline alias ("minilm", "mpnet", "smollm2"), the hub id those packages copy
(mapped to the offline copy), a local HF directory, or any other hub id, which is passed through to
transformers for users who have a hub (or a filled cache). Nothing is downloaded or loaded at import.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .offline_weights import find_offline, offline_aliases_text

Family = Literal["encoder", "decoder"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_ADDED_PAD_TOKEN = "<pad>"


class BackboneNotAvailableError(FileNotFoundError):
    """The spec names neither an offline package, nor a local directory, nor a reachable/cached hub model."""


@dataclass(frozen=True)
class BackboneInfo:
    path_or_id: str  # what to hand to transformers' from_pretrained
    family: Family
    arch: str  # config.model_type, e.g. "bert", "deberta-v2", "llama"
    source: str  # "offline:<alias>" | "local" | "hub"


def family_of(config: Mapping[str, Any], where: str = "config.json") -> Family:
    """Encoder or decoder, from a config dict. Uses transformers' own auto-mappings: a model type with a
    masked-LM class is an encoder (bert, roberta, deberta-v2, mpnet, ...); one with only a causal-LM
    class is a decoder (llama, mistral, gemma*, qwen2, gpt2, ...)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = config.get("model_type", "")
    if config.get("is_encoder_decoder"):
        raise ValueError(f"{where}: encoder-decoder models ({model_type}) are not supported as backbones")
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "encoder"
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "decoder"
    architectures = config.get("architectures") or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return "decoder"
    if any(a.endswith("ForMaskedLM") for a in architectures):
        return "encoder"
    raise ValueError(
        f"{where}: field 'model_type': cannot tell whether {model_type!r} (architectures {architectures}) "
        "is an encoder or a decoder"
    )


def _info_from_dir(directory: Path, source: str) -> BackboneInfo:
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise BackboneNotAvailableError(f"{directory} is not a model directory: {config_file} does not exist")
    try:
        config = json.loads(config_file.read_text())
    except ValueError as exc:
        raise ValueError(f"{config_file}: invalid JSON ({exc})") from None
    return BackboneInfo(str(directory), family_of(config, str(config_file)), config.get("model_type", ""), source)


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", ".", "~")) or not _HUB_ID.match(spec)


def _info_from_hub(spec: str) -> BackboneInfo:
    from huggingface_hub import is_offline_mode
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(spec)
    except OSError as exc:
        if is_offline_mode():
            why = "is not available offline (HF_HUB_OFFLINE is set and it is not in the local Hugging Face cache)"
        else:
            why = f"could not be fetched from the hub or the local cache ({exc.__class__.__name__}: {exc})"
        raise BackboneNotAvailableError(
            f"model {spec!r} {why}. Offline backbones: {offline_aliases_text()}; or pass a local model directory."
        ) from None
    return BackboneInfo(spec, family_of(config.to_dict(), spec), config.model_type, "hub")


def resolve_backbone(spec: str | os.PathLike) -> BackboneInfo:
    """Resolve an alias, a hub id or a local directory. Offline packages are materialised on first use
    (idempotent; see ``clfjudge models setup``)."""
    text = os.fspath(spec)
    weights = find_offline(text)
    # an alias is offline only; a hub id uses its offline copy where that is installed, else the hub
    if weights is not None and (text == weights.alias or weights.is_installed()):
        return _info_from_dir(weights.ensure().path, f"offline:{weights.alias}")
    local = Path(text).expanduser()
    if local.is_dir():
        return _info_from_dir(local.resolve(), "local")
    if _looks_like_path(text):
        raise BackboneNotAvailableError(
            f"local model directory {text} does not exist (offline backbones: {offline_aliases_text()})"
        )
    return _info_from_hub(text)


def _ensure_decoder_pad(tokenizer) -> None:
    """Give a decoder tokenizer a pad token distinct from EOS: seq-cls heads pool at the rightmost token
    that is not pad, so pad == EOS would pool one token early on sequences that end in EOS."""
    if tokenizer.pad_token is not None and tokenizer.pad_token_id != tokenizer.eos_token_id:
        return
    vocab = tokenizer.get_vocab()
    for candidate in (tokenizer.unk_token, "<|endoftext|>"):  # Llama-2 / Vicuna pad with <unk>
        if candidate and candidate in vocab and vocab[candidate] != tokenizer.eos_token_id:
            tokenizer.pad_token = candidate
            return
    tokenizer.add_special_tokens({"pad_token": _ADDED_PAD_TOKEN})  # the model's embeddings get resized


def load_tokenizer(info: BackboneInfo, padding_side: Literal["left", "right"] = "right"):
    """AutoTokenizer; decoders get a pad token distinct from EOS. Right padding suits classification;
    pass "left" for batched generation."""
    from ..machine import default_ds_accelerator

    default_ds_accelerator()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(info.path_or_id)
    if info.family == "decoder":
        _ensure_decoder_pad(tokenizer)
    tokenizer.padding_side = padding_side
    return tokenizer


def _reinit_head(model) -> None:
    """Re-initialise every parameter outside the base model (classifier / score / pooler), so a checkpoint
    that already carries a head of the right shape does not leak it into a new judge. transformers 5 skips
    tensors flagged ``_is_hf_initialized`` (set on everything loaded), hence the flag reset."""
    for name, child in model.named_children():
        if name == model.base_model_prefix:
            continue
        for module in child.modules():
            for param in module.parameters(recurse=False):
                param._is_hf_initialized = False
            model._init_weights(module)


def load_seq_cls(
    info: BackboneInfo,
    num_labels: int,
    problem_type: str | None = None,
    *,
    tokenizer=None,
    dtype=None,
    fresh_head: bool = True,
):
    """AutoModelForSequenceClassification with a new head of ``num_labels`` outputs.

    ``problem_type``: "single_label_classification" | "regression" | "multi_label_classification".
    ``config.pad_token_id`` is taken from the tokenizer (loaded with ``load_tokenizer`` if not given).
    ``fresh_head=False`` keeps a head found in the checkpoint (e.g. to continue training a judge)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from ..machine import default_ds_accelerator

    default_ds_accelerator()
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(info)
    model = AutoModelForSequenceClassification.from_pretrained(
        info.path_or_id,
        num_labels=num_labels,
        problem_type=problem_type,
        ignore_mismatched_sizes=True,
        dtype=dtype or torch.float32,
    )
    if fresh_head:
        _reinit_head(model)
    _match_vocab(model, tokenizer)
    return model


def _match_vocab(model, tokenizer) -> None:
    """Grow the embeddings if the tokenizer gained a pad token, then point the config at the pad id
    (set after loading: an added pad id is out of range for the checkpoint's embedding matrix)."""
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id


def load_causal_lm(info: BackboneInfo, *, tokenizer=None, dtype=None):
    """AutoModelForCausalLM (decoders only), embeddings resized if ``tokenizer`` gained a pad token."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..machine import default_ds_accelerator

    if info.family != "decoder":
        raise ValueError(f"{info.path_or_id} is an {info.family} ({info.arch}); a causal LM needs a decoder")
    default_ds_accelerator()
    model = AutoModelForCausalLM.from_pretrained(info.path_or_id, dtype=dtype or torch.float32)
    if tokenizer is not None:
        _match_vocab(model, tokenizer)
    return model
