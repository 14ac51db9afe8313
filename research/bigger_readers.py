"""Do 0.5–1.5B readers (Qwen2.5-Coder instruct, EmbeddingGemma) make the judge judge where SmolLM2 did not?

The reader probe's protocol (``reader_probe.py``: leave one pool source out + the LLMBar case studies as dev,
accuracy minus longer-answer-wins, the evaluation sets never read) with bigger readers beside the default's
SmolLM2 on the same pairs. Three steps, each cached under ``--cache`` so a stopped run loses nothing:

``read``: one decoder reader's mean answer states at several layers (one pass, cut at the deepest), in the
library's precision for this machine, on the first ``--per-source`` pool pairs of each source and the dev sets;
``EmbeddingGemma`` (``--reader embeddinggemma``) reads each answer as a document and each question as a query
(its retrieval prompts): the answer's vector and the question–answer cosine (relevance) are its features.

``generative``: the 1.5B instruct model as a zero-shot generative judge, the study's generative baseline with a real
instruct model: a verdict prompt, log-probability of "A" against "B" for the next token, both orders averaged,
on ``--pairs`` non-tie pairs drawn (seeded) from each named set (the evaluation sets included: nothing is fitted).

``fit``: the table. Heads as the reader probe's (logistic regression over the standardized difference of two
answers' features, both orders, sources weighted equally, C = 0.03, and 0.3 / 3 beside it), each reader at ~1/4,
1/2 and 3/4 depth, with and without information length, length-balanced and not; a paired bootstrap over the
selection pairs (each set resampled within itself, the selection mean recomputed) of each row against the SmolLM2
layer-8 row.

    OMP_NUM_THREADS=2 .venv/bin/python research/bigger_readers.py read --reader smollm2:8,15,22 --per-source 500
    OMP_NUM_THREADS=2 .venv/bin/python research/bigger_readers.py read --reader qwen-coder-1.5b:7,14,21 \
        --per-source 150
    OMP_NUM_THREADS=2 .venv/bin/python research/bigger_readers.py read --reader embeddinggemma --per-source 500
    OMP_NUM_THREADS=2 .venv/bin/python research/bigger_readers.py generative --sets pandalm-test autoj-test ...
    .venv/bin/python research/bigger_readers.py fit --per-source 150 --readers smollm2:8,15,22 qwen-coder-1.5b:7,14,21
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write  # noqa: E402
from reader_probe import DEV, Pairs, group_right, probe_sets, read, text_key  # noqa: E402

CACHE = Path.home() / ".cache" / "clfjudge" / "probe"
GEMMA = "embeddinggemma"
C = 0.03
BASELINE = "smollm2 L8 + info"


OBVIOUS = "obvious-pairs"  # the floor: read and scored by the all-pool head, never a selection set
HALVES = {"worse longer": True, "worse shorter": False}


def obvious() -> list:
    from obvious_pairs import load_pairs

    return load_pairs()


def records_of(name: str) -> list:
    """A named set's non-tie pairs (the obvious pairs by their name)."""
    from clfjudge.data.sources import load

    records = obvious() if name == OBVIOUS else load(name).records
    return [r for r in records if getattr(r, "verdict", None) is not None and r.verdict.value in ("A", "B")]


def with_floor(named: dict) -> dict:
    return named | {OBVIOUS: obvious()}


def cache_name(name: str, per_source: int) -> str:
    """Pool samples are cached per cap (a bigger cap's file covers a smaller one's pairs); dev sets whole."""
    return f"{name}@{per_source}" if name.startswith("pool:") else name


def covering(spec: str, name: str, records: list, cache: Path) -> Path | None:
    """A cached reading of ``name`` (any cap) that has every answer of ``records``."""
    need = {text_key(r.question, a) for r in records for a in (r.answer_a, r.answer_b)}
    for path in sorted((cache / spec).glob(f"{name}*.npz")):
        stem = path.stem
        if stem != name and not stem.startswith(f"{name}@"):
            continue
        if need <= set(np.load(path)["keys"]):
            return path
    return None


# -- reading ---------------------------------------------------------------------------------------------

