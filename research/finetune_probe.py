"""Does a reader that learns generalize better than the frozen one? Fine-tune SmolLM2's blocks above layer 7.

The default judge reads each answer with a frozen SmolLM2 up to layer 8 and fits a logistic regression on the
difference of the two answers' mean states plus information length. Here the blocks from layer 8 up (``--runs``
BLOCKS:LR:EPOCHS) are trained too, end to end with the head, on the same pairwise (Bradley-Terry) loss and the same
weights as the default (every source the same total weight; within it, the pairs the longer answer wins weighing
as much as those the shorter one wins). It is cheap on a CPU because the first seven blocks stay frozen: their
output for every token of every (question, answer) is read once (bf16 autocast) and cached as fp16 on disk, and
training runs only the tuned blocks over it (about 0.6 s per step of 8 pairs on 2 cores for one block).
``--pool-runs`` QUERIES:LR:EPOCHS keeps layer 8 frozen and learns how to pool it instead of the mean: softmax
attention over the answer's tokens with QUERIES learned queries (``AttentionPool``; 0.01 s per step).

Protocol (the one ``reader_probe.py`` uses, with a held-out slice instead of leave-one-source-out, because each fit
costs minutes): every pool source (``--cap`` pairs each, decontaminated against every dev and test set) is split by
question 85/15; judges train on the 85% and are selected on the 15% slices plus LLMBar's case-study dev sets. The
head starts from the frozen judge's regression, so step 0 *is* the frozen judge. After training, the head is read
as trained and also refitted by the same regression on the tuned features. The evaluation sets are scored for the
record; no choice reads them. Every number is accuracy on non-tie pairs minus "longer answer wins" on the same pairs.

    OMP_NUM_THREADS=2 .venv/bin/python research/finetune_probe.py [--runs 1:2e-5:1 1:1e-4:2 3:5e-5:1]
    OMP_NUM_THREADS=2 .venv/bin/python research/finetune_probe.py --runs --pool-runs 1:1e-2:3 4:1e-2:3 16:1e-2:3

Writes research/results/finetune_probe_<date>.{md,json}; the token states (about 3.4 GB for the default sets) stay
under ``--cache``.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reader_probe as rp  # noqa: E402
from common import machine, write  # noqa: E402

LAYER, HIDDEN, C, BATCH_PAIRS, HELD_PERCENT = 7, 576, 0.03, 8, 15


def cache_states(name: str, records: list, cache: Path) -> Path:
    """Every token's state after block ``LAYER`` for each (question, answer) of a set, fp16, one flat array."""
    path = cache / f"{name}.npz"
    if path.exists():
        return path
    entries, pad = rp.answer_items("smollm2", records)
    lengths = [len(prompt) + len(body) for _, prompt, body in entries]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    states = np.lib.format.open_memmap(path.with_suffix(".states.npy"), "w+", np.float16, (int(offsets[-1]), HIDDEN))

    def keep(batch: list[int], hooked: dict) -> None:
        for row, j in enumerate(batch):
            states[offsets[j]:offsets[j + 1]] = hooked[LAYER][row, :lengths[j]].numpy()

    start = time.monotonic()
    rp.read_states("smollm2", [LAYER], entries, pad, "bf16", keep)
    states.flush()
    np.savez(path, keys=np.array([e[0] for e in entries]), offsets=offsets,
             prompt_lengths=np.array([len(e[1]) for e in entries]))
    print(f"{name}: {len(entries)} answers, {offsets[-1]} tokens in {time.monotonic() - start:.0f} s", flush=True)
    return path


