"""The verdict judge: a chat model's own verdict, read as the log-odds of its verdict tokens in one forward pass.

A fine-tuned or frozen reader with a linear head learns answer length first; a model asked whether an answer is
right brings what it knows. Here the model is asked a question from the card (``configs/verdict.yaml`` holds the
shipped ones) in its own chat template, and the logits of the first token of its reply are read: pointwise,
``log sum P(yes) - log sum P(no)`` is the answer's reward, each side's probability summed over the first tokens of
its spellings ("Yes", "yes", " Yes" against "No", "no", " No": ``verdict_token_ids``); the judge then scores, ranks
and compares by the difference of two rewards, with no answer order to lean on. Pairwise, ``log sum P(A) - log sum
P(B)`` for the answer shown first (the pair judged in both orders where ``symmetric``). No sampling, no parsing: one
padded forward pass per prompt, only the verdict tokens' rows of the output layer, so the same graph exports to ONNX
(``export.verdict``).

Both forms give the judge's raw outputs as two rewards per pair (pairwise: +-margin / 2), so calibration, ties and
the audit treat it as a reward head (Davidson's tie model fitted by ``clfjudge calibrate``).
"""
from __future__ import annotations

import hashlib
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import progress
from ..batching import Budget
from ..card import CARD_NAME, JudgeCard
from ..data.conversation import FLATTENING, note_flattened
from ..data.records import PairRecord, PointRecord
from ..models.heads import PairOutputs, RewardHead
from .base import DEFAULT_BATCH_SIZE, Judge, LoadOptions, loads

VERDICT = "verdict"  # the judge card's head name
PRESETS = "verdict.yaml"  # the shipped questions, package data (clfjudge/configs)
DEFAULT_QUESTION = "correct"
DEFAULT_MAX_QUESTION_TOKENS, DEFAULT_MAX_ANSWER_TOKENS = 384, 512
DEFAULT_VERDICT_TOKENS = 4096  # padded tokens per forward pass when the caller's budget names none
_POINT_FIELDS, _PAIR_FIELDS = {"question", "answer"}, {"question", "answer_a", "answer_b"}
_PLACEHOLDER = re.compile(r"\{(question|answer|answer_a|answer_b)\}")
MIN_SHARED_TOKENS = 16  # a shorter shared prefix is not worth a forward pass of its own
# Reading a shared prefix apart costs a forward pass of its own, the padding of two batches and attention over a
# padded cache: a group is read shared only where that saves this share of its tokens (docs/speed.md).
MIN_SAVED = 0.3


@dataclass(frozen=True)
class VerdictQuestion:
    """One question put to the model: its user turn (``{question}`` + ``{answer}``, or ``{answer_a}`` +
    ``{answer_b}`` for a pairwise one), an optional system turn, and the verdict texts whose first tokens are read
    (``positive``: the answer is right / answer A wins; ``negative``: the other way)."""

    name: str
    user: str
    positive: tuple[str, ...]
    negative: tuple[str, ...]
    system: str | None = None
    description: str = ""

    @property
    def pairwise(self) -> bool:
        return "{answer_a}" in self.user

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any], where: str) -> VerdictQuestion:
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: question {name!r} must be a mapping with user / positive / negative, got "
                             f"{data!r:.80}")
        unknown = set(data) - {"user", "positive", "negative", "system", "description", "name"}
        if unknown:
            raise ValueError(f"{where}: question {name!r} has unknown keys {sorted(unknown)}")
        for key in ("user", "positive", "negative"):
            if not data.get(key):
                raise ValueError(f"{where}: question {name!r} field {key!r} is missing or empty")
        texts = {k: tuple([data[k]] if isinstance(data[k], str) else data[k]) for k in ("positive", "negative")}
        if not all(isinstance(t, str) and t for k in texts for t in texts[k]):
            raise ValueError(f"{where}: question {name!r}: positive / negative are non-empty strings")
        question = cls(name, str(data["user"]), texts["positive"], texts["negative"], data.get("system"),
                       str(data.get("description", "")))
        fields = _PAIR_FIELDS if question.pairwise else _POINT_FIELDS
        missing = [f for f in sorted(fields) if "{" + f + "}" not in question.user]
        if missing:
            raise ValueError(f"{where}: question {name!r} field 'user' lacks the placeholders "
                             f"{', '.join('{' + f + '}' for f in missing)}")
        return question

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items() if v is not None}

    def messages(self, record: PairRecord | PointRecord, clip, split: str = "") -> list[dict[str, str]]:
        """The chat turns asking this question about ``record``, question and answers cut by ``clip``; ``split``
        (a marker) is put where the text every answer to the same question shares ends (``shared_end``)."""
        fields = {"question": clip(record.question, "question")}
        if self.pairwise:
            fields |= {"answer_a": clip(record.answer_a, "answer"), "answer_b": clip(record.answer_b, "answer")}
        else:
            fields["answer"] = clip(record.answer, "answer")
        template = self.user[:self.shared_end] + split + self.user[self.shared_end:]
        # one pass over the template: a placeholder inside the data ("{answer_b}" as answer A) stays literal text
        user = _PLACEHOLDER.sub(lambda m: fields.get(m.group(1), m.group(0)), template)
        return ([{"role": "system", "content": self.system}] if self.system else []) + [{"role": "user",
                                                                                          "content": user}]

    @property
    def shared_end(self) -> int:
        """Where the part of the user turn that holds no answer ends: the start of the paragraph (else the line) of
        the first answer placeholder. What comes before it is the same for every answer to one question, so those
        answers' prompts share their first tokens (``VerdictReader`` reads them once)."""
        first = min(i for i in (self.user.find("{" + f + "}") for f in ("answer", "answer_a", "answer_b")) if i >= 0)
        paragraph = self.user.rfind("\n\n", 0, first)
        return paragraph + 2 if paragraph >= 0 else self.user.rfind("\n", 0, first) + 1