def read_gemma(name: str, records: list, cache: Path, max_tokens: int = 512) -> Path:
    """EmbeddingGemma's document vector of each answer and its cosine with the question's query vector."""
    path = cache / GEMMA / f"{name}.npz"
    if path.exists():
        return path
    from sentence_transformers import SentenceTransformer

    from clfjudge.models.backbones import resolve_backbone

    model = SentenceTransformer(str(resolve_backbone(GEMMA).path_or_id), device="cpu")
    model.max_seq_length = max_tokens
    items = {}
    for r in records:
        for a in (r.answer_a, r.answer_b):
            items.setdefault(text_key(r.question, a), (r.question, a))
    keys = list(items)
    questions = sorted({q for q, _ in items.values()})
    answers = sorted({a for _, a in items.values()})
    start = time.monotonic()
    # batch_size 16 sorted by length inside encode(); prompts as the model card's retrieval task
    q = dict(zip(questions, model.encode_query(questions, batch_size=16, normalize_embeddings=True)))
    d = dict(zip(answers, model.encode_document(answers, batch_size=16, normalize_embeddings=True)))
    emb = np.stack([d[items[k][1]] for k in keys]).astype(np.float32)
    rel = np.array([float(q[items[k][0]] @ d[items[k][1]]) for k in keys], np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, keys=np.array(keys), emb=emb, rel=rel)
    print(f"[{GEMMA}] {name}: {len(answers)} answers, {len(questions)} questions in "
          f"{time.monotonic() - start:.0f} s", flush=True)
    return path


def cmd_read(args: argparse.Namespace) -> int:
    named = with_floor(probe_sets(args.per_source, test=False))
    for name, records in named.items():
        if args.reader == GEMMA:
            if covering(GEMMA, name, records, args.cache) is None:
                read_gemma(cache_name(name, args.per_source), records, args.cache)
            continue
        spec, layers = args.reader.split(":")
        if covering(spec, name, records, args.cache) is None:
            read(spec, [int(x) for x in layers.split(",")], cache_name(name, args.per_source), records, args.cache,
                 args.precision)
    return 0


# -- the generative judge ---------------------------------------------------------------------------------

VERDICT_PROMPT = (
    "You are a fair judge of answers to a user's question. Read the question and the two answers, then say which "
    "answer is better: more helpful, correct, and faithful to what the question asks. Length is not quality.\n\n"
    "[Question]\n{question}\n\n[Answer A]\n{a}\n\n[Answer B]\n{b}\n\n"
    "Which answer is better? Reply with one letter, A or B.")


