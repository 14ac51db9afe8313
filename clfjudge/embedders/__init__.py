"""Embedders: what turns texts into the vectors (and statistics) an embedding judge reads.

- ``sentence``: a frozen sentence encoder embeds each text on its own (``TextEmbedder``);
- ``decoder``: a frozen causal LM reads each answer after its question: one layer's mean state, token
  statistics (``DecoderEmbedder``); ``onnx_reader``: the same reader as an exported ONNX graph;
- ``cache``: embeddings on disk between runs, one shard directory per embedder identity;
- ``memory``: freed activation buffers returned to the system while reading.

``make_embedder(backbone)`` picks the embedder type from the backbone family (``EMBEDDERS``); a
sentence-transformers folder is a sentence encoder."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..registry import Registry
from .sentence import DEFAULT_ENCODER, TextEmbedder


def _decoder_embedder(backbone: str, **options):
    from .decoder import DecoderEmbedder

    return DecoderEmbedder(backbone, **options)


# Backbone family -> embedder type: sentence encoders embed texts alone, decoders read each answer after its question.
EMBEDDERS: Registry[Callable[..., Any]] = Registry("embedder type")
EMBEDDERS.register("sentence", TextEmbedder)
EMBEDDERS.register("decoder", _decoder_embedder)
TYPE_OF_FAMILY = {"encoder": "sentence", "decoder": "decoder"}


def make_embedder(backbone: str = DEFAULT_ENCODER, type: str | None = None, **options):
    """The embedder reading with ``backbone``: ``type`` "sentence" | "decoder", by default chosen from its family
    (reading its config, loading no weights). ``options`` go to the embedder (batch_size, device, layer, ...)."""
    if type is None:
        from ..models.backbones import resolve_backbone

        info = resolve_backbone(backbone)
        # a sentence-transformers folder is a sentence encoder whatever its architecture (EmbeddingGemma is a
        # bidirectional Gemma3, whose model type alone reads as a decoder)
        sentence = info.source != "hub" and (Path(info.path_or_id) / "modules.json").is_file()
        type = "sentence" if sentence else TYPE_OF_FAMILY[info.family]
    return EMBEDDERS.get(type)(backbone, **options)
