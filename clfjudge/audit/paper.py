"""The papers' numbers the report puts beside ours, transcribed from their tables: "An Empirical Study of
LLM-as-a-Judge for LLM Evaluation: Fine-tuned Judge Models are Task-specific Classifiers" ("Empirical Study"
below), "Prometheus: Inducing Fine-grained Evaluation Capability in Language Models" and "SemScore: Automated
Evaluation of Instruction-Tuned LLMs based on Semantic Textual Similarity".

Keys are our metric names on our set names, so the report can line rows up; ``table`` names the source table.
Percentages are stored as fractions like ours.
"""
from __future__ import annotations

# Empirical Study Table 3 (released judges cross-validated, pairwise) and Table 2 (the authors' own heads, ‡ rows).
CROSS_SCHEME = {
    "table": "Empirical Study Tables 3 / 2 (JudgeLM / PandaLM / Auto-J test sets; Average = mean of the three "
             "acc/agreement)",
    "rows": {
        "GPT 3.5": {"judgelm-val:accuracy": .7383, "pandalm-test:accuracy": .6296, "pandalm-test:f1": .5820,
                    "autoj-test:agreement": .427, "average": .5983},
        "GPT 4-0613": {"judgelm-val:accuracy": .8528, "pandalm-test:accuracy": .7868, "pandalm-test:f1": .7324,
                       "autoj-test:agreement": .563, "average": .7342},
        "JudgeLM-7B": {"judgelm-val:accuracy": .7902, "pandalm-test:accuracy": .7097, "pandalm-test:f1": .6759,
                       "autoj-test:agreement": .466, "average": .6553},
        "PandaLM-7B": {"judgelm-val:accuracy": .6524, "pandalm-test:accuracy": .6757, "pandalm-test:f1": .5749,
                       "autoj-test:agreement": .400, "average": .5761},
        "Auto-J-13B": {"judgelm-val:accuracy": .7286, "pandalm-test:accuracy": .7147, "pandalm-test:f1": .6101,
                       "autoj-test:agreement": .546, "average": .6631},
        "Prometheus-13B (w/ trans)": {"judgelm-val:accuracy": .5424, "pandalm-test:accuracy": .4525,
                                      "pandalm-test:f1": .4358, "autoj-test:agreement": .478, "average": .4910},
        "Vicuna-7B generation (own data)": {"judgelm-val:accuracy": .8244, "pandalm-test:accuracy": .7237,
                                            "pandalm-test:f1": .6078, "autoj-test:agreement": .476},
        "Vicuna-7B classification (own data)": {"judgelm-val:accuracy": .8216, "pandalm-test:accuracy": .7087,
                                                "pandalm-test:f1": .6034, "autoj-test:agreement": .468},
        "DeBERTa classification (own data)": {"judgelm-val:accuracy": .8130, "pandalm-test:accuracy": .7227,
                                              "pandalm-test:f1": .5175, "autoj-test:agreement": .317},
    },
}

# Prometheus v1, correlation with GPT-4 scores on the Vicuna Bench and MT Bench eval files we have.
POINTWISE_EVAL = {
    "table": "Prometheus v1, Pearson with GPT-4 on Vicuna Bench / MT Bench (the prometheus-vicuna / -mtbench files)",
    "rows": {
        "LLAMA2-CHAT 13B": {"prometheus-vicuna:pearson": .211, "prometheus-mtbench:pearson": -.020},
        "PROMETHEUS-13B": {"prometheus-vicuna:pearson": .466, "prometheus-mtbench:pearson": .473},
        "GPT-3.5-TURBO-0613": {"prometheus-vicuna:pearson": .270, "prometheus-mtbench:pearson": .275},
        "GPT-4-0613": {"prometheus-vicuna:pearson": .925, "prometheus-mtbench:pearson": .952},
    },
}

# Empirical Study Table 6: LLMBar accuracy.
LLMBAR = {
    "table": "Empirical Study Table 6 (LLMBar accuracy)",
    "rows": {
        "GPT 4-0613": {"llmbar-natural": .935, "llmbar-neighbor": .642, "llmbar-gptinst": .766,
                       "llmbar-gptout": .766, "llmbar-manual": .750},
        "JudgeLM-7B": {"llmbar-natural": .620, "llmbar-neighbor": .231, "llmbar-gptinst": .261,
                       "llmbar-gptout": .468, "llmbar-manual": .283},
        "PandaLM-7B": {"llmbar-natural": .590, "llmbar-neighbor": .165, "llmbar-gptinst": .217,
                       "llmbar-gptout": .426, "llmbar-manual": .261},
        "Auto-J-13B": {"llmbar-natural": .700, "llmbar-neighbor": .209, "llmbar-gptinst": .217,
                       "llmbar-gptout": .468, "llmbar-manual": .239},
        "Prometheus-7B": {"llmbar-natural": .530, "llmbar-neighbor": .224, "llmbar-gptinst": .174,
                          "llmbar-gptout": .277, "llmbar-manual": .326},
        "DeBERTa": {"llmbar-natural": .620, "llmbar-neighbor": .269, "llmbar-gptinst": .424,
                    "llmbar-gptout": .553, "llmbar-manual": .348},
    },
}

# SemScore Table 3: system-level correlation with human ratings over 12 models (absolute values).
SEMSCORE_SYSTEM = {"table": "SemScore Table 3 (12 systems, human ratings)", "kendall_tau": .879, "pearson_r": .970}

# Empirical Study Figures 2 / 3: agreement between the authors' heads (JudgeLM test F1; Prometheus test Pearson).
AGREEMENT = {
    "table": "Empirical Study Figures 2 / 3",
    "text": "F1 between Vicuna-gen, Vicuna-cls and DeBERTa-cls: 82.7-84.5; each vs GPT-4: 64.3-65.0. "
            "Pearson among the three heads 0.954-0.977; each vs GPT-4 0.623-0.630.",
}
