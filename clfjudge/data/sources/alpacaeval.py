"""AlpacaEval annotations (tatsu-lab/alpaca_eval ``results/<generator>/<annotator config>/annotations.json``):
JSON lists of {instruction, output_1, generator_1, dataset, output_2, generator_2, annotator, preference, ...}
on the 805 AlpacaEval instructions; output_1 is the baseline model, output_2 the evaluated one.

- ``alpacaeval-gpt4``: every ``alpaca_eval_gpt4`` file (AlpacaEval 1, GPT-4 judge). preference 1 = output_1
  better, 2 = output_2 better, 0 or 1.5 = draw (TIE).
- ``alpacaeval-gpt4turbo``: the AlpacaEval 2 files: ``weighted_alpaca_eval_gpt4_turbo`` (preference is
  continuous, 1 + P(output_2 better), from GPT-4-turbo's logprobs) and ``alpaca_eval_cot_gpt4_turbo_fn``
  (1.0 / 2.0, 1.5 = draw). split = the annotator config. The verdict uses the 1.5 threshold; the soft label
  is kept as meta["p_b"] = preference - 1 (0, 0.5 or 1 for the CoT files).

A preference of null (the annotator returned nothing: 42 + 1 annotations in the snapshot) is excluded and
counted. Empty outputs are kept: the judge saw and judged them. id = "alpacaeval-gpt4:{generator}:{index in
file}", "alpacaeval-gpt4turbo:{generator}/{config}:{index in file}";
meta keeps generator_1/2, the dataset and the annotations file (relative to the results directory).
"""
from __future__ import annotations

from pathlib import Path

from ..records import LoadResult, Verdict
from .base import SOURCES, Source
from .common import SPLIT, Collector, Fields, array_records, data_files, relative_name

GPT4, GPT4_TURBO = "alpacaeval-gpt4", "alpacaeval-gpt4turbo"
_CONFIGS = {
    GPT4: ("alpaca_eval_gpt4",),
    GPT4_TURBO: ("weighted_alpaca_eval_gpt4_turbo", "alpaca_eval_cot_gpt4_turbo_fn"),
}
_DRAW_V1 = 0.0  # AlpacaEval 1 also writes a draw as 0


def preference_verdict(f: Fields) -> Verdict:
    """1 -> A, 2 -> B, 1.5 (or AlpacaEval 1's 0) -> TIE; soft preferences in [1, 2] by the 1.5 threshold."""
    preference = f.number("preference")
    if preference == _DRAW_V1:
        return Verdict.TIE
    if not 1.0 <= preference <= 2.0:
        raise f.loc.error("preference", f"must be 0 or in [1, 2], got {preference!r}")
    return Verdict.from_win((preference < 1.5) - (preference > 1.5))


def _loader(name: str):
    configs = _CONFIGS[name]

    def load(path: Path) -> LoadResult:
        out = Collector(name)
        files = [file for config in configs for file in data_files(path, f"*/{config}/annotations.json")]
        for file in files:
            generator, config = file.parent.parent.name, file.parent.name
            key = generator if len(configs) == 1 else f"{generator}/{config}"
            for index, loc, obj in array_records(file):
                f = Fields(obj, loc)
                texts = dict(question=f.text("instruction"), answer_a=f.text("output_1"), answer_b=f.text("output_2"))
                if f.get("preference") is None:
                    out.exclude("preference is null (the annotator gave no judgement)", f.loc, "preference")
                    continue
                meta = {"generator_1": f.optional_text("generator_1"), "generator_2": f.optional_text("generator_2"),
                        "dataset": f.optional_text("dataset"), "annotations_file": relative_name(file, path)}
                if name == GPT4_TURBO:
                    meta.update({SPLIT: config, "p_b": f.number("preference") - 1.0})
                out.pair(
                    f.loc,
                    id=f"{name}:{key}:{index}",
                    verdict=preference_verdict(f),
                    model_a=meta["generator_1"],
                    model_b=meta["generator_2"],
                    meta=meta,
                    **texts,
                )
        return out.result()

    return load


SOURCES.register(GPT4, Source(
    name=GPT4, arity="pair", role="train", default_path="alpaca_eval/results", loader=_loader(GPT4),
    license="data CC BY-NC 4.0 (tatsu-lab/alpaca_eval); annotations are OpenAI model outputs",
    description="AlpacaEval 1 GPT-4 preferences: 26 models vs text_davinci_003 on 805 instructions",
    tags=("gpt-4",), fixed_order=True,
))
SOURCES.register(GPT4_TURBO, Source(
    name=GPT4_TURBO, arity="pair", role="train", default_path="alpaca_eval/results", loader=_loader(GPT4_TURBO),
    license="data CC BY-NC 4.0 (tatsu-lab/alpaca_eval); annotations are OpenAI model outputs",
    description="AlpacaEval 2 GPT-4-turbo preferences (weighted soft labels + CoT), vs gpt4_1106_preview",
    tags=("gpt-4",), fixed_order=True,
))