def presets() -> dict[str, VerdictQuestion]:
    """The shipped questions (``clfjudge/configs/verdict.yaml``)."""
    import yaml

    from ..configs import config_path

    path = config_path(PRESETS)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {name: VerdictQuestion.from_dict(name, spec, str(path)) for name, spec in data.items()}


def questions_from(spec: Sequence[str | Mapping[str, Any]], where: str) -> list[VerdictQuestion]:
    """Questions from a recipe or card: a preset's name, or a mapping with ``name`` and the preset keys."""
    shipped, out = None, []
    for item in spec:
        if isinstance(item, str):
            shipped = shipped or presets()
            if item not in shipped:
                raise ValueError(f"{where}: unknown verdict question {item!r}; shipped: {', '.join(shipped)}")
            out.append(shipped[item])
        elif isinstance(item, Mapping) and isinstance(item.get("name"), str):
            out.append(VerdictQuestion.from_dict(item["name"], item, where))
        else:
            raise ValueError(f"{where}: a verdict question is a preset name or a mapping with 'name', got "
                             f"{item!r:.80}")
    if not out:
        raise ValueError(f"{where}: no verdict question given")
    if len({q.pairwise for q in out}) > 1:
        raise ValueError(f"{where}: the questions mix pointwise and pairwise ones; a judge asks one kind")
    return out


# -- the forward pass -------------------------------------------------------------------------------------------

def verdict_token_ids(tokenizer, question: VerdictQuestion) -> tuple[list[int], list[int]]:
    """The first token of each verdict text, deduplicated; a first token both sides share says nothing and is left
    out (a side left with none is an error)."""
    def ids(texts: Sequence[str]) -> list[int]:
        return list(dict.fromkeys(tokenizer.encode(t, add_special_tokens=False)[0] for t in texts))

    yes, no = ids(question.positive), ids(question.negative)
    shared = set(yes) & set(no)
    yes, no = [t for t in yes if t not in shared], [t for t in no if t not in shared]
    if not yes or not no:
        raise ValueError(f"verdict question {question.name!r}: positive {question.positive} and negative "
                         f"{question.negative} begin with the same tokens in this tokenizer")
    return yes, no


