"""A frozen causal LM (LLaMA / Gemma family) as the embedding judge's reader.

Sentence encoders embed an answer on its own and are trained for topical similarity, not quality. A decoder
reads the answer *after its question*, in the model's chat template, and its middle layers carry how well the
answer follows the question: the mean of one hidden layer's states over the answer tokens is the answer's
vector. Without token statistics only the layers up to the chosen one are run (the rest of the model and the
LM head are dropped), so a middle layer costs about half a forward pass.

With ``stats=True`` the decoder also scores every answer token: its log-probability after the question
(conditional) and after an empty user turn (unconditional), which give the answer's pointwise mutual
information with its question (PMI, the instruction-following signal of arXiv 2308.12032): an answer to a
*different* question, however fluent, gains little from reading this one. ``STAT_NAMES`` lists the
per-answer statistics. The unconditional pass shares its constant prefix: it is read once per batch and its
key/value cache reused for every answer (``_read_shared``).

The interface is ``TextEmbedder``'s: ``embed(texts)`` (a text read alone, e.g. questions),
``embed_answers(questions, answers)`` (answers read after their questions), ``answer_stats(questions,
answers)``; an in-memory cache keyed by a hash of the texts, saved to / loaded from ``.npz``. Vectors are
L2-normalised; statistics are not.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..batching import Budget
from ..machine import decoder_precision
from .cache import CachedEmbedder

DEFAULT_MAX_PROMPT_TOKENS = 256
DEFAULT_MAX_ANSWER_TOKENS = 384
# Answers sharing a prompt are read after one cached prompt when there are at least this many (measured: +12% on
# Auto-J test, two answers a prompt, +25% on PandaLM test; best-of-n:
# docs/speed.md#best-of-n-one-read-of-a-shared-prompt).
SHARED_PREFIX_MIN = 2
STORE_EVERY = 256  # texts read between two writes to the disk cache
PROGRESS_MIN = 256  # a read of this many texts shows a progress bar even when show_progress is off
# Per-answer token statistics (stats=True), in this order. PMI = conditional - unconditional log-probability.
STAT_NAMES = ("pmi_mean", "pmi_positive_fraction", "pmi_median", "pmi_first32", "cond_mean", "uncond_mean",
              "log_tokens")


def _key(*parts: str) -> str:
    return hashlib.blake2b("\x00".join(parts).encode("utf-8"), digest_size=16).hexdigest()


def truncate_middle(ids: list[int], limit: int) -> list[int]:
    """Keep the first and last ``limit // 2`` tokens: a chat prompt keeps its template at both ends."""
    if len(ids) <= limit:
        return ids
    head = limit // 2
    return ids[:head] + ids[len(ids) - (limit - head):]


def resolve_precision(precision: str, device: str = "cpu") -> str:
    """"auto" -> "bf16" where this machine computes in bf16 (a GPU that has it, a CPU with AMX / AVX512-BF16), else
    "fp32"; "bf16" on a machine without it -> "fp32" (``machine.decoder_precision`` says why)."""
    return decoder_precision(precision, device)[0]


