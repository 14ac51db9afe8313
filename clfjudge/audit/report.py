"""metrics.json -> report.md with PNG plots (agreement heatmaps, bias bars), the papers' rows beside ours."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..outputs import replace_whole, write_whole
from .paper import AGREEMENT, CROSS_SCHEME, LLMBAR, POINTWISE_EVAL, SEMSCORE_SYSTEM


def _fmt(value: Any, pct: bool = True) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{100 * value:.1f}" if pct else f"{value:.3f}"
    return str(value)


def _cell(entry: Mapping[str, Any] | None, key: str, pct: bool = True) -> str:
    if not entry or "n/a" in entry:
        return "n/a"
    value = entry.get(key)
    text = _fmt(value, pct)
    ci = entry.get("ci")
    if ci and entry.get("headline") == key:
        text += f" [{_fmt(ci['low'], pct)}, {_fmt(ci['high'], pct)}]"
    return text + (" †" if entry.get("seen_in_training") else "")


SEEN_NOTE = "† the judge was trained on records of this set (at best on the other folds): not out-of-distribution."


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _paper_rows(spec: Mapping[str, Any], keys: Sequence[str], pct: bool = True) -> list[list[str]]:
    return [[f"*paper: {name}*", *(_fmt(vals.get(k), pct) for k in keys)] for name, vals in spec["rows"].items()]


def cross_scheme_section(m: Mapping[str, Any]) -> list[str]:
    cs = m["suites"]["cross-scheme"]
    rows = cs["rows"]
    pair_cols = [("judgelm-val", "accuracy"), ("pandalm-test", "accuracy"), ("pandalm-test", "f1"),
                 ("autoj-test", "agreement")]
    present = [(s, k) for s, k in pair_cols if s in m["sets"]]
    header = ["judge", *(f"{s} {k}" for s, k in present), "Average"]
    body = [[j, *(_cell(r.get(s), k) for s, k in present), _fmt((r["average_pairwise"] or {}).get("value"))]
            for j, r in rows.items()]
    body += _paper_rows(CROSS_SCHEME, [f"{s}:{k}" for s, k in present] + ["average"])
    out = ["## Cross-scheme: pairwise selection (study Table 3)", "",
           "Percent" + (", 95% bootstrap CI on the headline metric" if m.get("bootstrap", 1) > 0 else "")
           + ". Unparsed outputs count wrong. " + cs["average_note"]
           + f". Paper rows: {CROSS_SCHEME['table']}. {SEEN_NOTE}", "", *_table(header, body), ""]
    point_sets = [s for s in ("prometheus-mtbench", "prometheus-vicuna", "prometheus-ind", "prometheus-ood")
                  if s in m["sets"]]
    if point_sets:
        header = ["judge", *(f"{s} {k}" for s in point_sets for k in ("pearson", "kendall", "spearman")), "how"]
        body = []
        for j, r in rows.items():
            how = {r[s].get("transform") for s in point_sets if r.get(s) and "n/a" not in r[s]} - {""}
            body.append([j, *(_cell(r.get(s), k, pct=False) for s in point_sets
                              for k in ("pearson", "kendall", "spearman")), "; ".join(sorted(how)) or "native"])
        keys = [f"{s}:{k}" for s in point_sets for k in ("pearson", "kendall", "spearman")]
        body += _paper_rows(POINTWISE_EVAL, keys, pct=False)
        out += ["## Cross-scheme: pointwise grading (study Table 4 protocol; GPT-4 mean score as gold)", "",
                f"Paper rows: {POINTWISE_EVAL['table']} (Pearson only). Pairwise judges grade with the "
                "study's transform (reference as answer 1).", "", *_table(header, body), ""]
    other = [s for s in m["sets"] if m["sets"][s]["protocol"] == "llmbar"]
    if other:
        out += llmbar_section(m, other)
    return out


def scoreboard_section(m: Mapping[str, Any]) -> list[str]:
    """Sets as rows; longer- and shorter-answer-wins, then every other judge with its paired difference to
    length and the 95% CI of that difference."""
    board = m["suites"]["scoreboard"]
    judges = [j for j in m["judges"] if not j.startswith("baseline:")]
    header = ["set", "n", "protocol", "longer wins", "shorter wins", *judges]
    body = []
    for name, entry in board["sets"].items():
        rows = entry["rows"]
        cells = []
        for j in judges:
            r = rows.get(j)
            if r is None:
                cells.append("–")
                continue
            d = r["vs_longer"]
            ci = f" [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]" if d["low"] is not None else ""
            cells.append(f"{_fmt(r['value'])} ({100 * d['estimate']:+.1f}{ci}){' †' if r['seen_in_training'] else ''}")
        body.append([name, str(entry["n"]), entry["protocol"], _fmt(rows["baseline:longer"]["value"]),
                     _fmt(rows.get("baseline:shorter", {}).get("value")), *cells])
    adv = board["adversarial_mean"]
    if adv:
        body.append(["LLMBar adversarial mean", "", "llmbar", _fmt(adv.get("baseline:longer")),
                     _fmt(adv.get("baseline:shorter")), *(_fmt(adv.get(j)) for j in judges)])
    return ["## Scoreboard: every judge against answer length", "",
            "Percent on each set's protocol (selection: forward verdict; autoj: right in both answer orders, ties "
            "count, 3-way; llmbar / both-orders: mean over both orders). In brackets: the judge minus "
            "longer-answer-wins on the same pairs, "
            + ("with a paired bootstrap 95% CI" if m.get("bootstrap", 1) > 0 else "without a CI (--bootstrap 0)")
            + ". A judge that only follows length "
            f"sits at +0 everywhere and far below shorter-wins on LLMBar's adversarial sets. {SEEN_NOTE}", "",
            *_table(header, body), ""]


def llmbar_section(m: Mapping[str, Any], subsets: Sequence[str]) -> list[str]:
    rows = m["suites"]["cross-scheme"]["rows"]
    header = ["judge", *subsets, "average"]
    body = []
    for j, r in rows.items():
        vals = [r.get(s, {}).get("accuracy") if "n/a" not in r.get(s, {"n/a": 1}) else None for s in subsets]
        scored = [v for v in vals if v is not None]
        body.append([j, *(_cell(r.get(s), "accuracy") for s in subsets),
                     _fmt(sum(scored) / len(scored) if scored else None)])
    body += _paper_rows(LLMBAR, list(subsets))
    return ["## LLMBar (study Table 6): accuracy, mean over both answer orders", "",
            f"Paper rows: {LLMBAR['table']}.", "", *_table(header, body), ""]


def bias_section(m: Mapping[str, Any], out_dir: Path) -> list[str]:
    lines = ["## Position bias", "",
             "consistency = same verdict after swapping the answers; flip = the verdict follows the position; "
             "first = share of decisive verdicts for the first-shown answer, pooled over both orders (0.5 = no "
             "preference).", ""]
    pos = m["suites"].get("position", {}).get("rows", {})
    body = [[j, s, _fmt(v["consistency"]), _fmt(v["flip_rate"]), _fmt(v["first_position_preference"])]
            for j, sets in pos.items() for s, v in sets.items()]
    lines += [*_table(["judge", "set", "consistency", "flip", "first"], body), ""]
    length = m["suites"].get("length", {}).get("rows", {})
    lines += ["## Length bias", "", "Accuracy on decisive pairs where the gold winner is the longer / the shorter "
              "answer; how often the judge picks the longer answer; Pearson of the judge's margin with the "
              "log-length difference.", ""]
    body = [[j, s, f"{_fmt(v['acc_gold_longer'])} (n={v['n_gold_longer']})",
             f"{_fmt(v['acc_gold_shorter'])} (n={v['n_gold_shorter']})", _fmt(v["picks_longer"]),
             _fmt(v.get("margin_length_pearson"), pct=False)]
            for j, sets in length.items() for s, v in sets.items()]
    lines += [*_table(["judge", "set", "acc, gold longer", "acc, gold shorter", "picks longer", "r(margin, Δlen)"],
                      body), ""]
    if any(length.values()):
        lines += [f"![length bias]({_length_plot(length, out_dir).name})", ""]
    return lines


LENGTH_PLOT_SETS = ("pandalm-test", "autoj-test", "llmbar-natural")


def _length_plot(length: Mapping[str, Any], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    judges = list(length)
    present = sorted({s for v in length.values() for s in v})
    # the built-in sets the plot shows; an audit of other sets only (a user's) plots its first three
    sets = [s for s in present if s in LENGTH_PLOT_SETS] or present[:3]
    fig, axes = plt.subplots(1, max(len(sets), 1), figsize=(5 * max(len(sets), 1), 4), squeeze=False)
    for ax, s in zip(axes[0], sets):
        x = np.arange(len(judges))
        longer = [length[j].get(s, {}).get("acc_gold_longer") or 0 for j in judges]
        shorter = [length[j].get(s, {}).get("acc_gold_shorter") or 0 for j in judges]
        ax.bar(x - 0.2, longer, 0.4, label="gold = longer")
        ax.bar(x + 0.2, shorter, 0.4, label="gold = shorter")
        ax.set_xticks(x, [j[:24] for j in judges], rotation=30, ha="right", fontsize=7)
        ax.set_title(s)
        ax.set_ylim(0, 1)
    axes[0][0].legend()
    fig.tight_layout()
    path = out_dir / "length_bias.png"
    with replace_whole(path, "wb") as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
    return path


def agreement_section(m: Mapping[str, Any], out_dir: Path) -> list[str]:
    mats = m["suites"].get("agreement", {}).get("matrices", {})
    lines = ["## Inter-evaluator agreement (study Figs 2-3)", "",
             f"Macro F1 on pairwise sets, Pearson on pointwise sets; gold is one evaluator. {AGREEMENT['text']}",
             ""]
    for set_name, mat in mats.items():
        lines += [f"![{set_name}]({_heatmap(set_name, mat, out_dir).name})", ""]
        lines += _table([set_name, *mat["names"]],
                        [[a, *(f"{v:.3f}" for v in row)] for a, row in zip(mat["names"], mat["values"])]) + [""]
    return lines


def _heatmap(set_name: str, mat: Mapping[str, Any], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    values = np.asarray(mat["values"], dtype=float)
    names = [n[:24] for n in mat["names"]]
    fig, ax = plt.subplots(figsize=(1.2 * len(names) + 2, 1.0 * len(names) + 1.5))
    im = ax.imshow(values, vmin=min(0.0, float(np.nanmin(values))), vmax=1.0, cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    for (i, k), v in np.ndenumerate(values):
        ax.text(k, i, f"{v:.2f}", ha="center", va="center", color="w" if v < 0.6 else "k", fontsize=7)
    ax.set_title(f"{set_name}: {mat['kind']} agreement")
    fig.colorbar(im)
    fig.tight_layout()
    path = out_dir / f"agreement_{set_name}.png"
    with replace_whole(path, "wb") as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
    return path


def system_section(m: Mapping[str, Any]) -> list[str]:
    sets = m["suites"].get("system-level", {}).get("sets", {})
    if not sets:
        return []
    def signed(v: Mapping[str, Any]) -> str:  # metrics written before the signed values were kept: n/a
        return " / ".join(_fmt(v.get(k), pct=False) for k in ("kendall_tau_signed", "pearson_r_signed"))

    body = [[s, j, _fmt(v["kendall_tau"], pct=False), _fmt(v["pearson_r"], pct=False), signed(v),
             str(len(v["systems"]))] for s, judges in sets.items() for j, v in judges.items()]
    return ["## System level (SemScore protocol)", "",
            "Per-system mean of each judge's score vs the per-system mean GPT-4 score; |Kendall τ|, |Pearson r| "
            "(the paper's protocol), and both with their sign (negative: the judge ranks the systems backwards). "
            f"Paper: SemScore {SEMSCORE_SYSTEM['kendall_tau']} / {SEMSCORE_SYSTEM['pearson_r']} "
            f"({SEMSCORE_SYSTEM['table']}); with only 4 systems here τ moves in steps of 1/3.", "",
            *_table(["set", "judge", "Kendall τ", "Pearson r", "signed τ / r", "systems"], body), ""]


def truncation_section(m: Mapping[str, Any]) -> list[str]:
    rows = m["suites"].get("truncation", {}).get("rows", {})
    if not rows:
        return []
    body = [[j, s, f"{v['truncated']}/{v['records']}", _fmt(v["fraction_truncated"]), str(v["longest_tokens"])]
            for j, sets in rows.items() for s, v in sets.items()]
    return ["## Truncation under each judge's policy", "",
            *_table(["judge", "set", "inputs truncated", "%", "longest input (tokens)"], body), ""]


def _read(entry: Mapping[str, Any]) -> str:
    """How many usable records a set's n was sampled from, where it was sampled."""
    loaded = entry.get("loaded")
    return f", a seeded sample of {loaded['records']}" if loaded and loaded["records"] != entry["n"] else ""