def verdict_module(model, yes: Sequence[int], no: Sequence[int]):
    """A torch module ``(input_ids, attention_mask) -> log-odds`` (batch,): the decoder's state at each row's last
    real token (right padding) through the yes / no rows of the output layer, log-sum-exp per side. The softmax's
    normaliser cancels in the difference, so the full vocabulary is never computed. Shared by the PyTorch judge
    and the ONNX export, so both compute the same graph."""
    import torch

    class VerdictLogOdds(torch.nn.Module):
        # ``model`` is an argument, not a closure: ``VerdictReader.release`` frees the weights only if nothing else
        # holds the model (its output layer shares the input embeddings' weights, and a mmapped file is freed whole)
        def __init__(self, model) -> None:
            super().__init__()
            self.decoder = model.get_decoder()
            head = model.get_output_embeddings()
            rows = torch.tensor(list(yes) + list(no))
            self.register_buffer("weight", head.weight.detach()[rows].float().clone(), persistent=False)
            bias = head.bias.detach()[rows].float().clone() if getattr(head, "bias", None) is not None else None
            self.register_buffer("bias", bias if bias is not None else torch.zeros(len(rows)), persistent=False)
            self.n_yes = len(yes)
            self.softcap = getattr(model.config, "final_logit_softcapping", None)

        def forward(self, input_ids, attention_mask):
            states = self.decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return self._log_odds(states, attention_mask)

        def _log_odds(self, states, mask):
            last = mask.long().sum(dim=1) - 1
            final = states[torch.arange(states.shape[0], device=states.device), last].float()
            with torch.autocast(final.device.type, enabled=False):  # fp32 logits: bf16 rounds the log-odds
                logits = final @ self.weight.T + self.bias
                if self.softcap:
                    logits = torch.tanh(logits / self.softcap) * self.softcap
                return (torch.logsumexp(logits[:, :self.n_yes], dim=1)
                        - torch.logsumexp(logits[:, self.n_yes:], dim=1))

        def prefix(self, input_ids, attention_mask) -> list:
            """The key/value cache of a batch of right-padded prefixes: a (keys, values) pair per layer, each
            (rows, heads, longest, head size); a row's own part is its first ``attention_mask.sum()`` positions."""
            from transformers import DynamicCache

            cache = DynamicCache(config=self.decoder.config)
            self.decoder(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            return [(layer.keys, layer.values) for layer in cache.layers]

        def after(self, prefixes: list, input_ids, attention_mask):
            """The log-odds of rows that each continue a prefix read before (``prefixes``: per row, its per-layer
            (keys, values) of shape (1, heads, its length, head size)): only the rows' own tokens are read, their
            attention reaching back into their prefix's keys and values (shorter prefixes padded and masked)."""
            from transformers import DynamicCache

            rows, lengths = input_ids.shape[0], [p[0][0].shape[-2] for p in prefixes]
            width = max(lengths)
            layers = []
            for layer in range(len(prefixes[0])):
                first = prefixes[0][layer][0]
                keys, values = (first.new_zeros((rows, first.shape[1], width, first.shape[3])) for _ in range(2))
                for row, p in enumerate(prefixes):
                    keys[row, :, :lengths[row]], values[row, :, :lengths[row]] = p[layer][0][0], p[layer][1][0]
                layers.append((keys, values))
            cache = DynamicCache(layers, config=self.decoder.config)
            device = input_ids.device
            shared = torch.zeros((rows, width), dtype=attention_mask.dtype, device=device)
            for row, n in enumerate(lengths):
                shared[row, :n] = 1
            positions = (torch.tensor(lengths, device=device).unsqueeze(1)
                         + torch.arange(input_ids.shape[1], device=device).unsqueeze(0))
            states = self.decoder(input_ids=input_ids, attention_mask=torch.cat([shared, attention_mask], dim=1),
                                  position_ids=positions, past_key_values=cache, use_cache=True).last_hidden_state
            return self._log_odds(states, attention_mask)

    return VerdictLogOdds(model).eval()


def _context(model) -> int | None:
    """The longest prompt the model reads (its position embeddings), where its config says."""
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)