def autocast(precision: str, device: str = "cpu"):
    """The context a model runs in at ``precision`` (a resolved one): bf16 autocast, or nothing for fp32."""
    import contextlib

    import torch

    if precision == "bf16":
        return torch.autocast("cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def token_stats(cond: np.ndarray, uncond: np.ndarray, n_tokens: int | None = None) -> np.ndarray:
    """``STAT_NAMES`` of one answer from its (first) tokens' conditional and unconditional log-probabilities;
    ``n_tokens``: the answer's length in tokens (default: the tokens scored)."""
    pmi = cond - uncond
    return np.array([pmi.mean(), (pmi > 0).mean(), np.median(pmi), pmi[:32].mean(), cond.mean(), uncond.mean(),
                     np.log(n_tokens or len(pmi))], dtype=np.float32)


class DecoderEmbedder(CachedEmbedder):
    """``layer``: which decoder layer's output is pooled (1-based; default the middle one, which beat the last
    layer on PandaLM: docs/training.md#embedding-judges-head-embedding). The prompt (chat template + question)
    keeps its first and last ``max_prompt_tokens / 2`` tokens; answers keep their first ``max_answer_tokens``
    tokens plus EOS.
    ``stats``: also compute the answers' token statistics (runs the whole model and its LM head), over each
    answer's first ``stats_tokens`` tokens (None: all of them; 64-128 tokens judge as well as all).
    ``precision``: "fp32", "bf16" (autocast; ~3x faster on AMX CPUs) or "auto" (``resolve_precision``).
    ``cache_dir``: keep vectors on disk between runs (``embedders.cache``; default $CLFJUDGE_EMBEDDING_CACHE).
    ``budget``: rows, padded tokens and padding per forward pass (``batching.Budget``), the judge's caller's, given
    here once. ``memory.max_items`` bounds the vectors kept in memory (``embedders.cache.CachedEmbedder``)."""

    type = "decoder"  # the EMBEDDERS entry

    def __init__(self, backbone: str, *, layer: int | None = None,
                 max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
                 max_answer_tokens: int = DEFAULT_MAX_ANSWER_TOKENS, stats: bool = False,
                 stats_tokens: int | None = None, precision: str = "fp32", budget: Budget = Budget(),
                 device: str = "cpu", show_progress: bool = False, cache_dir: str | Path | None = None) -> None:
        if max_prompt_tokens < 2 or max_answer_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 2 and max_answer_tokens >= 1, got "
                             f"{max_prompt_tokens}, {max_answer_tokens}")
        super().__init__(cache_dir)
        self.backbone = backbone
        self.layer = layer
        self.max_prompt_tokens = max_prompt_tokens
        self.max_answer_tokens = max_answer_tokens
        self.stats = bool(stats)
        if stats_tokens is not None and stats_tokens < 1:
            raise ValueError(f"stats_tokens must be a positive number of tokens or None, got {stats_tokens}")
        self.stats_tokens = stats_tokens
        self.precision_spec = precision  # as asked ("auto" is resolved per machine)
        self.precision, self.precision_why = decoder_precision(precision, device)
        self.budget = budget
        self.shared_prefix_min = SHARED_PREFIX_MIN
        self.store_every = STORE_EVERY
        self.device = device
        self.show_progress = show_progress
        self._model = None
        self._lm_head = None
        self._softcap: float | None = None
        self._tokenizer = None
        self._captured = None
        self._depth: int | None = None

    @property
    def batch_size(self) -> int:
        return self.budget.max_batch_size

    # -- identity --------------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """What the judge card stores so a loaded judge reads exactly as the trained one did (precision is a
        runtime choice, recorded beside it: bf16 and fp32 readings agree to ~1e-4)."""
        config = {"type": self.type, "layer": self._resolved_layer(), "max_prompt_tokens": self.max_prompt_tokens,
                  "max_answer_tokens": self.max_answer_tokens, "stats": self.stats}
        return {**config, "stats_tokens": self.stats_tokens} if self.stats_tokens else config

    @property
    def cache_id(self) -> str:
        # the prompt frame the answer is read in (chat template or the base-model frame) is part of the reading
        frame = hashlib.blake2b("\0".join(self.template_parts()).encode("utf-8", "surrogatepass"),
                                digest_size=4).hexdigest()
        return (f"{self.backbone}|layer={self._resolved_layer()}|prompt={self.max_prompt_tokens}"
                f"|answer={self.max_answer_tokens}|stats={int(self.stats)}"
                f"{f'@{self.stats_tokens}' if self.stats_tokens else ''}|frame={frame}|{self.precision}")

    @property
    def hidden_size(self) -> int:
        self._load()
        return self._model.config.hidden_size

    def _resolved_layer(self) -> int:
        """The layer to pool, checked against the model's depth (read from its config, no weights loaded)."""
        if self._depth is None:
            from transformers import AutoConfig

            from ..models.backbones import resolve_backbone

            info = resolve_backbone(self.backbone)
            if info.family != "decoder":
                raise ValueError(f"{self.backbone} is an {info.family} ({info.arch}); DecoderEmbedder needs a "
                                 "decoder")
            self._depth = AutoConfig.from_pretrained(info.path_or_id).get_text_config().num_hidden_layers
            self.layer = self._depth // 2 if self.layer is None else self.layer
            if not 1 <= self.layer <= self._depth:
                raise ValueError(f"layer {self.layer} out of range: {self.backbone} has {self._depth} decoder layers")
        return self.layer

    @property
    def truncation_policy(self) -> str:
        return (f"answers are read after their question in the chat template; the prompt keeps its first and last "
                f"{self.max_prompt_tokens // 2} tokens, an answer its first {self.max_answer_tokens} tokens")

    @property
    def max_seq_length(self) -> int:
        return self.max_prompt_tokens + self.max_answer_tokens + 1

    # -- model -----------------------------------------------------------------------------------------
    def _load(self) -> None:
        if self._model is not None:
            return
        from .memory import return_freed_buffers

        return_freed_buffers()  # answers of varying lengths otherwise fragment the heap (clfjudge/embedders/memory.py)
        import torch
        from transformers import AutoModel, AutoModelForCausalLM

        from ..machine import default_ds_accelerator
        from ..models.backbones import resolve_backbone

        default_ds_accelerator()
        layer = self._resolved_layer()
        info = resolve_backbone(self.backbone)
        self._load_tokenizer()
        if self.stats:  # the whole model: the LM head scores every answer token
            lm = AutoModelForCausalLM.from_pretrained(info.path_or_id, dtype=torch.float32)
            model, self._lm_head = lm.get_decoder(), lm.get_output_embeddings().eval().to(self.device)
            self._softcap = getattr(lm.config.get_text_config(), "final_logit_softcapping", None)
        else:
            model = AutoModel.from_pretrained(info.path_or_id, dtype=torch.float32)
            model.layers = model.layers[:layer]  # later layers never influence the pooled one
        model.layers[layer - 1].register_forward_hook(self._capture)
        self._model = model.eval().to(self.device)

    def _load_tokenizer(self) -> None:
        """The tokenizer alone (the prompt frame, hence the cache identity, needs it; the weights wait)."""
        if self._tokenizer is None:
            from ..models.backbones import load_tokenizer, resolve_backbone

            self._tokenizer = load_tokenizer(resolve_backbone(self.backbone))

    def _capture(self, module, inputs, output) -> None:
        self._captured = output[0] if isinstance(output, tuple) else output

    def _autocast(self):
        return autocast(self.precision, self.device)

    # -- tokens (a subclass running another backend overrides _ids, _eos and template_parts) ----------------
    def _ids(self, text: str) -> list[int]:
        return self._tokenizer(text, add_special_tokens=False).input_ids

    @property
    def _eos(self) -> int:
        return self._tokenizer.eos_token_id

    def _render(self, question: str) -> str:
        tok = self._tokenizer
        if tok.chat_template:
            return tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                           add_generation_prompt=True)
        # A base model (e.g. gemma-3-270m): a plain question/answer frame, opened by BOS as in pre-training
        # (Gemma's states collapse without it; the tokenizer parses the special token in the text).
        return f"{tok.bos_token or ''}Question: {question}\n\nAnswer: "

    def template_parts(self) -> tuple[str, str]:
        """(text before, text after) the question in the rendered prompt: what an exported reader renders."""
        self._load_tokenizer()
        sentinel = "\uE000clfjudge-question\uE000"  # a private-use character no template produces
        before, found, after = self._render(sentinel).partition(sentinel)
        if not found:
            raise ValueError(f"{self.backbone}: the chat template does not insert the question verbatim")
        return before, after

    def _template(self, question: str) -> list[int]:
        return self._ids(self._render(question))

    # -- the tokens a reading is made of, for the exporter and the probes (each loads the tokenizer alone) ------
    def token_ids(self, text: str) -> list[int]:
        """``text``'s tokens, no special tokens added."""
        self._load_tokenizer()
        return self._ids(text)

    @property
    def eos_id(self) -> int:
        """The token that ends every answer read (and pads a batch)."""
        self._load_tokenizer()
        return self._eos

    def prompt_ids(self, question: str) -> list[int]:
        """The prompt an answer is read after: ``question`` in the chat template, its first and last
        ``max_prompt_tokens / 2`` tokens kept."""
        self._load_tokenizer()
        return truncate_middle(self._template(question), self.max_prompt_tokens)

    def answer_ids(self, answer: str) -> list[int]:
        """An answer's tokens as read: its first ``max_answer_tokens`` plus EOS."""
        self._load_tokenizer()
        return self._ids(answer)[:self.max_answer_tokens] + [self._eos]

    _prompt_ids = prompt_ids  # the names export/embedding.py calls
    _answer_ids = answer_ids

    def _text_ids(self, text: str) -> list[int]:
        return self._ids(text)[:self.max_seq_length - 1] + [self._eos]

    def _log_probs(self, states, targets):
        """Log-probability of each target token given the final states just before it (float32)."""
        import torch

        logits = self._lm_head(states).float()
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]

    def _scored(self, body: list[int]) -> list[int]:
        """The tokens whose statistics are computed: the first ``stats_tokens`` (a causal model's log-probability
        of a token does not depend on what follows it, so this is exact for them, and cheaper)."""
        return body if self.stats_tokens is None else body[:self.stats_tokens]

    def _batches(self, lengths: list[int]) -> list[list[int]]:
        """Indices by token length in batches within the reader's ``budget`` (``batching.Budget``)."""
        return self.budget.batches(lengths)

    def _read(self, items: list[tuple[list[int], list[int]]],
              with_log_probs: bool) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """Mean of the layer's states over each item's second part and, if asked, the log-probability of each
        token of the second part (each prefix must then be non-empty). Items are batched by length with right
        padding (a causal model's states at real tokens do not see the padding after them)."""
        import torch

        out = np.zeros((len(items), self._model.config.hidden_size), dtype=np.float32)
        log_probs: list[np.ndarray] | None = [np.zeros(0)] * len(items) if with_log_probs else None
        # padding sits after every real token and is never pooled: any in-vocabulary id will do (a pad token that
        # load_tokenizer had to add would be outside the frozen model's embedding table)
        pad = self._eos
        with torch.inference_mode(), self._autocast():
            for batch in self._batches([len(p) + len(b) for p, b in items]):
                width = max(len(items[i][0]) + len(items[i][1]) for i in batch)
                ids = torch.full((len(batch), width), pad, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                pool = torch.zeros((len(batch), width), dtype=torch.float32)
                for row, i in enumerate(batch):
                    prefix, body = items[i]
                    ids[row, :len(prefix) + len(body)] = torch.tensor(prefix + body)
                    mask[row, :len(prefix) + len(body)] = 1
                    pool[row, len(prefix):len(prefix) + len(body)] = 1 / len(body)
                final = self._model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
                out[batch] = torch.einsum("bt,btd->bd", pool, self._captured.float().cpu()).float().numpy()
                if log_probs is not None:
                    states = final.last_hidden_state
                    for row, i in enumerate(batch):
                        prefix, body = items[i]
                        scored = self._scored(body)
                        span = slice(len(prefix) - 1, len(prefix) + len(scored) - 1)  # states that predict them
                        target = torch.tensor(scored, device=states.device)
                        log_probs[i] = self._log_probs(states[row, span], target).float().cpu().numpy()
        return out, log_probs

    def _read_shared(self, prefix: list[int], bodies: list[list[int]],
                     with_log_probs: bool) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """``_read`` of many bodies after one shared ``prefix`` (best-of-n candidates, GRPO groups, the empty turn
        of the unconditional pass): the prefix is read once per batch and its key/value cache reused for every
        body. Same numbers as reading prefix + body whole, up to float rounding."""
        import torch

        vectors = np.zeros((len(bodies), self._model.config.hidden_size), dtype=np.float32)
        log_probs: list[np.ndarray] | None = [np.zeros(0)] * len(bodies) if with_log_probs else None
        pad = self._eos
        with torch.inference_mode(), self._autocast():
            for batch in self._batches([len(prefix) + len(b) for b in bodies]):
                head = self._model(input_ids=torch.tensor([prefix], device=self.device), use_cache=True)
                cache = head.past_key_values
                cache.batch_repeat_interleave(len(batch))
                width = max(len(bodies[i]) for i in batch)
                ids = torch.full((len(batch), width), pad, dtype=torch.long)
                mask = torch.zeros((len(batch), len(prefix) + width), dtype=torch.long)
                mask[:, :len(prefix)] = 1
                pool = torch.zeros((len(batch), width), dtype=torch.float32)
                for row, i in enumerate(batch):
                    ids[row, :len(bodies[i])] = torch.tensor(bodies[i])
                    mask[row, len(prefix):len(prefix) + len(bodies[i])] = 1
                    pool[row, :len(bodies[i])] = 1 / len(bodies[i])
                states = self._model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                     past_key_values=cache, use_cache=True).last_hidden_state
                vectors[batch] = torch.einsum("bt,btd->bd", pool, self._captured.float().cpu()).float().numpy()
                if log_probs is None:
                    continue
                first = head.last_hidden_state[0, -1]  # predicts every body's first token
                for row, i in enumerate(batch):
                    scored = self._scored(bodies[i])
                    predictors = torch.cat([first[None], states[row, :len(scored) - 1]])
                    target = torch.tensor(scored, device=states.device)
                    log_probs[i] = self._log_probs(predictors, target).float().cpu().numpy()
        return vectors, log_probs

    def _read_all(self, items: list[tuple[list[int], list[int]]],
                  with_log_probs: bool) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """``_read`` of every item; items whose prompt is shared by at least ``shared_prefix_min`` others are read
        with the prompt's key/value cache shared (``_read_shared``)."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (prefix, _) in enumerate(items):
            groups.setdefault(tuple(prefix), []).append(i)
        shared = [g for p, g in groups.items() if p and len(g) >= self.shared_prefix_min]
        rest = sorted(set(range(len(items))) - {i for g in shared for i in g})
        vectors = np.zeros((len(items), self.hidden_size), dtype=np.float32)
        log_probs: list[np.ndarray] | None = [np.zeros(0)] * len(items) if with_log_probs else None
        parts = [(rest, self._read([items[i] for i in rest], with_log_probs))] if rest else []
        parts += [(g, self._read_shared(list(items[g[0]][0]), [items[i][1] for i in g], with_log_probs))
                  for g in shared]
        for index, (vecs, lps) in parts:
            vectors[index] = vecs
            for j, i in enumerate(index):
                if log_probs is not None:
                    log_probs[i] = lps[j]
        return vectors, log_probs

    def _lookup(self, keys: list[str], build, with_stats: bool = False) -> np.ndarray:
        """Cached rows of ``keys``; missing ones are read (``build(i)`` -> prefix ids, body ids): the body's
        normalised vector, followed by its ``STAT_NAMES`` when ``with_stats``."""
        found = self.cached(keys)
        missing = {k: i for i, k in enumerate(keys) if k not in found}
        if missing:
            self._load()
        # read in blocks stored as they finish, so an interrupted run keeps what it read; answers that share a
        # prompt are kept in one block so they still share its key/value cache
        built = {k: build(i) for k, i in missing.items()}
        pending = sorted(built, key=lambda k: built[k][0])
        bar = self._progress(len(pending))
        start = tokens = 0
        while start < len(pending):
            end = min(start + self.store_every, len(pending))
            while end < len(pending) and built[pending[end]][0] == built[pending[end - 1]][0]:
                end += 1
            block, start = pending[start:end], end
            items = [built[k] for k in block]
            vectors, cond = self._read_all(items, with_stats)
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.where(norms > 0, norms, 1)
            if cond is not None:  # statistics of what follows each prefix, against an empty user turn
                uncond = self._read_shared(self._template(""), [self._scored(body) for _, body in items], True)[1]
                stats = np.stack([token_stats(c, u, len(body)) for c, u, (_, body) in zip(cond, uncond, items)])
                vectors = np.hstack([vectors, stats])
            found.update(zip(block, vectors))
            self.store(block, vectors)
            tokens += sum(len(p) + len(b) for p, b in items)
            bar.update(len(block))
            bar.set_postfix(tokens=f"{tokens:,}", refresh=False)  # read so far, prompts included
        bar.close()
        return np.stack([found[k] for k in keys])

    def _progress(self, total: int):
        """One bar per read (count, answers/s, time left), block by block: on when asked, and on any read long
        enough to wait for (a training pool, an audit set), in a log as well as on a terminal."""
        from tqdm.auto import tqdm

        desc = f"reading with {self.backbone} layer {self.layer} ({self.precision})"
        return tqdm(total=total, unit="answer", desc=desc,
                    disable=not (self.show_progress or total >= PROGRESS_MIN), mininterval=10)

    # -- public ----------------------------------------------------------------------------------------
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(n, hidden) of texts read alone (no template), e.g. questions."""
        if not texts:
            raise ValueError("embed() needs at least one text")
        texts = list(texts)
        return self._lookup([_key("text", t) for t in texts], lambda i: ([], self._text_ids(texts[i])))

    @property
    def _n_stats(self) -> int:
        return len(STAT_NAMES) if self.stats else 0

    def _answers(self, questions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
        if len(questions) != len(answers):
            raise ValueError(f"{len(questions)} questions for {len(answers)} answers")
        if not answers:
            raise ValueError("embed_answers() needs at least one answer")
        questions, answers = list(questions), list(answers)
        return self._lookup([_key("answer", q, a) for q, a in zip(questions, answers)],
                            lambda i: (self.prompt_ids(questions[i]), self.answer_ids(answers[i])), self.stats)

    def pending_lengths(self, questions: Sequence[str], answers: Sequence[str]) -> list[int]:
        """Token lengths (prompt + answer) of the answers ``embed_answers`` would read now: those not in the
        in-memory cache (a token budget counts what runs, and a cached answer does not)."""
        self._load_tokenizer()
        return [len(self.prompt_ids(q)) + len(self.answer_ids(a)) for q, a in zip(questions, answers)
                if _key("answer", q, a) not in self.memory]

    def pending_text_lengths(self, texts: Sequence[str]) -> list[int]:
        """``pending_lengths`` of ``embed``: the token lengths of the texts not in the in-memory cache."""
        self._load_tokenizer()
        return [len(self._text_ids(t)) for t in texts if _key("text", t) not in self.memory]

    def embed_answers(self, questions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
        """(n, hidden) of each answer read after its question in the chat template."""
        rows = self._answers(questions, answers)
        return rows[:, :rows.shape[1] - self._n_stats]

    def answer_stats(self, questions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
        """(n, len(STAT_NAMES)) token statistics of each answer after its question (``stats=True`` only)."""
        if not self.stats:
            raise ValueError("answer_stats needs an embedder built with stats=True")
        return self._answers(questions, answers)[:, -self._n_stats:]
