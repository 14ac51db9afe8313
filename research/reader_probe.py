"""Which frozen reader, layer, length feature and regularisation generalize across preference sources?

A probe of the embedding judge's design space, cheaper than the scoreboard: each answer is read once after its
question by a frozen decoder with forward hooks on several layers (the mean state over the answer tokens of
each hooked layer is kept: one pass gives every layer), and linear pairwise heads over difference features are
fitted in seconds. The protocol is the one the default recipe was chosen by:

- **leave one source out** over the training pool (AlpacaEval GPT-4, AlpacaEval 2 GPT-4-turbo, Chatbot Arena
  votes, HH-RLHF, UltraFeedback, LLMEval²): train on five sources, score the sixth, whose annotators and answer
  styles the head never saw;
- **dev**: LLMBar's case-study sets (never reported as held out);
- every number is accuracy on the set's non-tie pairs minus "longer answer wins" on the same pairs.

The evaluation sets (PandaLM, Auto-J, LLMBar) are scored and written too, as a report; no choice reads them.
Features: the hooked layer's mean state, ``info`` = log zlib-compressed bytes of the answer (information length,
``judges.features.information_lengths``), ``chars`` = log characters. Heads: logistic regression without
intercept on both answer orders, every pool source carrying the same total weight, feature groups scaled to
equal variance (as ``EmbeddingModel``'s linear heads).

Readings are cached as ``.npz`` per (reader, set) under ``--cache`` (default ``~/.cache/clfjudge/probe``), so a
re-run only fits. Writes research/results/reader_probe_<date>.{md,json}.

    OMP_NUM_THREADS=2 .venv/bin/python research/reader_probe.py [--readers smollm2:8,15,20,30 gemma3:6,9]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write  # noqa: E402

POOL = {"alpacaeval-gpt4": 1200, "alpacaeval-gpt4turbo": 400, "arena-votes": 1200, "hh-rlhf": 800,
        "ultrafeedback": 1195, "llmeval2": 1000}
DEV = ("llmbar-case-constraint", "llmbar-case-negation", "llmbar-case-normal", "llmbar-case-base9",
       "llmbar-case-base10")
TEST = ("pandalm-test", "autoj-test", "llmbar-natural", "llmbar-neighbor", "llmbar-gptinst", "llmbar-gptout",
        "llmbar-manual", "llmbar-faireval", "llmbar-llmeval2")
MAX_PROMPT, MAX_ANSWER, BATCH_TOKENS = 256, 384, 4096


def load_sets() -> dict[str, list]:
    """Pool samples (decontaminated against every dev and test set, seeded) and the dev and test sets."""
    from clfjudge.data.records import PairRecord
    from clfjudge.data.sources import load
    from clfjudge.data.splits import decontaminate

    named = {n: [r for r in load(n).records if isinstance(r, PairRecord)] for n in (*DEV, *TEST)}
    against = [r for recs in named.values() for r in recs]
    against += load("prometheus-mtbench").records + load("prometheus-vicuna").records
    rng = random.Random(0)
    for source, cap in POOL.items():
        kept = decontaminate([r for r in load(source).records if isinstance(r, PairRecord)], against)[0]
        rng.shuffle(kept)
        named[f"pool:{source}"] = kept[:cap]
    return named


def text_key(question: str, answer: str) -> str:
    return hashlib.blake2b((question + "\0" + answer).encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def answer_items(spec: str, records: list) -> tuple[list[tuple[str, list[int], list[int]]], int]:
    """Each distinct (question, answer) of ``records`` once, as (text key, prompt ids, answer ids) tokenized and
    templated as the library's reader does (its token limits: MAX_PROMPT, MAX_ANSWER), and the padding id."""
    from clfjudge.embedders.decoder import DecoderEmbedder

    reader = DecoderEmbedder(spec, max_prompt_tokens=MAX_PROMPT, max_answer_tokens=MAX_ANSWER)
    items = {}
    for r in records:
        for answer in (r.answer_a, r.answer_b):
            key = text_key(r.question, answer)
            if key not in items:
                items[key] = (reader.prompt_ids(r.question), reader.answer_ids(answer))
    return [(key, prompt, body) for key, (prompt, body) in items.items()], reader.eos_id