class VerdictReader:
    """A chat model asked ``questions``: ``log_odds(records)`` -> (records, questions) array. Prompts are rendered in
    the model's chat template with the question and answers cut to their token budgets (first and last tokens kept),
    run in token-budget batches (``budget``, a ``batching.Budget``; default ``reader_budget``'s), and remembered
    per prompt (least recently used forgotten first, beyond ``memory.max_items``), so an answer compared twice is
    read once. Answers to one question in one call (a pair's two
    answers, a best-of-n group, a GRPO group, the same question's rows of a batch) share the prompt's first tokens:
    with ``share_prefix`` those are read once and each answer's own tokens after them, from their key/value cache."""

    def __init__(self, model, tokenizer, questions: Sequence[VerdictQuestion], *, precision: str = "auto",
                 max_question_tokens: int = DEFAULT_MAX_QUESTION_TOKENS,
                 max_answer_tokens: int = DEFAULT_MAX_ANSWER_TOKENS, budget: Budget = Budget(),
                 share_prefix: bool = True, device: str = "cpu") -> None:
        import torch

        from ..embedders.cache import MemoryCache
        from ..machine import decoder_precision

        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"{getattr(tokenizer, 'name_or_path', 'the model')}: a verdict judge asks a chat model, "
                             "and this tokenizer has no chat template")
        self.tokenizer, self.questions = tokenizer, list(questions)
        self.device = device
        self.precision, self.precision_why = decoder_precision(precision, device)
        self.budgets = {"question": max_question_tokens, "answer": max_answer_tokens}
        self.budget = reader_budget(budget)
        self.modules = self._modules(model)
        for module in self.modules if device != "cpu" else ():
            module.to(device)
        if self.precision == "bf16":  # held in bf16: autocast would cast every weight again at every forward pass
            for module in self.modules:
                module.decoder.to(torch.bfloat16)
        self.memory = MemoryCache()
        self.truncated = 0  # texts cut to their budget so far
        self.released = False  # ``release``: the weights are freed
        self.share_prefix = share_prefix
        self.min_saved = MIN_SAVED
        self.max_prompt_tokens = _context(model)
        self._split = f"\x00{uuid.uuid4().hex}\x00"  # marks the shared text's end; data cannot name it

    def release(self) -> None:
        """Free the model's weights: from now on the reader prompts and tokenizes, and answers only what it has read
        already (the export, once its graphs are written, holds a quantizer's copies of them instead)."""
        import gc

        for module in self.modules:
            module.to("meta")
        self.released = True
        gc.collect()

    def _modules(self, model) -> list:
        """One ``(input_ids, attention_mask) -> log-odds`` runner per question (an exported judge runs graphs)."""
        return [verdict_module(model, *verdict_token_ids(self.tokenizer, q)) for q in self.questions]

    def clip(self, text: str, field: str, scale: float = 1.0) -> str:
        from ..embedders.decoder import truncate_middle

        budget = max(1, int(self.budgets[field] * scale))
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= budget:
            return text
        self.truncated += 1
        return self.tokenizer.decode(truncate_middle(ids, budget))

    def prompt_ids(self, question: VerdictQuestion, record: PairRecord | PointRecord) -> list[int]:
        """The token ids the model reads for one question about one record (its reply's first token is next)."""
        return self.prompt(question, record)[0]

    def prompt(self, question: VerdictQuestion, record: PairRecord | PointRecord) -> tuple[list[int], int]:
        """``prompt_ids`` and how many of its first tokens are the same for every answer to the record's question
        (system turn, instructions, the question: ``VerdictQuestion.shared_end``). The prompt is tokenized whole, as
        before any sharing; the shared count is where it agrees with the shared text tokenized alone, so reading
        the shared tokens once and the rest after them reads exactly these ids."""
        scale = 1.0
        for _ in range(4):  # over the model's context: the question and answers cut shorter, in proportion
            text = self.tokenizer.apply_chat_template(
                question.messages(record, lambda t, f, s=scale: self.clip(t, f, s), self._split),
                add_generation_prompt=True, tokenize=False)
            cut = text.find(self._split)
            ids = self.tokenizer.encode(text[:cut] + text[cut + len(self._split):], add_special_tokens=False)
            if self.max_prompt_tokens is None or len(ids) <= self.max_prompt_tokens:
                break
            scale *= 0.95 * self.max_prompt_tokens / len(ids)
        else:
            raise ValueError(f"verdict question {question.name!r}: the prompt of record {record.id!r} is {len(ids)} "
                             f"tokens with its texts cut, over the model's context of {self.max_prompt_tokens}")
        head = self.tokenizer.encode(text[:cut], add_special_tokens=False)
        shared = next((i for i, (a, b) in enumerate(zip(ids, head)) if a != b), min(len(ids), len(head)))
        return ids, min(shared, len(ids) - 1)  # at least the last token is each answer's own

    def log_odds(self, records: Sequence[PairRecord | PointRecord]) -> np.ndarray:
        out = np.zeros((len(records), len(self.questions)))
        # the conversation goes into the question's {question} placeholder, so it is read as one text
        note_flattened("the verdict judge", (r.meta for r in records))
        for k, (question, module) in enumerate(zip(self.questions, self.modules)):
            prompts = [self.prompt(question, r) for r in records]
            keys = [hashlib.blake2b(f"{question.name}\0{p}".encode(), digest_size=16).digest() for p, _ in prompts]
            # this call's readings are held here: a memory smaller than the call forgets some before they are used
            known = self.memory.known(keys)
            todo = [key for key in dict.fromkeys(keys) if key not in known]
            if todo and self.released:
                raise RuntimeError(f"the verdict reader's weights were released; {len(todo)} prompt(s) not read "
                                   "before cannot be read")
            where = {key: keys.index(key) for key in todo}
            for key, value in zip(todo, self._run(module, [prompts[where[key]] for key in todo])):
                known[key] = self.memory[key] = value
            out[:, k] = [known[key] for key in keys]
        return out

    def _run(self, module, prompts: list[tuple[list[int], int]]) -> list[float]:
        """The log-odds of each ``(ids, shared)`` prompt. Prompts whose first ``shared`` tokens agree (answers to one
        question) read those tokens once, when several do and ``share_prefix`` is on: the shared parts in batches
        of their own, then every answer's own tokens in batches across questions, each row after its question's
        key/value cache; the others are read whole. Batches are the budget's either way (rows, padded tokens)."""
        import torch

        from ..embedders.decoder import autocast

        values = [math.nan] * len(prompts)
        shared, whole = self.share_groups(prompts)
        with torch.inference_mode(), autocast(self.precision, self.device):
            for i, value in zip(whole, self._read(module, [prompts[i][0] for i in whole])):
                values[i] = value
            for wave in self._waves(shared):
                caches = self._prefixes(module, [head for head, _ in wave])
                rows = [(g, i) for g, (_, members) in enumerate(wave) for i in members]
                tails = [prompts[i][0][len(wave[g][0]):] for g, i in rows]
                for r, value in zip(rows, self._read(module, tails, [caches[g] for g, _ in rows])):
                    values[r[1]] = value
        return values

    def share_groups(self, prompts: list[tuple[list[int], int]]) -> tuple[list[tuple[list[int], list[int]]],
                                                                          list[int]]:
        """``(shared, whole)``: the groups of ``prompts`` read shared (their common first tokens and the indices of
        the prompts that begin with them), where ``share_prefix`` is on and the tokens not read pay for the detour
        (``MIN_SAVED``), and the indices of the prompts read whole."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (ids, shared) in enumerate(prompts):
            groups.setdefault(tuple(ids[:shared]) if shared >= MIN_SHARED_TOKENS else (), []).append(i)

        def worth(head: tuple[int, ...], members: list[int]) -> bool:
            read = sum(len(prompts[i][0]) for i in members)
            return self.share_prefix and bool(head) and (len(members) - 1) * len(head) >= self.min_saved * read

        return ([(list(head), members) for head, members in groups.items() if worth(head, members)],
                [i for head, members in groups.items() if not worth(head, members) for i in members])

    def _waves(self, groups: list) -> list[list]:
        """Groups in waves whose shared parts hold at most eight budgets of tokens: their caches are held at once."""
        cap = 8 * (self.budget.max_batch_tokens or DEFAULT_VERDICT_TOKENS)
        waves, current, held = [], [], 0
        for group in groups:
            if current and held + len(group[0]) > cap:
                waves.append(current)
                current, held = [], 0
            current.append(group)
            held += len(group[0])
        return waves + ([current] if current else [])

    def _prefixes(self, module, heads: list[list[int]]) -> list[list]:
        """Each shared part's key/value cache (per layer, (1, heads, its length, head size)), read in batches."""
        caches: list[list] = [[] for _ in heads]
        for chunk in self.budget.batches([len(h) for h in heads]):
            ids, mask = self._padded([heads[g] for g in chunk])
            layers = module.prefix(ids, mask)
            progress.advance(0, sum(len(heads[g]) for g in chunk))
            for row, g in enumerate(chunk):
                caches[g] = [(k[row:row + 1, :, :len(heads[g])], v[row:row + 1, :, :len(heads[g])])
                             for k, v in layers]
        return caches

    def _padded(self, prompts: list[list[int]]):
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, :len(p)] = torch.tensor(p)
            mask[row, :len(p)] = 1
        return ids.to(self.device), mask.to(self.device)

    def _read(self, module, prompts: list[list[int]], prefixes: list | None = None) -> list[float]:
        """Right-padded token-budget batches of ``prompts`` (each after its prefix's cache where given)."""
        values = [math.nan] * len(prompts)
        for chunk in self.budget.batches([len(p) for p in prompts]):
            ids, mask = self._padded([prompts[i] for i in chunk])
            read = module(ids, mask) if prefixes is None else module.after([prefixes[i] for i in chunk], ids, mask)
            for i, value in zip(chunk, read.float().tolist()):
                values[i] = value
            progress.advance(len(chunk), sum(len(prompts[i]) for i in chunk))
        return values


