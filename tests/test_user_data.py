"""A user's own data in every command: small real slices of ../shared/data written out in the formats TRL and 🤗
datasets produce (JSONL, Parquet through ``Dataset.to_parquet``, CSV, a ``save_to_disk`` directory), driven end to
end through the CLI (data stats -> train -> audit --sets -> score -> serve), and the formats' rules on their own."""
from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from starlette.testclient import TestClient
from tiny_judges import make_judge

from clfjudge import testing
from clfjudge.card import JudgeCard
from clfjudge.cli import main
from clfjudge.data import sources
from clfjudge.data.formats import ReadOptions, item_record
from clfjudge.data.records import Loc, PairRecord, RecordError, Verdict
from clfjudge.judges.base import Judge
from clfjudge.paths import data_root
from clfjudge.serving.server import create_app

REAL_DATA = (data_root() / "ultrafeedback-sample").exists() and (data_root() / "pandalm").exists()
needs_data = pytest.mark.skipif(not REAL_DATA, reason="needs ../shared/data (present in CI)")
N = 24
SYSTEM = "You are a helpful assistant."


def _messages(role: str, text: str, parts: bool = False) -> dict:
    return {"role": role, "content": [{"type": "text", "text": text}] if parts else text}


@pytest.fixture(scope="module")
def ultrafeedback() -> list[PairRecord]:
    return sources.load("ultrafeedback").records[:N]


def _trl_plain(records):
    return [{"prompt": r.question, "chosen": r.answer_a, "rejected": r.answer_b} for r in records]


def _trl_conversational(records, parts: str = "some"):
    """TRL's conversational preference rows (explicit prompt), with a system prompt; the answers' content given as
    a list of text parts in every other row ("some": JSON lines can mix them) or in every row ("all": an Arrow
    column holds one type)."""
    return [{"prompt": [_messages("system", SYSTEM), _messages("user", r.question)],
             "chosen": [_messages("assistant", r.answer_a, parts=parts == "all" or i % 2 == 0)],
             "rejected": [_messages("assistant", r.answer_b, parts=parts == "all")]} for i, r in enumerate(records)]


def _trl_implicit(records):
    """TRL's implicit-prompt conversational rows: each side the whole conversation."""
    return [{"chosen": [_messages("user", r.question), _messages("assistant", r.answer_a)],
             "rejected": [_messages("user", r.question), _messages("assistant", r.answer_b)]} for r in records]


