"""A trained judge inside a generation loop: best-of-n selection and a TRL-style reward function.

    python train/reward_in_loop.py JUDGE_DIR [--n 4]

Takes real instructions and candidate answers from the Auto-J pairwise test (../shared/data), picks the best
of each set with the judge, and calls the reward function the way TRL's GRPOTrainer does
(``reward_funcs=[reward_function(judge_dir)]``)."""
from __future__ import annotations

import argparse
import time

from clfjudge import Judge, best_of_n, reward_function
from clfjudge.data.sources import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("judge_dir")
    parser.add_argument("--questions", type=int, default=3)
    args = parser.parse_args()

    judge = Judge.load(args.judge_dir)
    records = load("autoj-test").records
    # candidates for one instruction: every answer the test set holds for it
    by_question: dict[str, list[str]] = {}
    for r in records:
        by_question.setdefault(r.question, []).extend([r.answer_a, r.answer_b])
    chosen = [(q, list(dict.fromkeys(c))) for q, c in by_question.items() if len(set(c)) >= 3][: args.questions]
    for question, candidates in chosen:
        start = time.perf_counter()
        best, scores = best_of_n(judge, question, candidates)
        print(f"\nQ: {question[:100]!r}\n  {len(candidates)} candidates, scores {[round(s, 3) for s in scores]}, "
              f"best #{best} ({time.perf_counter() - start:.2f} s): {candidates[best][:120]!r}")

    reward = reward_function(judge)
    prompts = [r.question for r in records[:4]]
    completions = [r.answer_a for r in records[:4]]
    kwargs = {} if "score" in judge.tasks else {"reference": [r.answer_b for r in records[:4]]}
    print("\nTRL-style call reward(prompts=..., completions=...):", [round(x, 3) for x in reward(
        prompts=prompts, completions=completions, **kwargs)])


if __name__ == "__main__":
    main()