# -- the judge ---------------------------------------------------------------------------------------------------

class VerdictJudge(Judge):
    """A verdict judge (``head: verdict``). Pointwise: scores, ranks and compares (r_A - r_B; position-invariant).
    Pairwise: compares, from log P(A) - log P(B) as the margin of two rewards +-margin / 2. Raw outputs are those two
    rewards per pair (one per answer scored), so calibration fits Davidson's tie model as for reward heads; with
    several questions (a stacked judge's features) the first one decides."""

    backend_name = "torch"

    def __init__(self, card: JudgeCard, reader: VerdictReader, budget: Budget | int = DEFAULT_BATCH_SIZE) -> None:
        self.pairwise = reader.questions[0].pairwise
        super().__init__(card, ("compare",) if self.pairwise else ("compare", "score"), budget)
        self.reader = reader
        self.position_invariant = not self.pairwise
        cal = card.calibration or {}
        self.head = RewardHead(scale=float(cal.get("scale", 1.0)), nu=float(cal.get("nu", 0.0)))

    def keep_readings(self, items: int) -> None:
        self.reader.memory.max_items = items

    @property
    def truncation(self) -> dict[str, Any]:
        return {"truncated_texts": self.reader.truncated, **{f"max_{k}_tokens": v
                                                              for k, v in self.reader.budgets.items()}}

    def raw_outputs(self, records: Sequence[PairRecord | PointRecord]) -> np.ndarray:
        if self.pairwise:
            margin = self.reader.log_odds(records)[:, 0]
            return np.stack([margin / 2, -margin / 2], axis=1)
        points = [p for r in records for p in self._points(r)]
        values = self.reader.log_odds(points)[:, 0]
        return values.reshape(len(records), -1)

    @staticmethod
    def _points(record: PairRecord | PointRecord) -> list[PointRecord]:
        from ..prompts.schemes import pair_to_points

        return list(pair_to_points(record)) if isinstance(record, PairRecord) else [record]

    def sequence_lengths(self, records: Sequence[PairRecord | PointRecord]) -> list[list[int]]:
        question = self.reader.questions[0]
        if self.pairwise:
            return [[len(self.reader.prompt_ids(question, r))] for r in records]
        return [[len(self.reader.prompt_ids(question, p)) for p in self._points(r)] for r in records]

    def pair_outputs(self, raw: np.ndarray) -> PairOutputs:
        return self.head.outputs(raw)

    def point_scores(self, raw: np.ndarray) -> np.ndarray:
        return RewardHead.rewards(raw)