def _write_jsonl(rows, path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _write_parquet(rows, path: Path) -> Path:
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def _write_disk(rows, path: Path) -> Path:
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def _pairwise_csv(path: Path) -> Path:
    """PandaLM's human-labelled pairs with the winner spelled as arena / MT-Bench exports spell it."""
    spell = {Verdict.A: "model_a", Verdict.B: "B", Verdict.TIE: "tie (bothbad)"}
    rows = [{"instruction": r.question, "response_a": r.answer_a, "response_b": r.answer_b,
             "winner": spell[r.verdict]} for r in sources.load("pandalm-test").records[:N]]
    datasets.Dataset.from_list(rows).to_csv(str(path), index=False)
    return path


def _stats(capsys, spec: str, *extra: str) -> dict:
    capsys.readouterr()
    assert main(["data", "stats", "--source", spec, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)[0]


def _train(tmp_path: Path, name: str, lines: str) -> Path:
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(lines + f"output_dir: {tmp_path / name}\n")
    assert main(["train", "--config", str(recipe)]) == 0
    return tmp_path / name


EMBEDDING = ("backbone: minilm\nhead: embedding\nrandomize_order: true\ndev_fraction: 0.25\n"
             "embedding: {head_params: {C: 1.0}}\n")


def _audit_score_serve(tmp_path: Path, judge_dir: Path, spec: str, rows: int, arity: str = "pair",
                       rejected: int = 0) -> dict:
    """audit --sets the user's file, score it, serve its rows: every row judged, the set on the scoreboard."""
    out = tmp_path / f"audit-{judge_dir.name}"
    assert main(["audit", str(judge_dir), "--sets", spec, "--out", str(out), "--bootstrap", "20"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    scored = tmp_path / f"{judge_dir.name}.scores.jsonl"
    assert main(["score", str(judge_dir), "--input", spec, "--output", str(scored)]) == (1 if rejected else 0)
    assert len(scored.read_text().splitlines()) == rows
    if rejected:
        assert len(Path(f"{scored}.rejected.jsonl").read_text().splitlines()) == rejected
    items = [json.loads(line) for line in scored.read_text().splitlines()]
    assert all(r["score" if arity == "point" else "p_a"] is not None for r in items)
    table = datasets.load_from_disk(spec) if Path(spec).is_dir() else None
    if table is not None:  # serve the rows as they are in the data set
        with TestClient(create_app(Judge.load(judge_dir))) as client:
            got = client.post("/compare" if arity == "pair" else "/score", json={"items": table.to_list()[:8]})
            assert got.status_code == 200, got.json()
            assert [r["p_a"] for r in got.json()["results"]] == pytest.approx([r["p_a"] for r in items[:8]],
                                                                              abs=1e-5)
    return metrics


# -- end to end, one format at a time ---------------------------------------------------------------------------

@needs_data
@pytest.mark.parametrize("fmt, write", [
    ("trl", lambda recs, tmp: _write_jsonl(_trl_plain(recs), tmp / "pairs.jsonl")),
    ("trl", lambda recs, tmp: _write_jsonl(_trl_conversational(recs), tmp / "chat.jsonl")),
    ("trl", lambda recs, tmp: _write_parquet(_trl_implicit(recs), tmp / "implicit.parquet")),
    ("trl", lambda recs, tmp: _write_disk(_trl_conversational(recs, parts="all"), tmp / "chat-dataset")),
    ("pairwise", lambda recs, tmp: _pairwise_csv(tmp / "arena.csv")),
], ids=["trl-jsonl", "trl-conversational-jsonl", "trl-implicit-parquet", "trl-save-to-disk", "pairwise-csv"])
def test_each_pair_format_end_to_end(ultrafeedback, tmp_path, capsys, fmt, write):
    spec = str(write(ultrafeedback, tmp_path))
    # PandaLM keeps empty model outputs; a CSV cannot tell an empty cell from a missing one: a bad row, named
    bad = sum(not (r.answer_a.strip() and r.answer_b.strip()) for r in sources.load("pandalm-test").records[:N]
              ) if fmt == "pairwise" else 0
    row = _stats(capsys, spec)
    assert (row["arity"], row["role"], row["records"], row["excluded"]) == ("pair", "user", N - bad, bad)
    assert sum(note.count("is missing") for note in row["notes"][1:-1]) == bad
    judge_dir = _train(tmp_path, "judge", EMBEDDING + f"sources: [{spec}]\n")
    card = JudgeCard.load(judge_dir)
    data = card.training["sources"]["train"][spec]["data"]
    assert data["format"] == fmt and data["rows"] == N and len(data["sha256"]) == 64
    metrics = _audit_score_serve(tmp_path, judge_dir, spec, N - bad, rejected=bad)
    board = metrics["suites"]["scoreboard"]["sets"][Path(spec).name]
    judge_row, = (row for name, row in board["rows"].items() if not name.startswith("baseline:"))
    assert board["n"] == N - bad and judge_row["vs_longer"]["low"] <= judge_row["vs_longer"]["estimate"]
    assert judge_row["seen_in_training"]  # the judge's own training file, flagged on the scoreboard
    assert {"baseline:longer", "baseline:shorter"} <= set(board["rows"])
    # chosen-first data is audited with a seeded half of its pairs swapped: the answer order gives nothing away
    assert board["rows"]["baseline:majority"]["value"] < 0.8


@needs_data
def test_a_fine_tuned_head_on_a_conversational_file(ultrafeedback, tiny_bert_dir, tmp_path):
    spec = str(_write_jsonl(_trl_conversational(ultrafeedback), tmp_path / "chat.jsonl"))
    judge_dir = _train(tmp_path, "reward", f"backbone: {tiny_bert_dir}\nhead: reward\nsources: [{spec}:20]\n"
                                           "max_length: 128\nbatch_size: 8\nmax_steps: 2\n"
                                           "early_stopping_patience: 0\n")
    assert JudgeCard.load(judge_dir).training["sources"]["train"][spec]["used"] == 20
    _audit_score_serve(tmp_path, judge_dir, spec, N)
    # the export's parity gate reads the judge's training file again, as the card recorded it
    assert main(["export", str(judge_dir), "--out", str(tmp_path / "onnx")]) == 0
    from clfjudge.export.gate import REPORT_NAME

    validation = json.loads((tmp_path / "onnx" / REPORT_NAME).read_text())["validation"]
    assert validation["source"] == spec and validation["n"] > 0


@needs_data
def test_pointwise_ratings_end_to_end(tiny_bert_dir, tmp_path, capsys):
    """Prometheus' 1-5 rubric scores as prompt / response / score rows in Parquet; a 1-10 file needs --scale."""
    points = sources.load("prometheus-vicuna").records[:N]
    rows = [{"prompt": p.question, "response": p.answer, "score": p.score} for p in points]
    spec = str(_write_parquet(rows, tmp_path / "ratings.parquet"))
    row = _stats(capsys, spec)
    assert (row["arity"], row["records"]) == ("point", N)
    judge_dir = _train(tmp_path, "regression", f"backbone: {tiny_bert_dir}\nhead: regression\nsources: [{spec}]\n"
                                               "max_length: 128\nbatch_size: 8\nmax_steps: 2\n"
                                               "early_stopping_patience: 0\n")
    metrics = _audit_score_serve(tmp_path, judge_dir, spec, N, arity="point")
    assert "ratings.parquet" in json.dumps(metrics["suites"])
    ten = _write_parquet([{**r, "score": r["score"] + 5} for r in rows], tmp_path / "ten.parquet")
    with pytest.raises(RecordError, match=r"ten.parquet.*field 'score': is outside the scale"):
        sources.load(str(ten))  # every row outside 1-5: nothing usable, the reason named
    assert len(sources.load(str(ten), options=ReadOptions.make(scale="1,10")).records) == N
    assert _stats(capsys, str(ten), "--scale", "1,10")["records"] == N


@needs_data
def test_a_trl_copy_of_a_built_in_source_trains_the_same_judge(ultrafeedback, tmp_path):
    """The whole UltraFeedback sample written as TRL rows (explicit prompt, in file order) gives the records the
    built-in loader gives, so the same recipe and seed make a judge that decides every pair the same way."""
    everything = sources.load("ultrafeedback").records
    spec = str(_write_jsonl(_trl_plain(everything), tmp_path / "uf.jsonl"))
    builtin = _train(tmp_path, "builtin", EMBEDDING + "sources: [ultrafeedback:40]\n")
    copy = _train(tmp_path, "copy", EMBEDDING + f"sources: [{spec}:40]\n")
    probe = everything[200:230]
    a, b = Judge.load(builtin).compare_batch(probe), Judge.load(copy).compare_batch(probe)
    assert [c.verdict for c in a] == [c.verdict for c in b]
    assert [c.p_a for c in a] == pytest.approx([c.p_a for c in b], abs=1e-6)


# -- errors ------------------------------------------------------------------------------------------------------

def test_bad_rows_are_named_and_counted(tmp_path, capsys):
    good = {"prompt": "Name a prime.", "chosen": "Seven.", "rejected": "Nine."}
    rows = [good, {**good, "prompt": " "}, {**good, "rejected": None},
            {**good, "prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
             "chosen": [{"role": "assistant", "content": "Seven."}],
             "rejected": [{"role": "assistant", "content": "Nine."}]},
            {**good, "prompt": [{"role": "robot", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "a"}],
             "rejected": [{"role": "assistant", "content": "b"}]},
            {**good, "prompt": "Name another."}]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    row = _stats(capsys, str(path))
    assert row["records"] == 2 and row["excluded"] == 4
    assert row["excluded_by_reason"] == {"bad row: field 'prompt': is empty": 1,
                                         "bad row: field 'rejected': is missing": 1,
                                         "bad row: field 'prompt[0].content[0]': only text parts can be judged": 1,
                                         "bad row: field 'prompt[0].role': unknown role 'robot'; known": 1}
    notes = "\n".join(row["notes"])
    assert f"{path}:2: field 'prompt': is empty" in notes and f"{path}:3: field 'rejected': is missing" in notes
    # score writes each bad line to the rejected file with its line and field
    judge_dir = make_judge(testing.tiny_bert(tmp_path / "bert"), tmp_path / "judge", "cls3")
    out = tmp_path / "out.jsonl"
    assert main(["score", str(judge_dir), "--input", str(path), "--output", str(out)]) == 1
    rejected = [json.loads(x) for x in (tmp_path / "out.jsonl.rejected.jsonl").read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in rejected] == [(2, "prompt"), (3, "rejected"), (4, "prompt[0].content[0]"),
                                                           (5, "prompt[0].role")]
    assert len(out.read_text().splitlines()) == 2


def test_the_audit_names_a_bad_row_in_one_clfjudge_line_and_nothing_else(tmp_path, capfd, caplog):
    """A file datasets cannot read: clfjudge's error names its line, datasets' own log (rows counted from 0) stays
    off the console; a bad row in a readable file: one clfjudge line, and no library warning from the report."""
    import warnings

    rows = [{"question": f"Question {i}?", "answer_a": "a longer answer, with reasons" if i % 2 else "short",
             "answer_b": "b", "winner": "A" if i % 3 else "B"} for i in range(12)]
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(json.dumps(r) + "\n" if i != 6 else "{not json\n" for i, r in enumerate(rows)))
    assert main(["audit", "baseline:longer", "--sets", str(broken), "--out", str(tmp_path / "a"),
                 "--bootstrap", "0"]) == 2
    err = capfd.readouterr().err
    assert f"{broken}:7: invalid JSON" in err and "Failed to load JSON" not in err + caplog.text

    bad_row = _write_jsonl([*rows[:6], {**rows[6], "winner": "maybe"}, *rows[7:]], tmp_path / "bad-row.jsonl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["audit", "baseline:longer", "--sets", str(bad_row), "--out", str(tmp_path / "b"),
                     "--bootstrap", "0"]) == 0
    console = capfd.readouterr()
    named = [line for line in (console.out + console.err).splitlines() if f"{bad_row}:" in line]
    assert len(named) == 1 and f"{bad_row}:7: field 'winner'" in named[0]
    assert [str(w.message) for w in caught if "legend" in str(w.message)] == []
    assert (tmp_path / "b" / "length_bias.png").is_file()  # a user's set is plotted


def test_a_wrong_type_is_named(tmp_path, capsys):
    path = tmp_path / "ratings.csv"
    path.write_text("prompt,response,score\nName a prime.,Seven.,4\nName another.,Nine.,high\n")
    row = _stats(capsys, str(path))
    assert row["records"] == 1 and row["excluded_by_reason"] == {"bad row: field 'score': is not a number": 1}
    assert f"{path}:2: field 'score': is not a number: 'high'" in row["notes"]


def test_a_table_input_rejects_rows_by_number(tmp_path):
    judge_dir = make_judge(testing.tiny_bert(tmp_path / "bert"), tmp_path / "judge", "cls3")
    rows = [{"prompt": "Name a prime.", "chosen": "7", "rejected": "9"},
            {"prompt": " ", "chosen": "a", "rejected": "x"}]
    spec = _write_parquet(rows, tmp_path / "p.parquet")
    out = tmp_path / "out.jsonl"
    assert main(["score", str(judge_dir), "--input", str(spec), "--output", str(out)]) == 1
    assert json.loads(out.read_text())["id"] == "p.parquet:1"
    rejected = json.loads((tmp_path / "out.jsonl.rejected.jsonl").read_text())
    assert (rejected["line"], rejected["field"]) == (2, "prompt")


@pytest.mark.parametrize("argv", [["audit", "baseline:longer", "--sets", "pandalm-tset"],
                                  ["data", "stats", "--source", "pandalm-tset"]])
def test_an_unknown_name_is_an_error_listing_the_known_ones(tmp_path, capsys, argv):
    assert main([*argv, *(["--out", str(tmp_path / "a")] if argv[0] == "audit" else [])]) == 2
    err = capsys.readouterr().err
    assert "'pandalm-tset'" in err and "pandalm-test" in err and "llmbar-natural" in err
    assert not (tmp_path / "a").exists()


def test_a_missing_file_and_an_unknown_format_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        sources.resolve(str(tmp_path / "nope.jsonl"))
    path = _write_jsonl([{"text": "a", "colour": "red"}], tmp_path / "odd.jsonl")
    with pytest.raises(RecordError, match=r"no known format has the columns \['colour', 'text'\]"):
        sources.resolve(str(path))
    with pytest.raises(RecordError, match=r"format 'pairwise' needs the columns"):
        sources.resolve(str(path), ReadOptions.make(format="pairwise"))
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['questoin'\]; the fields .*question"):
        ReadOptions.make(columns="questoin=q")
    mapped = _write_jsonl([{"q": "Name a prime.", "x": "7", "y": "9", "pick": "a"}], tmp_path / "m.jsonl")
    record = sources.load(str(mapped), options=ReadOptions.make(columns="question=q,answer_a=x,answer_b=y,winner=pick")
                          ).records[0]
    assert (record.question, record.answer_a, record.verdict) == ("Name a prime.", "7", Verdict.A)


# -- the formats' rules ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("winner, verdict", [("A", Verdict.A), ("model_a", Verdict.A), ("1", Verdict.A),
                                             (1, Verdict.A), ("b", Verdict.B), ("model_b", Verdict.B), (2, Verdict.B),
                                             ("tie", Verdict.TIE), ("tie (bothbad)", Verdict.TIE),
                                             ("TIE", Verdict.TIE)])
