"""Does a frozen reader judge better when it is asked to? A prompted-reading probe (PromptEOL-style: the state of
the last token of a prompt that asks for a judgement).

The default judge mean-pools SmolLM2's layer-8 states over the answer read after its question. Here the same
reading continues with a second user turn that asks for a verdict (``ASK``) and the assistant's turn opened, and
the states of its last token are kept at several layers: the position where an instruction-tuned model gathers
what it will answer, so the head reads a summary directed at the judgement rather than a mean over the answer.
The mean over the answer tokens is kept too (the default's features, same pass), and the log-odds of "Yes"
against "No" would need the whole model: not read.

Heads (antisymmetric differences with information length, C = 0.03) on the reader probe's protocol (leave one
pool source out, LLMBar case studies as dev; points above longer-answer-wins on the same non-tie pairs; the
evaluation sets only with ``--test``, for the record). Readings cached as ``.npz`` per set under ``--cache``.

    OMP_NUM_THREADS=2 .venv/bin/python research/prompted_probe.py [--layers 8 12 16] [--per-source 500] [--test]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reader_probe as rp  # noqa: E402
from common import write  # noqa: E402

ASK = "Is the response above helpful and correct, and does it do exactly what was asked? Answer yes or no."


def read(spec: str, layers: list[int], name: str, records: list, cache: Path, precision: str) -> Path:
    """Per distinct answer: the last prompt token's state at each of ``layers`` and the mean over the answer's
    tokens at each of them."""
    path = cache / f"prompted-{spec}" / f"{name}.npz"
    if path.exists():
        return path
    from clfjudge.models.backbones import load_tokenizer, resolve_backbone

    tok = load_tokenizer(resolve_backbone(spec))
    sentinel = "\uE000"
    rendered = tok.apply_chat_template([{"role": "user", "content": "q"}, {"role": "assistant", "content": sentinel},
                                        {"role": "user", "content": ASK}], tokenize=False, add_generation_prompt=True)
    suffix = tok(rendered.partition(sentinel)[2].removeprefix(tok.eos_token), add_special_tokens=False).input_ids
    entries, pad = rp.answer_items(spec, records)
    spans = [(len(prompt), len(prompt) + len(body)) for _, prompt, body in entries]
    entries = [(key, prompt, body + suffix) for key, prompt, body in entries]
    out: dict[str, np.ndarray] = {}

    def keep(batch: list[int], states: dict) -> None:
        for layer, h in states.items():
            last = out.setdefault(f"last{layer}", np.zeros((len(entries), h.shape[-1]), np.float32))
            mean = out.setdefault(f"mean{layer}", np.zeros((len(entries), h.shape[-1]), np.float32))
            for row, j in enumerate(batch):
                (lo, hi), end = spans[j], len(entries[j][1]) + len(entries[j][2])
                last[j], mean[j] = h[row, end - 1].numpy(), h[row, lo:hi].mean(0).numpy()

    started = time.monotonic()
    rp.read_states(spec, layers, entries, pad, precision, keep)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, keys=np.array([e[0] for e in entries]), **out)
    print(f"[prompted {spec}] {name}: {len(entries)} answers in {time.monotonic() - started:.0f} s", flush=True)
    return path


class Pairs(rp.Pairs):
    """A set's non-tie pairs: labels, length features and every stored reading as an A - B difference."""

    def __init__(self, records: list, z) -> None:
        super().__init__(records, None)
        pairs = [r for r in records if r.verdict is not None and r.verdict.value in ("A", "B")]
        index = dict(zip(z["keys"], range(len(z["keys"]))))
        a = [index[rp.text_key(r.question, r.answer_a)] for r in pairs]
        b = [index[rp.text_key(r.question, r.answer_b)] for r in pairs]
        for name in z.files:
            if name != "keys":
                setattr(self, name, z[name][a] - z[name][b])


def main() -> int:
    p = rp.probe_parser(__doc__)
    p.add_argument("--layers", nargs="+", type=int, default=[8, 12, 16])
    args = p.parse_args()
    started = time.monotonic()
    named = rp.probe_sets(args.per_source, args.test)
    data = {n: Pairs(recs, np.load(read(args.reader, args.layers, n, recs, args.cache, args.precision)))
            for n, recs in named.items()}
    variants = {f"layer {args.layers[0]} mean + info (the default's features)": (f"mean{args.layers[0]}", "info")}
    for layer in args.layers:
        variants[f"layer {layer} last (prompted) + info"] = (f"last{layer}", "info")
        variants[f"layer {layer} last (prompted) + mean + info"] = (f"last{layer}", f"mean{layer}", "info")
    rows = {f"{name}{', length-balanced' if balanced else ''}": rp.group_probe(data, groups, balanced)
            for balanced in (False, True) for name, groups in variants.items()}
    result = rp.probe_result(args, started, rows, ask=ASK)
    text = rp.group_markdown(result, "Prompted-reading probe", "`last`: the state of the last token after a second "
                             f"user turn asking {result['ask']!r}; `mean`: over the answer's tokens, same pass.")
    print(f"wrote {write('prompted_probe', result, text)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