# What a verdict judge's raw output is (the card's label_map says so): the first tokens of the question's spellings
# (``verdict_token_ids``), their probabilities summed per side.
RAW_POINT = ("log sum P(positive) - log sum P(negative) of the reply's first token, each side's probability summed "
             "over the first tokens of its spellings (question.positive / question.negative)")
RAW_PAIR = ("log sum P(A) - log sum P(B) of the reply's first token, each side summed over the first tokens of its "
            "spellings (question.positive / question.negative), as rewards +-margin / 2")


def verdict_card(backbone: str, questions: Sequence[VerdictQuestion], *, precision: str = "auto",
                 max_question_tokens: int = DEFAULT_MAX_QUESTION_TOKENS,
                 max_answer_tokens: int = DEFAULT_MAX_ANSWER_TOKENS, training: dict[str, Any] | None = None
                 ) -> JudgeCard:
    """The card of a verdict judge on ``backbone`` (an alias, hub id or directory): its questions and verdict
    tokens are in the card, so the judge needs no code to say what it asks."""
    arity = "pair" if questions[0].pairwise else "point"
    return JudgeCard(kind=VERDICT, arity=arity, backbone=backbone, scheme=f"verdict-{arity}",
                     max_length=max_question_tokens + max_answer_tokens * (2 if arity == "pair" else 1),
                     template=questions[0].user,
                     label_map={"raw": RAW_POINT if arity == "point" else RAW_PAIR},
                     truncation={"max_question_tokens": max_question_tokens, "max_answer_tokens": max_answer_tokens,
                                 "keep": "first and last tokens", "conversation": FLATTENING},
                     training=training or {},
                     calibration={"model": "davidson", "scale": 1.0, "nu": 0.0},
                     runtime={"backend": VERDICT, "precision": precision,
                              "questions": [q.to_dict() for q in questions]})


