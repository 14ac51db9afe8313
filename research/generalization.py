"""The generalization scoreboard: judges trained on a pool, scored on every set that is not in their pool.

Each variant is the pool recipe (default ``train/cpu/generalist-smollm2-pool.yaml``) with ``--set``-style
overrides, trained through ``clfjudge train`` (the library's splits, decontamination and embedding judge) and
audited through ``clfjudge audit`` (the library's protocols and its scoreboard suite: every judge beside
longer- and shorter-answer-wins on the same pairs with a paired bootstrap CI of the difference). The pool's
held-out questions (its ``test_fraction``) give the held-out slices of Chatbot Arena and HH-RLHF; LLMBar's
case-study sets are the dev suite the recipe's knobs are read off (never reported as held out); the LOSO
variants add one human test set to the pool and are read only on the other.

Embeddings are cached on disk (``$CLFJUDGE_EMBEDDING_CACHE``, default ``~/.cache/clfjudge/embeddings``) and audit
predictions per judge, so a re-run costs seconds. Writes research/results/generalization_<date>.{md,json}.

    OMP_NUM_THREADS=2 .venv/bin/python research/generalization.py [--variants NAME ...] [--recipe PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = REPO / "train" / "cpu" / "generalist-smollm2-pool.yaml"
DEV_SETS = ("llmbar-case-constraint", "llmbar-case-negation", "llmbar-case-normal", "llmbar-case-base9",
            "llmbar-case-base10")
RELEASED = ("released:pandalm-7b", "released:gpt-3.5-turbo", "released:auto-j-13b")


@dataclass(frozen=True)
class Variant:
    description: str
    overrides: tuple[str, ...] = ()
    only: tuple[str, ...] = ()  # LOSO: the sets this variant is read on (the rest are in its pool)


FEATURES = "embedding.features"
VARIANTS = {
    "length": Variant("character-length difference only (a learned length rule)", (f"{FEATURES}=[length_diff]",)),
    "info-length": Variant("information-length difference only (log zlib bytes; a learned rule)",
                           (f"{FEATURES}=[info_length_diff]",)),
    "emb+info": Variant("layer-8 embedding + information length (the default judge's recipe)", ()),
    "emb+chars": Variant("layer-8 embedding + character length (the previous default's features)",
                         (f"{FEATURES}=[diff,length_diff]",)),
    "emb+info, length-balanced": Variant("... longer- and shorter-answer wins weighted equally in training",
                                         ("embedding.weighting=[length,source]",)),
    "emb+info, length removed": Variant("... information length fitted, then removed from the decision",
                                        ("embedding.length_at_prediction=0.0",)),
}


def loso(name: str, base: Variant, added: str, read_on: str, against: list[str]) -> tuple[str, Variant]:
    """``base`` with the human test set ``added`` in its pool, read on ``read_on`` only."""
    rest = [s for s in against if s != added]
    return f"{name} + {added}", Variant(f"{base.description}; pool + {added}",
                                        (*base.overrides, f"extra_train_sources=[{added}]",
                                         f"decontaminate_against=[{','.join(rest)}]"), (read_on,))


def train_variant(recipe: Path, name: str, variant: Variant, out: Path) -> tuple[Path, dict]:
    from clfjudge.training.config import TrainConfig
    from clfjudge.training.trainer import train

    judge_dir = out / "judges" / name.replace(" ", "_").replace(",", "").replace("+", "p")
    cfg = TrainConfig.from_yaml(recipe, [*variant.overrides, f"output_dir={judge_dir}"])
    if not (judge_dir / "judge_card.json").exists() or _stale(judge_dir, cfg):
        start = time.monotonic()
        train(cfg)
        print(f"[{name}] trained in {time.monotonic() - start:.0f} s", flush=True)
    return judge_dir, cfg


def _stale(judge_dir: Path, cfg) -> bool:
    from dataclasses import asdict

    card = json.loads((judge_dir / "judge_card.json").read_text())
    return card["training"].get("config") != json.loads(json.dumps(asdict(cfg), default=str))


def held_out_slices(cfg) -> dict[str, list]:
    """The pool's held-out questions (test_fraction), per source: never trained on."""
    from clfjudge.training.data import build_splits
    from clfjudge.training.embedding import EmbeddingDataHead

    slices: dict[str, list] = {}
    for r in build_splits(cfg, EmbeddingDataHead("pair")).test:
        slices.setdefault(f"held-out:{r.source}", []).append(r)
    return slices