class Pairs:
    """Non-tie pairs of one set, pointing into its cached token states."""

    def __init__(self, records: list, path: Path) -> None:
        from clfjudge.judges.features import information_lengths

        z = np.load(path)
        self.offsets, self.prompt_lengths = z["offsets"], z["prompt_lengths"]
        self.states = np.load(path.with_suffix(".states.npy"), mmap_mode="r")
        index = dict(zip(z["keys"], range(len(z["keys"]))))
        pairs = [r for r in records if r.verdict is not None and r.verdict.value in ("A", "B")]
        self.questions = [r.question for r in pairs]
        self.a = np.array([index[rp.text_key(r.question, r.answer_a)] for r in pairs])
        self.b = np.array([index[rp.text_key(r.question, r.answer_b)] for r in pairs])
        self.y = np.array([r.verdict.value == "A" for r in pairs], float)
        self.info = (np.log1p(information_lengths([r.answer_a for r in pairs]))
                     - np.log1p(information_lengths([r.answer_b for r in pairs])))
        self.chars = np.log1p([len(r.answer_a) for r in pairs]) - np.log1p([len(r.answer_b) for r in pairs])

    def subset(self, keep: np.ndarray) -> Pairs:
        part = copy.copy(self)
        for name in ("a", "b", "y", "info", "chars"):
            setattr(part, name, getattr(self, name)[keep])
        part.questions = [q for q, k in zip(self.questions, keep) if k]
        return part

    @property
    def longer(self) -> float:
        return 100 * np.mean(np.where(self.chars == 0, 0.5, (self.chars > 0) == (self.y == 1)))

    def weights(self) -> np.ndarray:
        """Summing to one; the pairs the longer answer wins weigh as much as those the shorter one wins."""
        longer_right = (self.chars > 0) == (self.y == 1)
        return np.where(longer_right, 0.5 / max(longer_right.sum(), 1), 0.5 / max((~longer_right).sum(), 1))