def open_reader(card: JudgeCard, directory: Path | None = None, **kw: Any) -> VerdictReader:
    """The reader a verdict card describes: its backbone (an offline alias, a hub id, or a directory; relative to
    the judge directory where one is given, then held to it as the judge directory's own files are:
    ``untrusted.check_directory``) and its questions."""
    from ..models.backbones import load_causal_lm, load_tokenizer, resolve_backbone
    from ..untrusted import check_directory, inside

    backbone = card.backbone
    if directory is not None and not Path(backbone).is_absolute() and (directory / backbone).is_dir():
        backbone = str(check_directory(inside(directory, backbone, f"{directory / CARD_NAME} field 'backbone'")))
    info = resolve_backbone(backbone)
    tokenizer = load_tokenizer(info, padding_side="right")
    questions = questions_from(card.runtime.get("questions") or [DEFAULT_QUESTION], f"{directory or 'card'}")
    return VerdictReader(load_causal_lm(info, tokenizer=tokenizer), tokenizer, questions,
                         precision=card.runtime.get("precision", "auto"),
                         max_question_tokens=int(card.truncation.get("max_question_tokens",
                                                                     DEFAULT_MAX_QUESTION_TOKENS)),
                         max_answer_tokens=int(card.truncation.get("max_answer_tokens", DEFAULT_MAX_ANSWER_TOKENS)),
                         **kw)


VERDICT_OPTIONS = ("backbone", "questions", "precision", "max_question_tokens", "max_answer_tokens", "batch_size")


def reader_from_options(options: Mapping[str, Any]) -> VerdictReader:
    """The reader a stacked judge's ``verdict`` option describes (``backbone``, ``questions`` [, ``precision``,
    budgets, ``batch_size``]): the verdict log-odds become a feature group of an embedding judge."""
    unknown = sorted(set(options) - set(VERDICT_OPTIONS))
    if unknown or not options.get("backbone"):
        raise ValueError(f"verdict option: needs backbone; known keys {list(VERDICT_OPTIONS)}; unknown {unknown}")
    card = verdict_card(str(options["backbone"]), questions_from(options.get("questions") or [DEFAULT_QUESTION],
                                                                  "verdict option"),
                        precision=options.get("precision", "auto"),
                        max_question_tokens=int(options.get("max_question_tokens", DEFAULT_MAX_QUESTION_TOKENS)),
                        max_answer_tokens=int(options.get("max_answer_tokens", DEFAULT_MAX_ANSWER_TOKENS)))
    return open_reader(card, budget=Budget(int(options.get("batch_size", DEFAULT_BATCH_SIZE))))


def reader_budget(budget: Budget) -> Budget:
    """The caller's budget, with the reader's own token budget where the caller names none (a chat prompt holds a
    question and whole answers: a batch of them unbounded would hold gigabytes of activations)."""
    return budget if budget.max_batch_tokens is not None else replace(budget, max_batch_tokens=DEFAULT_VERDICT_TOKENS)


@loads(providers=("cpu", "cuda"), readings=True)
def _load_verdict(directory: Path, card: JudgeCard, options: LoadOptions) -> Judge:
    reader = open_reader(card, directory, device=options.provider, budget=options.budget)
    judge = VerdictJudge(card, reader, options.budget)
    judge.runtime_choice = {"provider": options.provider, "file": card.backbone,
                            "why": f"{judge.reader.precision}: {judge.reader.precision_why}"}
    return judge