def cmd_generative(args: argparse.Namespace) -> int:
    """P("A") - P("B") of the next token after the verdict prompt, both orders; appended per pair to a JSONL."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clfjudge.embedders.decoder import autocast, resolve_precision, truncate_middle
    from clfjudge.models.backbones import resolve_backbone

    path = resolve_backbone(args.model).path_or_id
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    letters = [tok.encode(x, add_special_tokens=False)[0] for x in ("A", "B")]
    out = args.cache / "generative" / f"{Path(str(path)).name}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["set"], r["key"]) for r in map(json.loads, out.open())} if out.exists() else set()

    def clip(text: str) -> str:
        return tok.decode(truncate_middle(tok.encode(text, add_special_tokens=False), args.max_answer_tokens))

    def margin(question: str, a: str, b: str) -> float:
        content = VERDICT_PROMPT.format(question=clip(question), a=clip(a), b=clip(b))
        if tok.chat_template:
            text = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                           tokenize=False)
        else:  # a base model: the reader's plain frame
            text = f"{tok.bos_token or ''}Question: {content}\n\nAnswer: "
        ids = tok.encode(text, add_special_tokens=False)
        with torch.inference_mode():
            with autocast(resolve_precision(args.precision)):
                last = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
            logp = torch.log_softmax(model.lm_head(last.float()), -1)  # fp32: bf16 logits round the margin
        return float(logp[letters[0]] - logp[letters[1]])

    with out.open("a") as sink:
        for name in args.sets:
            pairs = records_of(name)
            pairs = random.Random(0).sample(pairs, min(args.pairs, len(pairs)))  # seeded: sets are ordered
            start, n = time.monotonic(), 0
            for r in pairs:
                key = text_key(r.question, r.answer_a + "\0" + r.answer_b)
                if (name, key) in done:
                    continue
                ab, ba = margin(r.question, r.answer_a, r.answer_b), margin(r.question, r.answer_b, r.answer_a)
                sink.write(json.dumps({"set": name, "key": key, "gold": r.verdict.value, "ab": ab, "ba": ba,
                                       "len_a": len(r.answer_a), "len_b": len(r.answer_b)}) + "\n")
                sink.flush()
                n += 1
            print(f"[generative] {name}: {n} pairs in {time.monotonic() - start:.0f} s", flush=True)
    return 0


# -- the table -------------------------------------------------------------------------------------------

def features(named: dict, readers: list[str], cache: Path) -> tuple[dict[str, Pairs], list[str]]:
    """Every set's Pairs with one attribute per (reader, layer) difference: ``<spec>_L<layer>``, and for
    EmbeddingGemma ``gemma_emb`` / ``gemma_rel``. Returns the data and the feature names."""
    data = {name: Pairs(recs, None) for name, recs in named.items()}
    names: list[str] = []
    for reader in readers:
        spec, _, layers = reader.partition(":")
        for name, recs in named.items():
            path = covering(spec, name, recs, cache)
            if path is None:
                raise SystemExit(f"no reading of {name} by {spec} in {cache}: run `read --reader {reader}` first")
            z = np.load(path)
            index = dict(zip(z["keys"], range(len(z["keys"]))))
            pairs = [r for r in recs if r.verdict is not None and r.verdict.value in ("A", "B")]
            ia = [index[text_key(r.question, r.answer_a)] for r in pairs]
            ib = [index[text_key(r.question, r.answer_b)] for r in pairs]
            fields = {"gemma_emb": "emb", "gemma_rel": "rel"} if spec == GEMMA else \
                {f"{spec}_L{x}": f"mean{x}" for x in layers.split(",")}
            for feature, field in fields.items():
                v = z[field]
                setattr(data[name], feature, (v[ia] - v[ib]).reshape(len(pairs), -1))
        names += ["gemma_emb", "gemma_rel"] if spec == GEMMA else [f"{spec}_L{x}" for x in layers.split(",")]
    return data, names


def row(data: dict[str, Pairs], groups: tuple[str, ...], balanced: bool, c: float = C) -> dict:
    """Per selection set (LOSO over the pool, dev with the all-pool head): which pairs the head decides right."""
    pool = [n for n in data if n.startswith("pool:")]
    right = {n: group_right([data[m] for m in pool if m != n], groups, balanced, c)(data[n]) for n in pool}
    judge = group_right([data[n] for n in pool], groups, balanced, c)
    right |= {n: judge(data[n]) for n in DEV}
    if OBVIOUS in data:
        right[OBVIOUS] = judge(data[OBVIOUS])
    return right


def longer_right(p: Pairs) -> np.ndarray:
    return np.where(p.chars == 0, 0.5, (p.chars > 0) == (p.y == 1))


def selection_mean(data: dict[str, Pairs], right: dict, idx: dict | None = None) -> float:
    """Mean over the selection sets of accuracy minus longer-answer-wins (points), on resampled pairs ``idx``."""
    out = []
    for n, r in right.items():
        i = slice(None) if idx is None else idx[n]
        out.append(100 * (np.mean(r[i]) - np.mean(longer_right(data[n])[i])))
    return float(np.mean(out))


def bootstrap(data: dict[str, Pairs], a: dict, b: dict, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% paired bootstrap interval of selection_mean(a) - selection_mean(b), pairs resampled within each set."""
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(n):
        idx = {s: rng.integers(0, len(a[s]), len(a[s])) for s in a}
        diffs.append(selection_mean(data, a, idx) - selection_mean(data, b, idx))
    return float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))