def test_winner_spellings(winner, verdict):
    item = {"question": "q", "answer_a": "a", "answer_b": "b", "winner": winner}
    assert item_record(item, Loc("f", 1), labelled=True).verdict is verdict


@pytest.mark.parametrize("winner, words", [(0, "0 is ambiguous"), ("maybe", "must be A, B or tie"),
                                           (True, "must be A, B or tie")])
def test_a_winner_outside_the_format_is_named(winner, words):
    with pytest.raises(RecordError, match=f"f:3: field 'winner': .*{words}"):
        item_record({"question": "q", "answer_a": "a", "answer_b": "b", "winner": winner}, Loc("f", 3), True)


def test_implicit_prompts_split_as_trl_does():
    from trl.data_utils import extract_prompt

    chosen = [_messages("system", SYSTEM), _messages("user", "Hi?"), _messages("assistant", "Hello."),
              _messages("user", "Name a prime."), _messages("assistant", "7")]
    rejected = chosen[:-1] + [_messages("assistant", "9")]
    split = extract_prompt({"chosen": chosen, "rejected": rejected})
    record = item_record({"chosen": chosen, "rejected": rejected}, Loc("f", 1), True)
    explicit = item_record(split, Loc("f", 1), True)
    assert record == explicit
    assert record.question == f"System: {SYSTEM}\n\nUser: Hi?\n\nAssistant: Hello.\n\nUser: Name a prime."
    assert (record.answer_a, record.answer_b, record.verdict) == ("7", "9", Verdict.A)
    assert record.meta["turns"][-1] == ["user", "Name a prime."]
    dialogue = item_record({"chosen": "\n\nHuman: Hi?\n\nAssistant: Hello there.",
                            "rejected": "\n\nHuman: Hi?\n\nAssistant: Go away."}, Loc("f", 1), True)
    assert (dialogue.question, dialogue.answer_a, dialogue.answer_b) == ("Human: Hi?", "Hello there.", "Go away.")