def padded_batches(entries: list, pad: int):
    """Token-budgeted batches of ``answer_items``-shaped entries (key, prefix ids, body ids), each read as prefix +
    body: yields (indices into ``entries``, input ids, attention mask), rows x the longest within the budget."""
    import torch

    from clfjudge.batching import token_batches

    lengths = [len(prefix) + len(body) for _, prefix, body in entries]
    for batch in token_batches(lengths, max(len(entries), 1), BATCH_TOKENS):
        ids = torch.full((len(batch), max(lengths[j] for j in batch)), pad)
        mask = torch.zeros_like(ids)
        for row, j in enumerate(batch):
            ids[row, :lengths[j]] = torch.tensor(entries[j][1] + entries[j][2])
            mask[row, :lengths[j]] = 1
        yield batch, ids, mask


def read_states(spec: str, layers: list[int], entries: list, pad: int, precision: str, keep) -> None:
    """Read every ``answer_items`` entry after its question with ``spec`` cut at the deepest of ``layers``, in
    token-budgeted batches; ``keep(batch, states)`` gets each batch's indices into ``entries`` and every hooked
    layer's states (rows x padded tokens x hidden, fp32)."""
    import torch
    from transformers import AutoModel

    from clfjudge.embedders.decoder import autocast, resolve_precision

    model = AutoModel.from_pretrained(str(reader_path(spec)), dtype=torch.float32).eval()
    model.layers = model.layers[:max(layers)]
    captured = {}
    for layer in layers:
        model.layers[layer - 1].register_forward_hook(
            lambda m, i, o, layer=layer: captured.__setitem__(layer, o[0] if isinstance(o, tuple) else o))
    with torch.inference_mode(), autocast(resolve_precision(precision)):
        for batch, ids, mask in padded_batches(entries, pad):
            model(input_ids=ids, attention_mask=mask)
            keep(batch, {layer: captured[layer].float() for layer in layers})


def token_nll(spec: str, entries: list, pad: int, precision: str) -> list[np.ndarray]:
    """Per entry (key, prefix ids, target ids): the negative log-likelihood (nats) of each target token after the
    prefix and the targets before it, under the whole causal LM ``spec`` (an empty target: an empty array)."""
    import torch
    from transformers import AutoModelForCausalLM

    from clfjudge.embedders.decoder import autocast, resolve_precision

    model = AutoModelForCausalLM.from_pretrained(str(reader_path(spec)), dtype=torch.float32).eval()
    out = [np.zeros(0, np.float32)] * len(entries)
    with torch.inference_mode(), autocast(resolve_precision(precision)):
        for batch, ids, mask in padded_batches(entries, pad):
            h = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
            for row, j in enumerate(batch):
                start, target = len(entries[j][1]), entries[j][2]
                if target:
                    logp = torch.log_softmax(model.lm_head(h[row, start - 1:start - 1 + len(target)]).float(), -1)
                    out[j] = -logp[torch.arange(len(target)), torch.tensor(target)].numpy()
    return out


def probe_result(args: argparse.Namespace, started: float, rows: dict, reader: str | None = None, **extra) -> dict:
    """What a probe on this protocol records: the machine, the reader, the pool cap, its own settings, its rows."""
    return {"machine": machine(int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count()),
            "reader": reader or args.reader, "per_source": args.per_source, **extra,
            "wall_time_s": round(time.monotonic() - started, 1), "rows": rows}


def read(spec: str, layers: list[int], name: str, records: list, cache: Path, precision: str) -> Path:
    """Mean state of every hooked layer over each answer's tokens, each answer read once after its question."""
    path = cache / spec / f"{name}.npz"
    if path.exists():
        return path
    entries, pad = answer_items(spec, records)
    means: dict[int, np.ndarray] = {}

    def keep(batch: list[int], states: dict) -> None:
        for layer, h in states.items():
            out = means.setdefault(layer, np.zeros((len(entries), h.shape[-1]), np.float32))
            for row, j in enumerate(batch):
                out[j] = h[row, len(entries[j][1]):len(entries[j][1]) + len(entries[j][2])].mean(0).numpy()

    start = time.monotonic()
    read_states(spec, layers, entries, pad, precision, keep)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, keys=np.array([e[0] for e in entries]), **{f"mean{layer}": v for layer, v in means.items()})
    print(f"[{spec}] {name}: {len(entries)} answers in {time.monotonic() - start:.0f} s", flush=True)
    return path


def reader_path(spec: str):
    from clfjudge.models.backbones import resolve_backbone

    return resolve_backbone(spec).path_or_id