def variants(names: list[str]) -> dict[str, tuple[tuple[str, ...], bool, float]]:
    """Rows: (feature groups, length-balanced, C)."""
    rows = {"information length only": (("info",), False, C)}
    for f in names:
        label = f.replace("_L", " L").replace("gemma_emb", "embeddinggemma answer").replace(
            "gemma_rel", "embeddinggemma relevance")
        rows[f"{label} + info"] = ((f, "info"), False, C)
        rows[f"{label} alone"] = ((f,), False, C)
        rows[f"{label} + info, length-balanced"] = ((f, "info"), True, C)
        if f != "gemma_rel":  # a scalar needs no regularisation sweep
            for c in (0.3, 3.0):  # weaker regularisation: a bigger reader's features may need more weight
                rows[f"{label} + info, C={c:g}"] = ((f, "info"), False, c)
    if "gemma_rel" in names and "smollm2_L8" in names:
        rows["smollm2 L8 + embeddinggemma relevance + info"] = (("smollm2_L8", "gemma_rel", "info"), False, C)
    return rows


def cmd_fit(args: argparse.Namespace) -> int:
    started = time.monotonic()
    named = with_floor(probe_sets(args.per_source, test=False))
    data, names = features(named, args.readers, args.cache)
    worse_longer = np.array([r.meta["worse_is_longer"] for r in records_of(OBVIOUS)])
    rights = {label: row(data, groups, balanced, c) for label, (groups, balanced, c) in variants(names).items()}
    floors = {label: right.pop(OBVIOUS) for label, right in rights.items()}
    base = rights.get(BASELINE)
    rows = {}
    for label, right in rights.items():
        floor = floors[label]
        scores = {n: 100 * (np.mean(r) - np.mean(longer_right(data[n]))) for n, r in right.items()}
        loso = [v for n, v in scores.items() if n.startswith("pool:")]
        rows[label] = {"sets": scores, "loso_mean": float(np.mean(loso)),
                       "dev_mean": float(np.mean([scores[n] for n in DEV])),
                       "selection_mean": selection_mean(data, right)}
        rows[label]["obvious"] = {"all": 100 * floor.mean(), **{h: 100 * floor[worse_longer == flag].mean()
                                                                 for h, flag in HALVES.items()}}
        if base is not None and label != BASELINE:
            low, high = bootstrap(data, right, base)
            rows[label]["vs_baseline"] = {"estimate": rows[label]["selection_mean"] - selection_mean(data, base),
                                          "low": low, "high": high}
    gen = generative_rows(args.cache) if args.generative else {}
    result = {"machine": machine(int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count()),
              "per_source": args.per_source, "readers": args.readers, "c": C,
              "pairs": {n: len(p.y) for n, p in data.items()}, "rows": rows, "generative": gen,
              "wall_time_s": round(time.monotonic() - started, 1)}
    path = write(f"bigger_readers{args.suffix}", result, markdown(result))
    print(f"wrote {path}")
    return 0


def generative_rows(cache: Path) -> dict:
    """Per generative model and set: accuracy of sign(ab - ba) (both orders averaged) beside longer-/shorter-wins,
    with the paired bootstrap CI of the difference to longer-answer-wins; and how often each order says A."""
    from clfjudge.metrics import paired_difference

    out = {}
    for path in sorted((cache / "generative").glob("*.jsonl")):
        rows = [json.loads(line) for line in path.open()]
        by_set: dict[str, list] = {}
        for r in rows:
            by_set.setdefault(r["set"], []).append(r)
        model = {}
        for name, rs in by_set.items():
            gold_a = np.array([r["gold"] == "A" for r in rs])
            judge = np.array([(r["ab"] - r["ba"] > 0) == g for r, g in zip(rs, gold_a)], float)
            longer = np.array([0.5 if r["len_a"] == r["len_b"] else float((r["len_a"] > r["len_b"]) == g)
                               for r, g in zip(rs, gold_a)])
            worse_longer = np.array([(r["len_b"] > r["len_a"]) == g for r, g in zip(rs, gold_a)])
            model[name] = {"pairs": len(rs), "accuracy": 100 * judge.mean(), "longer": 100 * longer.mean(),
                           "worse_longer": 100 * judge[worse_longer].mean() if worse_longer.any() else None,
                           "worse_shorter": 100 * judge[~worse_longer].mean() if (~worse_longer).any() else None,
                           "shorter": 100 * (1 - longer).mean(),
                           "vs_longer": paired_difference(judge, longer),
                           "says_a_first_order": 100 * np.mean([r["ab"] > 0 for r in rs]),
                           "says_a_swapped_order": 100 * np.mean([r["ba"] > 0 for r in rs])}
        out[path.stem] = model
    return out