def dev_sets() -> dict[str, list]:
    from clfjudge.data import sources

    return {f"dev:{name}": sources.load(name).records for name in DEV_SETS}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", type=Path, default=DEFAULT_RECIPE)
    p.add_argument("--variants", nargs="+", help="variant names (default: all, and the LOSO rows of the last)")
    p.add_argument("--loso", default="emb+info", help="the variant whose leave-one-source-out rows are run")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "generalization")  # judges + prediction cache
    p.add_argument("--bootstrap", type=int, default=2000)
    args = p.parse_args()
    from clfjudge.embedders.cache import ENV, default_root

    os.environ.setdefault(ENV, str(default_root()))

    from clfjudge.audit import run_audit
    from clfjudge.training.config import TrainConfig

    base_cfg = TrainConfig.from_yaml(args.recipe)
    variants = {n: VARIANTS[n] for n in (args.variants or VARIANTS)}
    if args.loso:
        base = VARIANTS[args.loso]
        against = list(base_cfg.decontaminate_against)
        variants.update([loso(args.loso, base, "autoj-test", "pandalm-test", against),
                         loso(args.loso, base, "pandalm-test", "autoj-test", against)])
    started = time.monotonic()
    judges = {name: train_variant(args.recipe, name, v, args.out)[0] for name, v in variants.items()}
    extra = {**held_out_slices(base_cfg), **dev_sets()}
    main_judges = [str(d) for n, d in judges.items() if not variants[n].only]
    metrics = run_audit([*main_judges, *RELEASED, "semscore"], args.out / "audit", bootstrap=args.bootstrap,
                        extra_sets=extra, suites=["scoreboard", "cross-scheme", "length", "position"])
    loso_rows = {}
    for name, variant in variants.items():
        if variant.only:
            m = run_audit([str(judges[name])], args.out / "audit-loso", bootstrap=args.bootstrap,
                          sets=list(variant.only), suites=["scoreboard"])
            loso_rows[name] = m["suites"]["scoreboard"]
    data = {"machine": machine(int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count()),
            "recipe": str(args.recipe.relative_to(REPO)), "wall_time_s": round(time.monotonic() - started, 1),
            "variants": {n: {"description": v.description, "overrides": list(v.overrides), "judge": str(judges[n]),
                             "read_on": list(v.only)} for n, v in variants.items()},
            "audit": {k: metrics[k] for k in ("judges", "sets", "suites")}, "loso": loso_rows}
    path = write("generalization", data, markdown(data))
    print(f"wrote {path}")
    return 0


def markdown(data: dict) -> str:
    from clfjudge.audit.report import scoreboard_section

    m = data["machine"]
    lines = [f"# Generalization scoreboard ({m['date'][:10]})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['threads']} threads; commit {m['commit']}; "
             f"recipe `{data['recipe']}`; wall time {data['wall_time_s']} s (embeddings cached on disk).", "",
             "Variants (every one trained on the same pool; `dev:` sets chose the knobs, `held-out:` sets are the "
             "pool's held-out questions, every other set is out of distribution):", ""]
    lines += [f"- `{Path(v['judge']).name}`: {v['description']}" + (f" (read on {', '.join(v['read_on'])} only)"
                                                                    if v["read_on"] else "")
              for v in data["variants"].values()]
    lines += ["", *scoreboard_section(data["audit"])]
    if data["loso"]:
        lines += ["## Leave one source out: the other human set added to the pool", ""]
        for name, board in data["loso"].items():
            for set_name, entry in board["sets"].items():
                for judge, row in entry["rows"].items():
                    if judge.startswith("baseline:"):
                        continue
                    d = row["vs_longer"]
                    lines.append(f"- {name} on {set_name} (n={entry['n']}): {100 * row['value']:.1f} vs longer "
                                 f"{100 * entry['rows']['baseline:longer']['value']:.1f}, "
                                 f"{100 * d['estimate']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]; "
                                 f"2-way {100 * row['two_way']:.1f}")
        lines.append("")
    cs = data["audit"]["suites"].get("cross-scheme", {}).get("rows", {})
    point = [(j, r) for j, r in cs.items() if "prometheus-mtbench" in r and "n/a" not in r["prometheus-mtbench"]]
    if point:
        lines += ["## Pointwise: Prometheus MT-Bench / Vicuna-Bench Pearson (pairwise judges through the study's "
                  "transform: reference as answer 1)", "", "| judge | MT-Bench | Vicuna-Bench |", "|---|---|---|"]
        lines += [f"| {j} | {r['prometheus-mtbench'].get('pearson', float('nan')):.3f} | "
                  f"{r.get('prometheus-vicuna', {}).get('pearson', float('nan')):.3f} |" for j, r in point]
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