class Pairs:
    """Non-tie pairs of one set as difference features."""

    def __init__(self, records: list, vectors: dict[str, np.ndarray] | None) -> None:
        from clfjudge.judges.features import information_lengths

        pairs = [r for r in records if r.verdict is not None and r.verdict.value in ("A", "B")]
        self.y = np.array([r.verdict.value == "A" for r in pairs], dtype=float)
        a, b = [r.answer_a for r in pairs], [r.answer_b for r in pairs]
        self.info = np.log1p(information_lengths(a)) - np.log1p(information_lengths(b))
        self.chars = np.log1p([len(t) for t in a]) - np.log1p([len(t) for t in b])
        self.longer = 100 * np.mean(np.where(self.chars == 0, 0.5, (self.chars > 0) == (self.y == 1)))
        if vectors is not None:
            self.emb = {layer: v[[vectors["index"][text_key(r.question, r.answer_a)] for r in pairs]]
                        - v[[vectors["index"][text_key(r.question, r.answer_b)] for r in pairs]]
                        for layer, v in vectors.items() if layer != "index"}


class ScalarPairs(Pairs):
    """A set's non-tie pairs with per-answer scalars read by a probe (``z``: an ``.npz`` of text ``keys`` and one
    array per field) as A - B differences: ``fields`` maps a feature name to (field, transform). ``first``: the
    cross probe's cached reading, where given, as the default judge's layer-8 difference."""

    def __init__(self, records: list, z, fields: dict, first=None) -> None:
        super().__init__(records, None)
        keep = [r.verdict is not None and r.verdict.value in ("A", "B") for r in records]
        pairs = [r for r, k in zip(records, keep) if k]
        index = dict(zip(z["keys"], range(len(z["keys"]))))
        for name, (field, transform) in fields.items():
            value = lambda r, a, field=field, f=transform: f(z[field][index[text_key(r.question, a)]])  # noqa: E731
            setattr(self, name, np.array([value(r, r.answer_a) - value(r, r.answer_b) for r in pairs]))
        if first is not None:
            self.first = (first["first_ab"] - first["first_ba"])[np.array(keep)]


def design(p: Pairs, layer: str | None, length: str, scale: dict) -> np.ndarray:
    cols = [] if layer is None else [p.emb[layer] / scale["emb"] / np.sqrt(p.emb[layer].shape[1])]
    cols += [getattr(p, length)[:, None] / scale[length]] if length != "none" else []
    return np.hstack(cols)


def fit(train: list[Pairs], layer: str | None, length: str, c: float, balanced: bool = False):
    """The judge fitted on ``train``, as its score on a set: accuracy minus longer-answer-wins (points)."""
    margin = head(train, layer, length, c, balanced)
    return lambda p: 100 * np.mean((margin(p) > 0) == (p.y == 1)) - p.longer


def head(train: list[Pairs], layer: str | None, length: str, c: float, balanced: bool = False):
    """The judge fitted on ``train``, as its margins on a set's pairs (> 0: the first answer wins)."""
    from sklearn.linear_model import LogisticRegression

    scale = {length: np.concatenate([getattr(p, length) for p in train]).std() for length in ("info", "chars")}
    if layer is not None:
        scale["emb"] = np.vstack([p.emb[layer] for p in train]).std(0) + 1e-6
    x = np.vstack([design(p, layer, length, scale) for p in train])
    y = np.concatenate([p.y for p in train])
    w = np.concatenate([pair_weights(p, balanced) for p in train])
    w *= len(w) / w.sum()
    model = LogisticRegression(C=c, fit_intercept=False, max_iter=5000)
    model.fit(np.vstack([x, -x]), np.concatenate([y, 1 - y]), sample_weight=np.concatenate([w, w]))
    return lambda p: design(p, layer, length, scale) @ model.coef_[0]


def pair_weights(p: Pairs, balanced: bool) -> np.ndarray:
    """Every source the same total weight; ``balanced``: within it, the pairs the longer answer wins weigh as much
    as those the shorter one wins (``EmbeddingModel``'s ``weighting: [length, source]``)."""
    if not balanced:
        return np.full(len(p.y), 1.0 / len(p.y))
    longer_right = (p.chars > 0) == (p.y == 1)
    return np.where(longer_right, 0.5 / max(longer_right.sum(), 1), 0.5 / max((~longer_right).sum(), 1))