def excluded_section(m: Mapping[str, Any]) -> list[str]:
    """The rows each set's loader left out, by reason, and the first of them by file, row and field."""
    body = []
    for name, entry in m["sets"].items():
        loaded = entry.get("loaded") or {}
        if loaded.get("excluded"):
            reasons = "; ".join(f"{reason}: {n}" for reason, n in loaded["excluded_by_reason"].items())
            body.append(f"- **{name}**: {loaded['excluded']} of {loaded['excluded'] + loaded['records']} rows "
                        f"excluded: {reasons}")
            body += [f"  - `{example}`" for example in loaded.get("first_excluded") or ()]
    if not body:
        return []
    return ["## Rows excluded", "", "What the sets' loaders could not use (n counts the rest).", "", *body, ""]


def escalation_section(m: Mapping[str, Any]) -> list[str]:
    """Per fast judge and set: accuracy and reading cost at each share of pairs sent to the teacher."""
    table = m.get("escalation")
    if not table:
        return []
    out = ["## Escalation: accuracy against the share of pairs sent to the teacher", "",
           f"Teacher: `{table['teacher']}`. The fast judge decides every pair; the least sure share of them "
           "(smallest |P(A) - P(B)|) is decided by the teacher. Accuracy: one answer order, unparsed outputs count "
           "wrong. Seconds: wall time on this machine, the teacher's scaled from its time on the whole set to the "
           "pairs it reads.", ""]
    header = ["escalated", "teacher pairs", "accuracy", "agreement with teacher", "judge s", "teacher s", "total s"]
    for judge, sets in table["judges"].items():
        for set_name, points in sets.items():
            body = [[f"{100 * p['share']:g}%", str(p["teacher_pairs"]), _fmt(p["accuracy"]),
                     _fmt(p["agreement_with_teacher"]), *(f"{p[k]:.2f}" for k in ("judge_seconds", "teacher_seconds",
                                                                                  "seconds"))] for p in points]
            out += [f"**{judge}** on {set_name} (n={points[0]['pairs'] if points else 0})", "",
                    *_table(header, body), ""]
    return out