def test_a_conversation_loses_its_oldest_turns_first_when_cut(tiny_bert_dir):
    """Truncation keeps the last user turn and the answers whole and drops the earliest turns (the system prompt
    after them), and reports it."""
    from clfjudge.models.backbones import load_tokenizer, resolve_backbone
    from clfjudge.prompts.truncation import EARLIER_TURNS, TruncationPolicy, truncate

    tokenizer = load_tokenizer(resolve_backbone(str(tiny_bert_dir)))
    history = [m for i in range(12) for m in (_messages("user", f"old question {i}"),
                                              _messages("assistant", f"old answer {i}"))]
    prompt = [_messages("system", "be brief"), *history, _messages("user", "Name a prime.")]
    record = item_record({"prompt": prompt, "chosen": "7 is prime.", "rejected": "9"}, Loc("f", 1), True)
    cut, info = truncate(record, "encoder-pair", tokenizer, TruncationPolicy(max_length=128))
    assert info.removed[EARLIER_TURNS] > 0 and info.length_after <= 128
    assert cut.question.startswith("System: be brief\n\nUser: old question")  # the system prompt goes last
    assert cut.question.endswith("User: Name a prime.") and "old question 0\n" not in cut.question
    assert "old answer 11" in cut.question  # the latest turns are kept
    assert cut.meta["turns"][-1] == ["user", "Name a prime."]
    assert (cut.answer_a, cut.answer_b) == ("7 is prime.", "9")