def probe(data: dict[str, Pairs], layer: str | None, length: str, c: float, balanced: bool = False) -> dict:
    pool = [n for n in data if n.startswith("pool:")]
    loso = {n: fit([data[m] for m in pool if m != n], layer, length, c, balanced)(data[n]) for n in pool}
    judge = fit([data[n] for n in pool], layer, length, c, balanced)
    dev = [judge(data[n]) for n in DEV]
    return {"loso": loso, "loso_mean": float(np.mean(list(loso.values()))),
            "selection_mean": float(np.mean([*loso.values(), *dev])),
            "dev": {n: judge(data[n]) for n in DEV}, "dev_mean": float(np.mean([judge(data[n]) for n in DEV])),
            "test": {n: judge(data[n]) for n in TEST}}


def probe_parser(doc: str) -> argparse.ArgumentParser:
    """The options every probe on this protocol takes (a reader, the pool cap, the evaluation sets, the cache)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--reader", default="smollm2")
    p.add_argument("--per-source", type=int, default=500)
    p.add_argument("--test", action="store_true", help="read and score the evaluation sets too (for the record)")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "clfjudge" / "probe")
    p.add_argument("--precision", default="auto")
    return p


def probe_sets(per_source: int, test: bool) -> dict[str, list]:
    """``load_sets`` with the pool samples cut to their first ``per_source`` pairs and the evaluation sets only
    when asked (``test``: for the record)."""
    return {n: recs[:per_source] if n.startswith("pool:") else recs for n, recs in load_sets().items()
            if n.startswith("pool:") or n in DEV or (test and n in TEST)}


# -- heads over named feature groups of a Pairs (the cross-reading, backward and prompted probes) ---------
def _group(p: Pairs, g: str) -> np.ndarray:
    return getattr(p, g).reshape(len(p.y), -1)


def group_design(p: Pairs, groups: tuple[str, ...], scale: dict) -> np.ndarray:
    """Each group standardised and weighted by 1/sqrt(its width), as ``EmbeddingModel``'s linear heads."""
    return np.hstack([_group(p, g) / scale[g] / np.sqrt(_group(p, g).shape[1]) for g in groups])


def group_right(train: list[Pairs], groups: tuple[str, ...], balanced: bool, c: float = 0.03):
    """The head fitted on ``train`` as a function: a set's Pairs -> which of its pairs it decides right."""
    from sklearn.linear_model import LogisticRegression

    scale = {g: np.vstack([_group(p, g) for p in train]).std(0) + 1e-6 for g in groups}
    x = np.vstack([group_design(p, groups, scale) for p in train])
    y = np.concatenate([p.y for p in train])
    w = np.concatenate([pair_weights(p, balanced) for p in train])
    w *= len(w) / w.sum()
    model = LogisticRegression(C=c, fit_intercept=False, max_iter=5000)
    model.fit(np.vstack([x, -x]), np.concatenate([y, 1 - y]), sample_weight=np.concatenate([w, w]))
    return lambda p: (group_design(p, groups, scale) @ model.coef_[0] > 0) == (p.y == 1)


def group_fit(train: list[Pairs], groups: tuple[str, ...], balanced: bool, c: float = 0.03):
    """Points above longer-answer-wins of the head fitted on ``train``, as a function of a set."""
    right = group_right(train, groups, balanced, c)
    return lambda p: 100 * np.mean(right(p)) - p.longer


def group_probe(data: dict[str, Pairs], groups: tuple[str, ...] | None, balanced: bool, rule=None,
                fit=None) -> dict:
    """LOSO over the pool, dev and (where read) test scores of ``group_fit``, of an untrained ``rule`` (a set ->
    points above longer-answer-wins) when ``groups`` is None, or of ``fit`` (training sets -> such a function)."""
    pool = [n for n in data if n.startswith("pool:")]
    if fit is None:
        fit = (lambda train: rule) if groups is None else (lambda train: group_fit(train, groups, balanced))
    loso = {n: fit([data[m] for m in pool if m != n])(data[n]) for n in pool}
    judge = fit([data[n] for n in pool])
    dev = {n: judge(data[n]) for n in DEV}
    return {"loso": loso, "loso_mean": float(np.mean(list(loso.values()))), "dev": dev,
            "dev_mean": float(np.mean(list(dev.values()))),
            "selection_mean": float(np.mean([*loso.values(), *dev.values()])),
            "test": {n: judge(data[n]) for n in TEST if n in data}}


