"""Embedders: what turns texts into the vectors (and statistics) an embedding judge reads.

- ``sentence``: a frozen sentence encoder embeds each text on its own (``TextEmbedder``);
- ``decoder``: a frozen causal LM reads each answer after its question: one layer's mean state, token
  statistics (``DecoderEmbedder``); ``onnx_reader``: the same reader as an exported ONNX graph;
- ``cache``: embeddings on disk between runs, one shard directory per embedder identity;
- ``memory``: freed activation buffers returned to the system while reading.

``make_embedder(encoder)`` picks the kind from the backbone family (``EMBEDDERS``); a sentence-transformers folder
is a sentence encoder."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..registry import Registry
from .sentence import DEFAULT_ENCODER, TextEmbedder


def _decoder_embedder(encoder: str, **options):
    from .decoder import DecoderEmbedder

    return DecoderEmbedder(encoder, **options)


# Backbone family -> embedder: sentence encoders embed texts alone, decoders read each answer after its question.
EMBEDDERS: Registry[Callable[..., Any]] = Registry("embedder kind")
EMBEDDERS.register("sentence", TextEmbedder)
EMBEDDERS.register("decoder", _decoder_embedder)
KIND_OF_FAMILY = {"encoder": "sentence", "decoder": "decoder"}


def make_embedder(encoder: str = DEFAULT_ENCODER, kind: str | None = None, **options):
    """The embedder for ``encoder``: ``kind`` "sentence" | "decoder", by default chosen from the backbone family
    (reading its config, loading no weights). ``options`` go to the embedder (batch_size, device, layer, ...)."""
    if kind is None:
        from ..models.backbones import resolve_backbone

        info = resolve_backbone(encoder)
        # a sentence-transformers folder is a sentence encoder whatever its architecture (EmbeddingGemma is a
        # bidirectional Gemma3, whose model type alone reads as a decoder)
        sentence = info.source != "hub" and (Path(info.path_or_id) / "modules.json").is_file()
        kind = "sentence" if sentence else KIND_OF_FAMILY[info.family]
    return EMBEDDERS.get(kind)(encoder, **options)
