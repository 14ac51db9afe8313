"""One input model: every item ``clfjudge score`` reads from a file, ``Judge.score_batch`` / ``compare_batch`` (and
``score`` / ``compare``) read through the same parser and judge alike; a bad item is named counting from 1, as the
file names its line, with the same field and message."""
from __future__ import annotations

import json

import pytest
from foreign_models import tiny_reward_model

from clfjudge.cli import main
from clfjudge.data.records import RecordError
from clfjudge.judges.base import Judge

SYSTEM = {"role": "system", "content": "Be terse."}
ASK = {"role": "user", "content": "Name a prime."}
PARTS = {"role": "user", "content": [{"type": "text", "text": "Name "}, {"type": "text", "text": "a prime."}]}


def reply(text) -> list[dict]:
    return [{"role": "assistant", "content": text}]


# (what the row is, the row): every format an item can come in, plain text and conversational, list content
POINTS = [
    ("clfjudge fields", {"question": "Name a prime.", "answer": "7"}),
    ("clfjudge fields, rubric and id", {"id": "x", "question": "Name a prime.", "answer": "9", "rubric": "Correct?"}),
    ("a question given as messages", {"question": [SYSTEM, ASK], "answer": "7"}),
    ("an answer given as messages, list content", {"question": "Name a prime.",
                                                    "answer": reply([{"type": "text", "text": "7"}])}),
    ("TRL prompt / completion, plain text", {"prompt": "Name a prime. ", "completion": "7"}),
    ("TRL prompt / completion, conversational", {"prompt": [SYSTEM, ASK], "completion": reply("7")}),
    ("TRL prompt / completion, list content", {"prompt": [PARTS], "completion": reply("7")}),
    ("TRL messages", {"messages": [ASK, *reply("7")]}),
    ("pointwise aliases", {"instruction": "Name a prime.", "output": "7"}),
]
PAIRS = [
    ("clfjudge fields", {"question": "Name a prime.", "answer_a": "7", "answer_b": "9"}),
    ("identical answers", {"question": "Name a prime.", "answer_a": "4", "answer_b": "4"}),
    ("a question given as messages", {"question": [SYSTEM, ASK], "answer_a": "7", "answer_b": reply("9")}),
    ("TRL preference, explicit prompt", {"prompt": "Name a prime.", "chosen": "7", "rejected": "9"}),
    ("TRL preference, implicit prompt", {"chosen": "Name a prime. 7", "rejected": "Name a prime. 9"}),
    ("TRL preference, conversational", {"chosen": [SYSTEM, ASK, *reply("7")], "rejected": [SYSTEM, ASK, *reply("9")]}),
    ("TRL preference, list content", {"prompt": [PARTS], "chosen": reply("7"), "rejected": reply("9")}),
    ("pairwise aliases", {"prompt": "Name a prime.", "response_a": "7", "response_b": "9"}),
]
# (the row, the field it names): each bad in one way
BAD_POINTS = [({"question": "Name a prime."}, "answer"),
              ({"prompt": [{"role": "user", "content": [{"type": "image", "url": "x.png"}]}], "completion": "7"},
               "prompt[0].content[0]"),
              ({"messages": [ASK]}, "messages"),
              ({"question": [{"role": "assistant", "content": "hi"}], "answer": "7"}, "question")]
BAD_PAIRS = [({"question": "Name a prime.", "answer_a": "7"}, "answer_b"),
             ({"prompt": "Name a prime.", "chosen": 7, "rejected": "9"}, "chosen")]


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    """A decoder reward model with a chat template: a conversation and plain text are read differently, so an
    interface that lost the difference would give other numbers."""
    return tiny_reward_model("llama", tmp_path_factory.mktemp("rm") / "llama")


def cli(judge_dir, tmp_path, task: str, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """What `clfjudge score` writes for these rows: (output lines, rejected lines)."""
    src, out, rejected = tmp_path / f"{task}.jsonl", tmp_path / f"{task}.out.jsonl", tmp_path / f"{task}.rej.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["score", str(judge_dir), "--input", str(src), "--output", str(out), "--rejected", str(rejected),
          "--task", task])
    read = lambda p: [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []  # noqa: E731
    return read(out), read(rejected)


@pytest.mark.parametrize("task", ["score", "compare"])
def test_every_row_the_cli_accepts_the_python_api_accepts_with_the_same_result(judge_dir, tmp_path, task):
    table = POINTS if task == "score" else PAIRS
    rows = [row for _, row in table]
    written, rejected = cli(judge_dir, tmp_path, task, rows)
    assert rejected == [] and len(written) == len(rows)
    judge = Judge.load(judge_dir)
    results = judge.score_batch(rows) if task == "score" else judge.compare_batch(rows)
    for (name, _), line, result in zip(table, written, results):
        for key, value in result.to_dict().items():
            assert line[key] == (pytest.approx(value, abs=1e-5) if isinstance(value, float) else value), (name, key)
    one_by_one = [judge.score(r["question"], r["answer"]).value if task == "score"
                  else judge.compare(r["question"], r["answer_a"], r["answer_b"]).p_a for r in rows if "question" in r]
    assert one_by_one == pytest.approx([line["score" if task == "score" else "p_a"]
                                        for line, r in zip(written, rows) if "question" in r], abs=1e-5)
    if task == "score":  # the conversational reading is not the plain one: the table tells them apart
        by_name = {name: line["score"] for (name, _), line in zip(table, written)}
        assert by_name["TRL prompt / completion, conversational"] != pytest.approx(by_name["clfjudge fields"])


@pytest.mark.parametrize("task", ["score", "compare"])
def test_a_bad_item_is_named_from_1_as_the_cli_names_its_line(judge_dir, tmp_path, task):
    good, bad = (POINTS, BAD_POINTS) if task == "score" else (PAIRS, BAD_PAIRS)
    judge = Judge.load(judge_dir)
    run = judge.score_batch if task == "score" else judge.compare_batch
    for row, field in bad:
        _, [rejected] = cli(judge_dir, tmp_path, task, [good[0][1], row])
        assert rejected["line"] == 2 and rejected["field"] == field
        with pytest.raises(RecordError) as err:
            run([good[0][1], row])
        assert str(err.value) == f"<batch item>:2: field {field!r}: {rejected['error']}"


def test_identical_answers_tie_and_a_judge_without_a_tie_model_gives_no_tie_probability(judge_dir):
    from clfjudge import best_of_n
    from clfjudge.data.records import Verdict

    judge = Judge.load(judge_dir)  # no calibration: no tie model
    same = judge.compare("What is 2 + 2?", "4", "4", symmetric=True)
    assert same.verdict is Verdict.TIE and same.p_a == same.p_b == 0.5 and same.p_tie == 0.0
    other = judge.compare("What is 2 + 2?", "4", "five")
    assert other.p_tie == 0.0 and other.verdict is not Verdict.TIE
    best, scores = best_of_n(judge, "What is 2 + 2?", ["4", "4"])
    assert scores[0] == scores[1] and best == 0  # equal best scores: the first of them