def write_report(m: Mapping[str, Any], out_dir: Path) -> Path:
    lines = ["# clfjudge audit", "", "Judges: " + ", ".join(f"`{n}`" for n in m["judges"]) + ".",
             "Sets: " + ", ".join(f"{s} (n={v['n']}{_read(v)})" for s, v in m["sets"].items()) + "."]
    if m["sets_not_available"]:
        lines.append("Not available here (no files): " + ", ".join(m["sets_not_available"]) + ".")
    if m["limit"]:
        lines.append(f"Each set is a seeded sample of at most {m['limit']} records.")
    if m.get("set_limits"):
        caps = ", ".join(f"{name} {cap}" for name, cap in sorted(m["set_limits"].items()))
        lines.append(f"Smaller seeded samples: {caps}.")
    lines.append("")
    lines += excluded_section(m)
    sections = {"scoreboard": lambda: scoreboard_section(m), "cross-scheme": lambda: cross_scheme_section(m),
                "position": lambda: bias_section(m, out_dir),
                "agreement": lambda: agreement_section(m, out_dir), "system-level": lambda: system_section(m),
                "truncation": lambda: truncation_section(m)}
    for name, section in sections.items():
        if name in m["suites"]:
            lines += section()
    lines += escalation_section(m)
    path = out_dir / "report.md"
    write_whole(path, "\n".join(lines) + "\n")
    return path