def test_data_specs_and_sample_sizes():
    assert sources.parse_source("hf:org/prefs:test:100") == ("hf:org/prefs:test", 100)
    assert sources.parse_source("hf:org/prefs:test") == ("hf:org/prefs:test", None)
    assert sources.parse_source("my/pairs.jsonl:50") == ("my/pairs.jsonl", 50)
    assert sources.parse_source("pandalm-test:5") == ("pandalm-test", 5)
    with pytest.raises(ValueError, match="hf:OWNER/NAME"):
        sources.resolve("hf:not-a-repo")


# -- in the RL loop ------------------------------------------------------------------------------------------------

def test_grpo_trainer_runs_a_step_with_the_judge_as_reward(tmp_path):
    """TRL's GRPOTrainer, one step on a conversational prompt data set, a tiny random policy and a tiny reward
    judge: TRL calls the reward function with whole conversations, and each reward is the judge's score of the
    completion after the flattened conversation (system prompt included)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from clfjudge.serving.reward import reward_function

    judge = Judge.load(make_judge(testing.tiny_bert(tmp_path / "bert"), tmp_path / "judge", "reward"))
    policy = testing.tiny_llama(tmp_path / "llama")
    tokenizer = AutoTokenizer.from_pretrained(policy)
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant:{% endif %}")
    reward, calls = reward_function(judge), []

    def judge_reward(prompts, completions, **columns):
        rewards = reward(prompts=prompts, completions=completions, **columns)
        calls.append((prompts, completions, rewards))
        return rewards

    prompts = [{"prompt": [_messages("system", "Answer in one word."), _messages("user", f"Name prime number {i}.")]}
               for i in range(4)]
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=8, max_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                      logging_steps=1)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(policy), reward_funcs=[judge_reward], args=args,
                          train_dataset=datasets.Dataset.from_list(prompts), processing_class=tokenizer)
    assert trainer.train().global_step == 1
    (got_prompts, completions, rewards), = calls
    assert got_prompts[0][0] == {"role": "system", "content": "Answer in one word."}
    want = [judge.score("System: Answer in one word.\n\nUser: " + p[-1]["content"], c[0]["content"]).value
            for p, c in zip(got_prompts, completions)]
    assert rewards == pytest.approx(want, abs=1e-5)


def test_the_embedding_readers_memory_is_bounded():
    from clfjudge.embedders.cache import MemoryCache

    cache = MemoryCache(3)
    cache.update((str(i), i) for i in range(3))
    assert cache["0"] == 0  # used: the oldest is now "1"
    cache["3"] = 3
    assert list(cache) == ["2", "0", "3"]
    cache.max_items = 1
    assert list(cache) == ["3"]
    with pytest.raises(ValueError, match="positive number"):
        MemoryCache(0)


@needs_data
def test_calibrate_on_a_users_pairwise_file(tiny_bert_dir, tmp_path):
    spec = str(_pairwise_csv(tmp_path / "held-out.csv"))
    judge_dir = make_judge(tiny_bert_dir, tmp_path / "judge", "cls3")
    assert main(["calibrate", str(judge_dir), "--source", f"{spec}:16", "--batch-size", "8"]) == 0
    fitted = JudgeCard.load(judge_dir).calibration["fitted_on"]
    assert fitted["source"] == spec and fitted["n"] == 16 and fitted["data"]["format"] == "pairwise"
    assert fitted["data"]["columns"] == {"answer_a": "response_a", "answer_b": "response_b", "question": "instruction"}


def test_a_bounded_reader_memory_gives_the_same_vectors():
    """An embedder whose memory holds fewer vectors than one call reads still answers that call whole, and keeps
    only its most recent vectors (an RL loop reads new completions at every step)."""
    from clfjudge.embedders.sentence import TextEmbedder

    texts = [f"answer number {i} to the question" for i in range(6)]
    bounded, free = TextEmbedder("minilm"), TextEmbedder("minilm")
    bounded.memory.max_items, free.memory.max_items = 2, None
    assert bounded.embed(texts) == pytest.approx(free.embed(texts), abs=1e-6)
    assert len(bounded) == 2 and len(free) == 6
    assert bounded.embed(texts[:1]) == pytest.approx(free.embed(texts[:1]), abs=1e-6)  # read again when forgotten


def _crash_on_the_second_judge_call(patch: pytest.MonkeyPatch) -> None:
    """The judge fails (not on an input) when it is called for the second chunk."""
    from clfjudge.judges.model import FineTunedJudge

    original, chunks = FineTunedJudge.raw_outputs, []

    def raw_outputs(self, records):
        chunks.append(len(records))
        if len(chunks) == 3:  # the first call is the judge's self-test, before any row is read
            raise RuntimeError("the accelerator fell off the bus")
        return original(self, records)

    patch.setattr(FineTunedJudge, "raw_outputs", raw_outputs)


def test_scoring_a_parquet_file_resumes_after_a_crash(tmp_path, monkeypatch, capsys):
    """A table input is checkpointed by row: a crash leaves a valid prefix and --resume gives an uninterrupted run's
    output; a changed file is refused."""
    judge_dir = make_judge(testing.tiny_bert(tmp_path / "bert"), tmp_path / "judge", "cls3")
    rows = [{"prompt": f"Name prime {i}.", "chosen": f"{i} is prime.", "rejected": "No."} for i in range(7)]
    spec = str(_write_parquet(rows, tmp_path / "in.parquet"))
    out = tmp_path / "out.jsonl"

    def score(target: Path, *extra: str) -> int:
        return main(["score", str(judge_dir), "--input", spec, "--output", str(target), "--chunk-size", "3", *extra])

    assert score(tmp_path / "whole.jsonl") == 0
    for change in (False, True):
        with monkeypatch.context() as patch:
            _crash_on_the_second_judge_call(patch)
            assert score(out) == 3  # the judge failed mid-run: exit 3, the checkpoint kept
        assert "fell off" in capsys.readouterr().err
        assert json.loads((tmp_path / "out.jsonl.progress.json").read_text())["line"] == 3
        if change:
            _write_parquet([{**rows[0], "chosen": "changed"}, *rows[1:]], tmp_path / "in.parquet")
        capsys.readouterr()
        assert score(out, "--resume") == (2 if change else 0)
        if not change:
            assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    assert "the first 3 rows" in capsys.readouterr().err


def test_score_reads_renamed_columns(tmp_path):
    judge_dir = make_judge(testing.tiny_bert(tmp_path / "bert"), tmp_path / "judge", "cls3")
    src = _write_jsonl([{"q": "Name a prime.", "x": "7", "y": "9"}], tmp_path / "odd.jsonl")
    out = tmp_path / "out.jsonl"
    argv = ["score", str(judge_dir), "--input", str(src), "--output", str(out)]
    assert main(argv) == 1  # no known format: the line is rejected, saying how to map it
    assert "--columns" in (tmp_path / "out.jsonl.rejected.jsonl").read_text()
    assert main([*argv, "--columns", "question=q,answer_a=x,answer_b=y"]) == 0
    got = json.loads(out.read_text())
    want = Judge.load(judge_dir).compare("Name a prime.", "7", "9")
    assert got["p_a"] == pytest.approx(want.p_a, abs=1e-6)


@needs_data
def test_the_prometheus_grid_recipe_reads_the_feedback_collection_offline(tmp_path, monkeypatch):
    """The grid recipe names Prometheus' training set on the hub; its rows (orig_* fields, written here from the
    Prometheus Vicuna-bench records) are read as the built-in Feedback Bench loader reads them. The hub is replaced
    by the local file: ``hf:OWNER/NAME`` goes through ``datasets.load_dataset(NAME, split=...)`` and nothing else."""
    from clfjudge.paths import REPO_ROOT
    from clfjudge.training.config import TrainConfig

    points = sources.load("prometheus-vicuna").records[:N]
    rows = [{"orig_instruction": p.question, "orig_response": p.answer, "orig_reference_answer": p.reference,
             "orig_criteria": p.meta["criteria"],
             **{f"orig_score{k}_description": d for k, d in enumerate(p.meta["score_descriptions"], 1)},
             "orig_score": round(p.score), "orig_feedback": "feedback", "instruction": "prompt", "output": "out"}
            for p in points]
    local = datasets.Dataset.from_list(rows)
    calls = []

    def hub(name, split=None, **kw):
        calls.append((name, split))
        return local

    monkeypatch.setattr(datasets, "load_dataset", hub)
    for recipe in ("prometheus-deberta-cls", "prometheus-vicuna-cls"):
        cfg = TrainConfig.from_yaml(REPO_ROOT / "train" / "grid" / f"{recipe}.yaml")
        assert cfg.sources == ["hf:prometheus-eval/Feedback-Collection"]
    source = sources.resolve(cfg.sources[0])
    assert (source.arity, source.format.name) == ("point", "feedback-collection")
    records = source.load().records
    assert calls[0] == ("prometheus-eval/Feedback-Collection", "train")
    assert [(r.question, r.answer, r.reference, r.rubric) for r in records] == \
        [(p.question, p.answer, p.reference, p.rubric) for p in points]
    assert [r.score for r in records] == [round(p.score) for p in points]
    assert source.describe()["sha256"].startswith("fingerprint:")


def test_a_zero_based_winner_coding_is_refused_for_the_whole_file(tmp_path):
    """Auto-J's coding (0 = first answer, 1 = second, 2 = tie) would have its 1s and 2s read as A and B: a file whose
    winner column holds a 0 is refused, naming the column, before any row is guessed."""
    rows = [{"prompt": "q", "response 1": "a", "response 2": "b", "label": label} for label in (0, 1, 2, 1)]
    path = _write_jsonl(rows, tmp_path / "autoj.jsonl")
    with pytest.raises(RecordError, match=r"autoj.jsonl:\?: field 'label': holds 0 in 1 row\(s\): a 0-based"):
        sources.resolve(str(path))