class Reader:
    """The tuned blocks (from the pretrained ones) over cached states, mean-pooled over the answer's tokens."""

    def __init__(self, n_blocks: int) -> None:
        import torch
        from transformers import AutoModel

        base = AutoModel.from_pretrained(str(rp.reader_path("smollm2")), dtype=torch.float32)
        self.blocks = torch.nn.ModuleList(copy.deepcopy(base.layers[LAYER + i]) for i in range(n_blocks))
        self.rotary = base.rotary_emb

    def __call__(self, pairs: Pairs, answers: list[int], grad: bool):
        import torch

        h, pool = self.states(pairs, answers, grad)
        return torch.einsum("bt,btd->bd", pool, h)

    def states(self, pairs: Pairs, answers: list[int], grad: bool):
        """The last tuned block's states of the given answers (rows x tokens x hidden, fp32) and the mean pool."""
        import torch

        lengths = [int(pairs.offsets[j + 1] - pairs.offsets[j]) for j in answers]
        rows, width = len(answers), max(lengths)
        x, pool = torch.zeros(rows, width, HIDDEN), torch.zeros(rows, width)
        valid = torch.zeros(rows, width, dtype=torch.bool)
        for row, j in enumerate(answers):
            span = pairs.states[pairs.offsets[j]:pairs.offsets[j + 1]]
            x[row, :lengths[row]] = torch.from_numpy(np.asarray(span, np.float32))
            valid[row, :lengths[row]] = True
            pool[row, pairs.prompt_lengths[j]:lengths[row]] = 1.0 / (lengths[row] - pairs.prompt_lengths[j])
        positions = torch.arange(width)[None].expand(rows, width)
        mask = torch.tril(torch.ones(width, width, dtype=torch.bool))[None, None] & valid[:, None, None, :]
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16):
            rotary, h = self.rotary(x, positions), x
            for block in self.blocks:
                out = block(h, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
                h = out[0] if isinstance(out, tuple) else out
        return h.float(), pool

    def embed(self, pairs: Pairs) -> np.ndarray:
        """The pooled vector of every answer of a set (no gradient), in length-sorted batches."""
        from clfjudge.batching import token_batches

        lengths = np.diff(pairs.offsets).tolist()
        out = np.zeros((len(lengths), HIDDEN), np.float32)
        for batch in token_batches(lengths, len(lengths), 2 * rp.BATCH_TOKENS):
            out[batch] = self(pairs, batch, False).numpy()
        return out


def regression(train: dict[str, Pairs], vectors: dict[str, np.ndarray]):
    """The default judge's head: logistic regression without intercept on both orders, features scaled."""
    from sklearn.linear_model import LogisticRegression

    diffs = np.vstack([vectors[n][p.a] - vectors[n][p.b] for n, p in train.items()])
    scale = diffs.std(0) * np.sqrt(diffs.shape[1]) + 1e-6
    info_scale = np.concatenate([p.info for p in train.values()]).std()
    x = np.hstack([diffs / scale, np.concatenate([p.info for p in train.values()])[:, None] / info_scale])
    y = np.concatenate([p.y for p in train.values()])
    w = np.concatenate([p.weights() for p in train.values()])
    w *= len(w) / w.sum()
    coef = LogisticRegression(C=C, fit_intercept=False, max_iter=5000).fit(
        np.vstack([x, -x]), np.concatenate([y, 1 - y]), sample_weight=np.concatenate([w, w])).coef_[0]
    return {"w": coef[:-1], "w_info": coef[-1], "scale": scale, "info_scale": info_scale}


def score(evals: dict[str, Pairs], vectors: dict[str, np.ndarray], head: dict) -> dict[str, float]:
    out = {}
    for name, p in evals.items():
        v = vectors[name.replace("held:", "pool:")]
        s = (v[p.a] - v[p.b]) / head["scale"] @ head["w"] + p.info / head["info_scale"] * head["w_info"]
        out[name] = float(100 * np.mean((s > 0) == (p.y == 1)) - p.longer)
    return out


def train_with_head(train: dict[str, Pairs], head: dict, pooled, params, lr: float, epochs: float,
                    queries: int = 1) -> tuple[dict, float]:
    """``params`` (the reader's) and the head trained together from the frozen judge on the default's pairwise loss
    and weights (head lr 1e-3, the regression's L2 kept). ``pooled(name, answers, grad)`` gives each answer's
    vector, ``queries`` vectors of HIDDEN side by side; the head's weights on all but the first start at zero."""
    import torch

    w = torch.tensor(np.concatenate([head["w"], np.zeros((queries - 1) * HIDDEN)]), dtype=torch.float32,
                     requires_grad=True)
    w_info = torch.tensor(float(head["w_info"]), requires_grad=True)
    scale = torch.tensor(np.tile(head["scale"], queries), dtype=torch.float32)
    optimizer = torch.optim.AdamW([{"params": params, "lr": lr, "weight_decay": 0.0},
                                   {"params": [w, w_info], "lr": 1e-3, "weight_decay": 0.0}])
    n_pairs = sum(len(p.y) for p in train.values())
    total_w = sum(p.weights().sum() for p in train.values())
    l2 = 1.0 / (C * 2 * n_pairs)  # the regression's penalty per (pair, order) sample
    items = [(n, k) for n, p in train.items() for k in range(len(p.y))]
    # length-bucketed batches in a seeded random order
    items.sort(key=lambda it: max(np.diff(train[it[0]].offsets)[[train[it[0]].a[it[1]], train[it[0]].b[it[1]]]]))
    batches = [items[i:i + BATCH_PAIRS] for i in range(0, len(items), BATCH_PAIRS)]
    rng = random.Random(0)
    steps = []
    for _ in range(int(np.ceil(epochs))):
        steps += rng.sample(batches, len(batches))
    steps = steps[:int(epochs * len(batches))]
    start = time.monotonic()
    for step, batch in enumerate(steps, 1):
        loss = l2 * (w.pow(2).sum() + w_info.pow(2))
        for name in dict.fromkeys(n for n, _ in batch):
            p, ks = train[name], [k for n, k in batch if n == name]
            v = pooled(name, [p.a[k] for k in ks] + [p.b[k] for k in ks], True)
            s = ((v[:len(ks)] - v[len(ks):]) / scale) @ w + torch.tensor(p.info[ks] / head["info_scale"],
                                                                         dtype=torch.float32) * w_info
            sign = torch.tensor(2 * p.y[ks] - 1, dtype=torch.float32)
            weight = torch.tensor(p.weights()[ks] * n_pairs / total_w, dtype=torch.float32)
            loss = loss + (weight * torch.nn.functional.softplus(-sign * s)).sum() / len(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == len(steps):
            print(f"  step {step}/{len(steps)}: loss {loss.item():.3f}, "
                  f"{(time.monotonic() - start) / step:.2f} s/step", flush=True)
    trained = {"w": w.detach().numpy(), "w_info": float(w_info.detach()), "scale": scale.numpy(),
               "info_scale": head["info_scale"]}
    return trained, (time.monotonic() - start) / max(len(steps), 1)


def finetune(train: dict[str, Pairs], head: dict, n_blocks: int, lr: float,
             epochs: float) -> tuple[Reader, dict, float]:
    """The blocks from layer 8 up trained with the head."""
    import torch

    torch.manual_seed(0)
    reader = Reader(n_blocks)
    trained, per_step = train_with_head(train, head, lambda n, answers, grad: reader(train[n], answers, grad),
                                        list(reader.blocks.parameters()), lr, epochs)
    return reader, trained, per_step


class AttentionPool:
    """Learned softmax attention over an answer's tokens of the frozen reader's states, instead of their mean.

    Query k pools sum_t softmax_t(z_t . q_k / sqrt(HIDDEN)) h_t, z the states standardised per dimension. Query 0
    starts at zero, which is the mean (the frozen judge); the others start small and random, their head weights
    at zero, so step 0 is the frozen judge. ``tokens[name][j]``: answer j's states over its answer tokens only.
    """

    def __init__(self, tokens: dict[str, list[np.ndarray]], queries: int) -> None:
        import torch

        sample = np.concatenate([t for ts in tokens.values() for t in ts[::50]]).astype(np.float32)
        self.mu, self.sd = torch.from_numpy(sample.mean(0)), torch.from_numpy(sample.std(0) + 1e-3)
        generator = torch.Generator().manual_seed(0)
        q = 0.5 * torch.randn(queries, HIDDEN, generator=generator)
        q[0] = 0.0
        self.q, self.tokens = q.requires_grad_(), tokens

    def __call__(self, name: str, answers: list[int], grad: bool):
        import torch

        spans = [self.tokens[name][j] for j in answers]
        x = torch.zeros(len(spans), max(len(t) for t in spans), HIDDEN)
        valid = torch.zeros(x.shape[:2], dtype=torch.bool)
        for row, t in enumerate(spans):
            x[row, :len(t)], valid[row, :len(t)] = torch.from_numpy(t.astype(np.float32)), True
        with torch.set_grad_enabled(grad):
            logits = ((x - self.mu) / self.sd) @ self.q.T / HIDDEN ** 0.5
            attention = torch.softmax(logits.masked_fill(~valid[..., None], float("-inf")), dim=1)
            return torch.einsum("btk,btd->bkd", attention, x).reshape(len(spans), -1)

    def embed(self, name: str) -> np.ndarray:
        n = len(self.tokens[name])
        return np.concatenate([self(name, list(range(i, min(i + 64, n))), False).numpy() for i in range(0, n, 64)])


def answer_tokens(reader: Reader, pairs: Pairs) -> list[np.ndarray]:
    """The frozen reader's states over each answer's own tokens (the question's left out), fp16."""
    from clfjudge.batching import token_batches

    lengths = np.diff(pairs.offsets).tolist()
    out: list[np.ndarray] = [np.empty(0)] * len(lengths)
    for batch in token_batches(lengths, len(lengths), 2 * rp.BATCH_TOKENS):
        h, _ = reader.states(pairs, batch, False)
        for row, j in enumerate(batch):
            out[j] = h[row, pairs.prompt_lengths[j]:lengths[j]].numpy().astype(np.float16)
    return out


def learn_pooling(train: dict[str, Pairs], sets: dict[str, Pairs], tokens: dict[str, list[np.ndarray]],
                  head: dict, queries: int, lr: float, epochs: float) -> tuple[dict, dict, float]:
    """Attention pooling over the frozen layer trained with the head; the pooled vectors of every set."""
    pool = AttentionPool(tokens, queries)
    trained, per_step = train_with_head(train, head, pool, [pool.q], lr, epochs, queries)
    return trained, {n: pool.embed(n) for n in sets}, per_step


def summary(scores: dict[str, float], selection: list[str]) -> dict:
    held = [n for n in selection if n.startswith("held:")]
    return {"scores": scores, "selection_mean": float(np.mean([scores[n] for n in selection])),
            "held_mean": float(np.mean([scores[n] for n in held])),
            "dev_mean": float(np.mean([scores[n] for n in rp.DEV]))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="*", default=["1:2e-5:1", "1:1e-4:2", "3:5e-5:1"], help="BLOCKS:LR:EPOCHS")
    p.add_argument("--pool-runs", nargs="*", default=[],
                   help="QUERIES:LR:EPOCHS: layer 8 frozen, attention pooling over its tokens learned with the head")
    p.add_argument("--cap", type=int, default=600, help="pairs per pool source")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "clfjudge" / "probe" / f"smollm2-h{LAYER}")
    args = p.parse_args()
    started = time.monotonic()
    named = rp.load_sets()
    named = {n: recs[:args.cap] if n.startswith("pool:") else recs for n, recs in named.items()}
    sets = {n: Pairs(recs, cache_states(n, recs, args.cache)) for n, recs in named.items()}
    train, evals = {}, {}
    for name in (n for n in sets if n.startswith("pool:")):
        held = np.array([int(hashlib.md5(q.encode("utf-8", "surrogatepass")).hexdigest(), 16) % 100 < HELD_PERCENT
                         for q in sets[name].questions])
        train[name], evals[f"held:{name[5:]}"] = sets[name].subset(~held), sets[name].subset(held)
    evals.update({n: sets[n] for n in (*rp.DEV, *rp.TEST)})
    selection = [n for n in evals if n.startswith("held:")] + list(rp.DEV)

    rows, start_heads = {}, {}

    def frozen_start(n_blocks: int, vectors: dict[str, np.ndarray] | None = None) -> dict:
        """The frozen judge at the same depth: every run's start and its baseline row."""
        if n_blocks not in start_heads:
            if vectors is None:
                frozen = Reader(n_blocks)
                vectors = {n: frozen.embed(s) for n, s in sets.items()}
            start_heads[n_blocks] = regression(train, vectors)
            rows[f"frozen, layer {LAYER + n_blocks} (the default judge's recipe)"] = summary(
                score(evals, vectors, start_heads[n_blocks]), selection)
        return start_heads[n_blocks]

    if args.pool_runs:
        frozen = Reader(1)
        tokens = {n: answer_tokens(frozen, s) for n, s in sets.items()}
        head = frozen_start(1, {n: np.stack([t.astype(np.float32).mean(0) for t in ts]) for n, ts in tokens.items()})
        for run in args.pool_runs:
            queries, lr, epochs = int(run.split(":")[0]), float(run.split(":")[1]), float(run.split(":")[2])
            print(f"attention pooling {run}", flush=True)
            trained, pooled, per_step = learn_pooling(train, sets, tokens, head, queries, lr, epochs)
            label = (f"layer {LAYER + 1} frozen, attention pooling ({queries} quer{'ies' if queries > 1 else 'y'}), "
                     f"lr {lr:g}, {epochs:g} epoch{'s' * (epochs != 1)}")
            rows[f"{label}: head as trained"] = {**summary(score(evals, pooled, trained), selection),
                                                 "s_per_step": per_step}
            rows[f"{label}: head refitted"] = summary(score(evals, pooled, regression(train, pooled)), selection)
        del tokens
    for run in args.runs:
        n_blocks, lr, epochs = int(run.split(":")[0]), float(run.split(":")[1]), float(run.split(":")[2])
        start_head = frozen_start(n_blocks)
        print(f"fine-tuning {run}", flush=True)
        reader, trained, per_step = finetune(train, start_head, n_blocks, lr, epochs)
        tuned = {n: reader.embed(s) for n, s in sets.items()}
        label = (f"layers {LAYER + 1}-{LAYER + n_blocks} tuned" if n_blocks > 1 else f"layer {LAYER + 1} tuned") + \
            f", lr {lr:g}, {epochs:g} epoch{'s' * (epochs != 1)}"
        rows[f"{label}: head as trained"] = {**summary(score(evals, tuned, trained), selection),
                                             "s_per_step": per_step}
        rows[f"{label}: head refitted"] = summary(score(evals, tuned, regression(train, tuned)), selection)
    result = {"machine": machine(int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count()),
              "cap": args.cap, "train_pairs": sum(len(p.y) for p in train.values()),
              "wall_time_s": round(time.monotonic() - started, 1), "rows": rows}
    print(f"wrote {write('finetune_probe', result, markdown(result, selection))}")
    return 0


def markdown(result: dict, selection: list[str]) -> str:
    m = result["machine"]
    held = [n for n in selection if n.startswith("held:")]
    lines = [f"# Fine-tuning probe ({m['date'][:10]})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, load at start {m['loadavg_at_start'][0]:.1f}; commit "
             f"{m['commit']}; {result['wall_time_s']} s. Readers trained with the head (SmolLM2's blocks from "
             f"layer 8 up, or an attention pooling of frozen layer 8) on {result['train_pairs']} pool pairs (85% of "
             f"each source's questions, {result['cap']} pairs per source before the split); selection: the 15% "
             "held-out slices of each source + LLMBar's case-study dev sets. "
             "Accuracy on non-tie pairs minus longer-answer-wins on the same pairs (points); the test sets are "
             "scored for the record, never used for a choice.", "",
             "| variant | selection mean | held-out mean | dev mean | " + " | ".join(n[5:] for n in held) + " | "
             + " | ".join(n.removeprefix("llmbar-") for n in rp.TEST) + " |",
             "|---" * (4 + len(held) + len(rp.TEST)) + "|"]
    for name, r in result["rows"].items():
        s = r["scores"]
        lines.append(f"| {name} | {r['selection_mean']:+.1f} | {r['held_mean']:+.1f} | {r['dev_mean']:+.1f} | "
                     + " | ".join(f"{s[n]:+.1f}" for n in held) + " | "
                     + " | ".join(f"{s[n]:+.1f}" for n in rp.TEST) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
