"""A frozen causal LM (LLaMA / Gemma family) as the embedding judge's encoder.

Sentence encoders embed an answer on its own and are trained for topical similarity, not quality. A decoder
reads the answer *after its question*, in the model's chat template, and its middle layers carry how well the
answer follows the question: the mean of one hidden layer's states over the answer tokens is the answer's
vector. Only the layers up to the chosen one are run (the rest of the model and the LM head are dropped), so
a middle layer costs about half a forward pass.

The interface is ``TextEmbedder``'s: ``embed(texts)`` (a text read alone, e.g. questions),
``embed_answers(questions, answers)`` (answers read after their questions), an in-memory cache keyed by a
hash of the texts, saved to / loaded from ``.npz``. Vectors are L2-normalised.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np

DEFAULT_MAX_PROMPT_TOKENS = 256
DEFAULT_MAX_ANSWER_TOKENS = 384


def _key(*parts: str) -> str:
    return hashlib.blake2b("\x00".join(parts).encode("utf-8"), digest_size=16).hexdigest()


def truncate_middle(ids: list[int], limit: int) -> list[int]:
    """Keep the first and last ``limit // 2`` tokens: a chat prompt keeps its template at both ends."""
    if len(ids) <= limit:
        return ids
    head = limit // 2
    return ids[:head] + ids[len(ids) - (limit - head):]