def group_markdown(result: dict, title: str, note: str) -> str:
    """A probe's rows as a table: LOSO per pool source, dev and selection means, test columns where read."""
    m = result["machine"]
    first = next(iter(result["rows"].values()))
    pool, test = list(first["loso"]), list(first["test"])
    lines = [f"# {title} ({m['date'][:10]})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores; commit {m['commit']}; {result['wall_time_s']} s; reader "
             f"{result['reader']}, {result['per_source']} pairs per pool source. Accuracy on non-tie pairs minus "
             "longer-answer-wins on the same pairs (points). LOSO: trained on the other five pool sources; dev: "
             f"LLMBar case studies; selection mean over the eleven. {note}",
             "", "| variant | LOSO mean | " + " | ".join(n.removeprefix("pool:") for n in pool)
             + " | dev mean | selection mean |" + "".join(f" {n.removeprefix('llmbar-')} |" for n in test),
             "|---" * (4 + len(pool) + len(test)) + "|"]
    for name, r in result["rows"].items():
        lines.append(f"| {name} | {r['loso_mean']:+.1f} | " + " | ".join(f"{r['loso'][n]:+.1f}" for n in pool)
                     + f" | {r['dev_mean']:+.1f} | {r['selection_mean']:+.1f} |"
                     + "".join(f" {r['test'][n]:+.1f} |" for n in test))
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--readers", nargs="+", default=["smollm2:8,15,20,30", "gemma3:6,9"],
                   help="SPEC:LAYER,LAYER,... (one pass per reader hooks every listed layer)")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "clfjudge" / "probe")
    p.add_argument("--precision", default="auto")
    p.add_argument("--c", nargs="+", type=float, default=[0.01, 0.03, 0.1])
    args = p.parse_args()
    started = time.monotonic()
    named = load_sets()
    rows = {}
    base = {n: Pairs(recs, None) for n, recs in named.items()}
    for length in ("chars", "info"):
        rows[f"learned length rule ({length})"] = probe(base, None, length, 1.0)
    for reader in args.readers:
        spec, layers = reader.split(":")
        layers = [int(x) for x in layers.split(",")]
        data = {}
        for name, recs in named.items():
            z = np.load(read(spec, layers, name, recs, args.cache, args.precision))
            vectors = {f"mean{layer}": z[f"mean{layer}"] for layer in layers}
            vectors["index"] = dict(zip(z["keys"], range(len(z["keys"]))))
            data[name] = Pairs(recs, vectors)
        for layer in layers:
            for c in args.c:
                for length in ("info", "chars"):
                    if length == "chars" and c != 0.03:
                        continue
                    rows[f"{spec} layer {layer} + {length}, C={c}"] = probe(data, f"mean{layer}", length, c)
            rows[f"{spec} layer {layer} + info, C=0.03, length-balanced"] = probe(data, f"mean{layer}", "info", 0.03,
                                                                                   balanced=True)
    result = {"machine": machine(int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count()),
              "pool": POOL, "wall_time_s": round(time.monotonic() - started, 1), "rows": rows}
    print(f"wrote {write('reader_probe', result, markdown(result))}")
    return 0


def markdown(result: dict) -> str:
    m = result["machine"]
    pool = list(next(iter(result["rows"].values()))["loso"])
    lines = [f"# Reader probe ({m['date'][:10]})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores; commit {m['commit']}; {result['wall_time_s']} s. "
             "Accuracy on non-tie pairs minus longer-answer-wins on the same pairs (points). LOSO: trained on the "
             "other five pool sources, scored on this one; dev: LLMBar case-study sets (the knobs were read off "
             "LOSO + dev); test: scored for the record, never used for a choice.", "",
             "Selection mean: over the eleven selection sets (six LOSO + five dev), each counted once.", "",
             "| variant | LOSO mean | " + " | ".join(n.removeprefix("pool:") for n in pool)
             + " | dev mean | selection mean | " + " | ".join(n.removeprefix("llmbar-") for n in TEST) + " |",
             "|---" * (4 + len(pool) + len(TEST)) + "|"]
    for name, r in result["rows"].items():
        lines.append(f"| {name} | {r['loso_mean']:+.1f} | " + " | ".join(f"{r['loso'][n]:+.1f}" for n in pool)
                     + f" | {r['dev_mean']:+.1f} | {r['selection_mean']:+.1f} | "
                     + " | ".join(f"{r['test'][n]:+.1f}" for n in TEST) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