def markdown(result: dict) -> str:
    m = result["machine"]
    first = next(iter(result["rows"].values()))
    sets = list(first["sets"])
    lines = [f"# Bigger readers on the selection protocol ({m['date'][:10]})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores; commit {m['commit']}; fit in {result['wall_time_s']} s. "
             f"Readers: {', '.join(result['readers'])}; the first {result['per_source']} pairs of each pool source "
             "(the reader probe's seeded, decontaminated sample) and the five LLMBar case-study sets, the same pairs "
             "for every reader. Accuracy on non-tie pairs minus longer-answer-wins (points). LOSO: trained on the "
             "other five pool sources; dev: trained on all six; selection mean over the eleven. "
             f"C = 0.03 unless a row says. vs {BASELINE}: the selection-mean difference with its 95% paired "
             "bootstrap interval (pairs resampled within each set). The evaluation sets were not read.", "",
             "Pairs: " + ", ".join(f"{n.removeprefix('pool:')} {k}" for n, k in result["pairs"].items()), "",
             "Obvious pairs (the floor, 60 hand-written pairs, `obvious_pairs.py`): the all-pool head's accuracy "
             "overall / where the worse answer is longer / where it is shorter (longer-answer-wins: 50 / 0 / 100).",
             "", "| variant | selection mean | vs " + BASELINE + " | LOSO mean | dev mean | "
             + " | ".join(n.removeprefix("pool:").removeprefix("llmbar-case-") for n in sets) + " | obvious pairs |",
             "|---" * (6 + len(sets)) + "|"]
    for name, r in result["rows"].items():
        vs = r.get("vs_baseline")
        cell = f"{vs['estimate']:+.1f} [{vs['low']:+.1f}, {vs['high']:+.1f}]" if vs else "-"
        o = r["obvious"]
        lines.append(f"| {name} | {r['selection_mean']:+.1f} | {cell} | {r['loso_mean']:+.1f} | "
                     f"{r['dev_mean']:+.1f} | " + " | ".join(f"{r['sets'][n]:+.1f}" for n in sets)
                     + f" | {o['all']:.0f} / {o['worse longer']:.0f} / {o['worse shorter']:.0f} |")
    for model, per_set in result["generative"].items():
        lines += ["", f"## {model} as a zero-shot generative judge", "",
                  "Verdict prompt, log P(\"A\") - log P(\"B\") of the next token, both orders averaged; a seeded "
                  "sample of each set's non-tie pairs (nothing is fitted, so the evaluation sets are fair here).", "",
                  "| set | pairs | accuracy | where the worse answer is longer / shorter | longer wins | shorter wins "
                  "| vs longer [95% CI] | says A (A first / swapped) |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, r in per_set.items():
            d = r["vs_longer"]
            halves = " / ".join("-" if r[h] is None else f"{r[h]:.1f}" for h in ("worse_longer", "worse_shorter"))
            lines.append(f"| {name} | {r['pairs']} | {r['accuracy']:.1f} | {halves} | {r['longer']:.1f} | "
                         f"{r['shorter']:.1f} | "
                         f"{100 * d['estimate']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] | "
                         f"{r['says_a_first_order']:.0f}% / {r['says_a_swapped_order']:.0f}% |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("read")
    r.add_argument("--reader", required=True, help="SPEC:LAYER,LAYER,... or embeddinggemma")
    r.add_argument("--per-source", type=int, default=500)
    r.add_argument("--precision", default="auto")
    g = sub.add_parser("generative")
    g.add_argument("--model", default="qwen-coder-1.5b")
    g.add_argument("--sets", nargs="+", required=True)
    g.add_argument("--pairs", type=int, default=40)
    g.add_argument("--max-answer-tokens", type=int, default=256)
    g.add_argument("--precision", default="auto")
    f = sub.add_parser("fit")
    f.add_argument("--readers", nargs="+", required=True)
    f.add_argument("--per-source", type=int, default=150)
    f.add_argument("--generative", action="store_true")
    f.add_argument("--suffix", default="")
    for s in (r, g, f):
        s.add_argument("--cache", type=Path, default=CACHE)
    args = p.parse_args()
    return {"read": cmd_read, "generative": cmd_generative, "fit": cmd_fit}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