class DecoderEmbedder:
    """``layer``: which decoder layer's output is pooled (1-based; default the middle one, which beat the last
    layer on PandaLM in bench/embedding_judge_cv.py). The prompt (chat template + question) keeps its first and
    last ``max_prompt_tokens / 2`` tokens; answers keep their first ``max_answer_tokens`` tokens plus EOS."""

    kind = "decoder"

    def __init__(self, encoder: str, *, layer: int | None = None,
                 max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
                 max_answer_tokens: int = DEFAULT_MAX_ANSWER_TOKENS, batch_size: int = 8, device: str = "cpu",
                 show_progress: bool = False) -> None:
        if max_prompt_tokens < 2 or max_answer_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 2 and max_answer_tokens >= 1, got "
                             f"{max_prompt_tokens}, {max_answer_tokens}")
        self.encoder = encoder
        self.layer = layer
        self.max_prompt_tokens = max_prompt_tokens
        self.max_answer_tokens = max_answer_tokens
        self.batch_size = batch_size
        self.device = device
        self.show_progress = show_progress
        self._model = None
        self._tokenizer = None
        self._captured = None
        self._depth: int | None = None
        self._cache: dict[str, np.ndarray] = {}

    # -- identity --------------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """What the judge card stores so a loaded judge embeds exactly as the trained one did."""
        return {"kind": self.kind, "layer": self._resolved_layer(), "max_prompt_tokens": self.max_prompt_tokens,
                "max_answer_tokens": self.max_answer_tokens}

    @property
    def cache_id(self) -> str:
        return (f"{self.encoder}|layer={self._resolved_layer()}|prompt={self.max_prompt_tokens}"
                f"|answer={self.max_answer_tokens}")

    def _resolved_layer(self) -> int:
        """The layer to pool, checked against the model's depth (read from its config, no weights loaded)."""
        if self._depth is None:
            from transformers import AutoConfig

            from .backbones import resolve_backbone

            info = resolve_backbone(self.encoder)
            if info.family != "decoder":
                raise ValueError(f"{self.encoder} is an {info.family} ({info.arch}); DecoderEmbedder needs a "
                                 "decoder")
            self._depth = AutoConfig.from_pretrained(info.path_or_id).get_text_config().num_hidden_layers
            self.layer = self._depth // 2 if self.layer is None else self.layer
            if not 1 <= self.layer <= self._depth:
                raise ValueError(f"layer {self.layer} out of range: {self.encoder} has {self._depth} decoder layers")
        return self.layer

    @property
    def truncation_policy(self) -> str:
        return (f"answers are read after their question in the chat template; the prompt keeps its first and last "
                f"{self.max_prompt_tokens // 2} tokens, an answer its first {self.max_answer_tokens} tokens")

    @property
    def max_seq_length(self) -> int:
        return self.max_prompt_tokens + self.max_answer_tokens + 1

    def __len__(self) -> int:
        return len(self._cache)

    # -- model -----------------------------------------------------------------------------------------
    def _load(self) -> None:
        if self._model is not None:
            return
        import torch
        from transformers import AutoModel

        from .backbones import load_tokenizer, resolve_backbone

        layer = self._resolved_layer()
        info = resolve_backbone(self.encoder)
        self._tokenizer = load_tokenizer(info)
        model = AutoModel.from_pretrained(info.path_or_id, dtype=torch.float32)
        model.layers = model.layers[:layer]  # later layers never influence the pooled one
        model.layers[-1].register_forward_hook(self._capture)
        self._model = model.eval().to(self.device)

    def _capture(self, module, inputs, output) -> None:
        self._captured = output[0] if isinstance(output, tuple) else output

    def _prompt_ids(self, question: str) -> list[int]:
        tok = self._tokenizer
        if tok.chat_template:
            text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                           add_generation_prompt=True)
        else:
            text = f"{question}\n\n"
        return truncate_middle(tok(text, add_special_tokens=False).input_ids, self.max_prompt_tokens)

    def _answer_ids(self, answer: str) -> list[int]:
        ids = self._tokenizer(answer, add_special_tokens=False).input_ids[:self.max_answer_tokens]
        return ids + [self._tokenizer.eos_token_id]

    def _text_ids(self, text: str) -> list[int]:
        ids = self._tokenizer(text, add_special_tokens=False).input_ids[:self.max_seq_length - 1]
        return ids + [self._tokenizer.eos_token_id]

    def _encode(self, items: list[tuple[list[int], list[int]]]) -> np.ndarray:
        """Mean of the layer's states over each item's second part; items are batched by length with right
        padding (a causal model's states at real tokens do not see the padding after them)."""
        import torch

        order = sorted(range(len(items)), key=lambda i: len(items[i][0]) + len(items[i][1]))
        out = np.zeros((len(items), self._model.config.hidden_size), dtype=np.float32)
        batches = [order[s:s + self.batch_size] for s in range(0, len(order), self.batch_size)]
        if self.show_progress:
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc=f"embedding with {self.encoder} layer {self.layer}")
        # padding sits after every real token and is never pooled: any in-vocabulary id will do (a pad token that
        # load_tokenizer had to add would be outside the frozen model's embedding table)
        pad = self._tokenizer.eos_token_id
        with torch.inference_mode():
            for batch in batches:
                width = max(len(items[i][0]) + len(items[i][1]) for i in batch)
                ids = torch.full((len(batch), width), pad, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                pool = torch.zeros((len(batch), width), dtype=torch.float32)
                for row, i in enumerate(batch):
                    prefix, body = items[i]
                    ids[row, :len(prefix) + len(body)] = torch.tensor(prefix + body)
                    mask[row, :len(prefix) + len(body)] = 1
                    pool[row, len(prefix):len(prefix) + len(body)] = 1 / len(body)
                self._model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
                states = self._captured.float().cpu()
                out[batch] = torch.einsum("bt,btd->bd", pool, states).numpy()
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1)

    def _lookup(self, keys: list[str], build) -> np.ndarray:
        missing = {k: i for i, k in enumerate(keys) if k not in self._cache}
        if missing:
            self._load()
            vectors = self._encode([build(i) for i in missing.values()])
            self._cache.update(zip(missing, vectors))
        return np.stack([self._cache[k] for k in keys])

    # -- public ----------------------------------------------------------------------------------------
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(n, hidden) of texts read alone (no template), e.g. questions."""
        if not texts:
            raise ValueError("embed() needs at least one text")
        texts = list(texts)
        return self._lookup([_key("text", t) for t in texts], lambda i: ([], self._text_ids(texts[i])))

    def embed_answers(self, questions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
        """(n, hidden) of each answer read after its question in the chat template."""
        if len(questions) != len(answers):
            raise ValueError(f"{len(questions)} questions for {len(answers)} answers")
        if not answers:
            raise ValueError("embed_answers() needs at least one answer")
        questions, answers = list(questions), list(answers)
        return self._lookup([_key("answer", q, a) for q, a in zip(questions, answers)],
                            lambda i: (self._prompt_ids(questions[i]), self._answer_ids(answers[i])))

    def clear_cache(self) -> None:
        """Forget every stored vector (a long-running judge can bound its memory this way)."""
        self._cache.clear()

    def save_cache(self, path: str | Path) -> Path:
        from .embedding_judge import save_vectors

        return save_vectors(path, self._cache, self.cache_id)

    def load_cache(self, path: str | Path) -> int:
        from .embedding_judge import load_vectors

        return load_vectors(path, self._cache, self.cache_id)
