"""Property-based fuzzing of everything that reads untrusted input: the JSONL / JSON / CSV readers, every source
loader (hypothesis-mutated files in the source's own format), the scheme templates and their rendering, the
truncation policy, the released-judge parsers and the HTTP server. Each either gives its result or raises its
documented error (``RecordError``, ``RenderError``, ``TruncationError`` / ``ValueError``), never anything else.

Example counts are modest so the set runs in seconds; a failure prints the smallest input hypothesis found.
"""
from __future__ import annotations

import copy
import csv
import gzip
import io
import json
import math
import shutil
import tempfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient
from test_sources import MALFORMED, build_fixture_root
from tiny_judges import make_judge

from clfjudge.data.readers import iter_csv, iter_json_array, iter_json_dict, iter_jsonl
from clfjudge.data.records import PairRecord, PointRecord, RecordError, Verdict
from clfjudge.data.sources import SOURCES
from clfjudge.judges.base import Judge
from clfjudge.prompts.parsers import PARSERS
from clfjudge.prompts.schemes import SCHEMES, TEMPLATES_DIR, RenderError, load_schemes, render, target
from clfjudge.prompts.truncation import TruncationError, TruncationPolicy, allocate, truncate
from clfjudge.serving.server import Limits, create_app

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.data_too_large])

# -- what hostile input is made of ------------------------------------------------------------------------

SPECIAL = ["", " ", "\n", "\r\n", "\t", "\x00", "\x1b[31m", "\ud800", "\udfff", "\ufeff", "\u2028", "\x85",
           "{question}", "{answer_a}", "{prompt}", "{}", "[SEP]", "</s>", "[RESULT]", "Rating: [[", "\\", '"',
           "🙂", "e\u0301", "東京", "\u202e"]
chars = st.one_of(st.characters(), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
                  st.characters(max_codepoint=0x1F))
small_text = st.one_of(st.text(chars, max_size=12), st.sampled_from(SPECIAL))
# huge fields: beyond the server's text limit, csv's default cell limit, any model's context
huge_text = st.builds(lambda piece, n: piece * n, st.sampled_from(["a", "é ", "🙂", "x\n", "{", "\x00"]),
                      st.integers(2_000, 40_000))
texts = st.one_of(small_text, small_text, small_text, huge_text)
numbers = st.one_of(st.integers(), st.integers(10**300, 10**400), st.floats(), st.sampled_from([0, 1, 2, 1.5]))
plain_text = st.text(max_size=40)  # any Unicode but surrogates, control characters included
json_values = st.recursive(st.none() | st.booleans() | numbers | texts,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(small_text, inner, max_size=3),
                           max_leaves=6)
# a field's value: mostly what a well-meaning writer would put there, sometimes anything
field_value = st.integers(0, 19).flatmap(
    lambda k: plain_text if k < 14 else [small_text, huge_text, json_values][k % 3])


def no_surrogates(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


@st.composite
def damaged(draw, data: bytes) -> bytes:
    """``data`` cut short, with bytes inserted, or with bytes flipped (or untouched)."""
    kind = draw(st.sampled_from(["none", "none", "none", "cut", "insert", "flip"]))
    if kind == "none" or not data:
        return data
    at = draw(st.integers(0, len(data) - 1))
    if kind == "cut":
        return data[:at]
    if kind == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]


def check_records(name: str, records) -> None:
    """What a successful load promises: validated records of the source, unique ids, text that is Unicode."""
    assert len({r.id for r in records}) == len(records)
    for r in records:
        assert isinstance(r, (PairRecord, PointRecord)) and r.source == name
        names = ("question", "answer_a", "answer_b") if isinstance(r, PairRecord) else ("question", "answer")
        for f in (*names, "rubric", "reference"):
            value = getattr(r, f)
            assert value is None or (isinstance(value, str) and value.encode("utf-8") is not None)
        assert r.question.strip()
        if isinstance(r, PairRecord):
            assert isinstance(r.verdict, Verdict)
        else:
            assert math.isfinite(r.score) and r.scale[0] <= r.score <= r.scale[1]


# -- readers ----------------------------------------------------------------------------------------------

line_strategy = st.one_of(
    json_values.map(json.dumps),  # valid JSON (lone surrogates as \ud800 escapes)
    st.text(chars, max_size=30),  # anything, written with surrogatepass (invalid UTF-8)
    st.sampled_from(["", "  ", "[" * 5000, "{" * 3 + "]", "1" * 5000, "NaN", '"\\ud800"', '{"a": 1}}']),
)


@FUZZ
@given(lines=st.lists(line_strategy, max_size=8), draw=st.data(), compress=st.booleans())
def test_readers_yield_or_raise_a_located_record_error(lines, draw, compress):
    data = draw.draw(damaged("\n".join(lines).encode("utf-8", "surrogatepass")))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("data.jsonl.gz" if compress else "data.jsonl")
        path.write_bytes(gzip.compress(data) if compress else data)
        for reader in (iter_jsonl, iter_json_array, iter_json_dict, iter_csv):
            try:
                items = list(reader(path))
            except RecordError as err:
                assert err.file == str(path)
                continue
            if reader is iter_jsonl:  # nothing skipped but blank lines, every line where it was
                text = data.decode("utf-8")
                assert [n for n, _ in items] == [i for i, t in enumerate(text.split("\n"), 1) if t.strip()]


# -- every source loader, on its own format --------------------------------------------------------------

@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory) -> Path:
    return build_fixture_root(tmp_path_factory.mktemp("fuzz-fixtures") / "data")


def _rows(path: Path, fmt: str) -> list:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if fmt == "csv":
        return [row for _, row in iter_csv(path)]
    if fmt == "json":
        return [obj for _, obj in iter_json_array(path)]
    return [obj for _, obj in iter_jsonl(path)]


@st.composite
def mutated(draw, rows: list, cells_are_text: bool) -> list:
    """``rows`` with a few fields deleted, added or given hostile values (text only in CSV), a row replaced by a
    non-object, or a row repeated."""
    rows = copy.deepcopy(rows)
    value = field_value.filter(lambda v: isinstance(v, str)) if cells_are_text else field_value
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(rows) - 1))
        action = draw(st.sampled_from(["set", "set", "set", "delete", "add", "replace-row", "repeat-row"]))
        if action == "replace-row" and not cells_are_text:
            rows[i] = draw(json_values)
        elif action == "repeat-row":
            rows.insert(i, copy.deepcopy(rows[i]))
        elif isinstance(rows[i], dict) and rows[i]:
            key = draw(st.sampled_from(sorted(rows[i]))) if action != "add" else draw(small_text)
            if action == "delete" and not cells_are_text:
                del rows[i][key]
            else:
                rows[i][key] = draw(value)
    return rows


def _serialize(rows: list, fmt: str, draw) -> bytes:
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator=draw(st.sampled_from(["\n", "\r\n"])))
        header = list(rows[0])
        writer.writerow(header)
        writer.writerows([[row.get(c, "") for c in header] for row in rows])
        return buffer.getvalue().encode("utf-8", "surrogatepass")
    ascii_only = draw(st.booleans())
    if fmt == "json":
        text = json.dumps(rows, ensure_ascii=ascii_only, indent=draw(st.sampled_from([None, 1])))
    else:
        text = "".join(json.dumps(row, ensure_ascii=ascii_only) + "\n" for row in rows)
    return text.encode("utf-8", "surrogatepass")


def _pack(data: bytes, fmt: str, member: str) -> bytes:
    if fmt == "jsonl.gz":
        return gzip.compress(data)
    if fmt == "zip":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr(member, data)
        return buffer.getvalue()
    return data


FUZZED_SOURCES = list(MALFORMED)  # one per format, from the malformed-input suite


def test_every_source_loader_is_fuzzed():
    def key(loader):
        return loader.__module__, loader.__qualname__

    assert {key(SOURCES.get(n).loader) for n in SOURCES.names()} == \
        {key(SOURCES.get(spec.source).loader) for spec in FUZZED_SOURCES}


@pytest.mark.parametrize("spec", FUZZED_SOURCES, ids=lambda spec: spec.source)
@FUZZ
@given(data=st.data())
def test_source_loaders_load_or_raise_record_error(spec, fixture_root, data):
    source = SOURCES.get(spec.source)
    # parquet is pyarrow's to parse; the loader's JSONL path takes the same rows as JSON
    parquet = spec.fmt == "parquet"
    fmt, file = ("jsonl", Path(spec.file).with_name("human-fuzz.jsonl")) if parquet else (spec.fmt, Path(spec.file))
    rows = _rows(fixture_root / spec.file, spec.fmt)
    new_rows = data.draw(mutated(rows, cells_are_text=fmt == "csv"))
    raw = _serialize(new_rows, fmt, data.draw)
    inner_damage = data.draw(st.booleans())  # damage the text inside an archive, or the archive itself
    packed = _pack(data.draw(damaged(raw)) if inner_damage else raw, fmt, file.name.removesuffix(".zip"))
    packed = packed if inner_damage else data.draw(damaged(packed))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        if source.path(fixture_root).is_dir():
            shutil.copytree(source.path(fixture_root), source.path(root))
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_bytes(packed)
        try:
            result = source.load(root / file if parquet else source.path(root))
        except RecordError as err:
            assert err.file and str(root) in err.file and err.message
            event("RecordError")
            return
        event("loaded")
        check_records(spec.source, result.records)
        assert all(isinstance(k, str) and v > 0 for k, v in result.excluded.items())


# -- scheme templates: rendering and loading ----------------------------------------------------------------

optional_text = st.none() | small_text
scores = st.none() | st.tuples(numbers, numbers).filter(lambda t: all(isinstance(x, (int, float)) for x in t))


@st.composite
def records(draw, arity: str):
    """Records built directly (as a caller of the library may), so their text is not validated."""
    common = dict(id=draw(small_text), question=draw(texts), rubric=draw(optional_text), reference=draw(optional_text))
    if arity == "pair":
        return PairRecord(answer_a=draw(texts), answer_b=draw(texts), scores=draw(scores),
                          verdict=draw(st.none() | st.sampled_from(Verdict)), **common)
    return PointRecord(answer=draw(texts), score=draw(st.none() | st.floats()),
                       scale=draw(st.sampled_from([(1.0, 5.0), (1.0, 10.0), (0.0, 1.0)])), **common)


@pytest.mark.parametrize("name", SCHEMES.names())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), use_reference=st.booleans())
def test_schemes_render_values_verbatim_or_raise_render_error(name, data, use_reference):
    scheme = SCHEMES.get(name)
    record, other = data.draw(records(scheme.arity)), data.draw(records("point" if scheme.arity == "pair" else "pair"))
    with pytest.raises(RenderError):
        render(other, scheme)  # a record of the other arity
    try:
        text = render(record, scheme, use_reference=use_reference)
    except RenderError:
        event("RenderError")
        return
    event("rendered")
    for f in scheme.fields:  # one-pass filling: a value holding "{answer_a}" is shown as written
        value = getattr(record, f)
        if value is not None and not (f == "reference" and not use_reference):
            assert value in text
    if scheme.target is not None:
        try:
            written = target(record, scheme)
        except RenderError:
            event("target: RenderError")
            return
        event("target written")
        assert PARSERS.get(scheme.parser)(written).ok


@st.composite
def damaged_template_text(draw) -> str:
    """One of the real templates files, cut, spliced or with a value swapped for a hostile YAML value."""
    text = draw(st.sampled_from(sorted(TEMPLATES_DIR.glob("*.yaml")))).read_text(encoding="utf-8")
    lines = text.split("\n")
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["drop", "repeat", "value", "indent", "cut"]))
        if action == "drop":
            del lines[i]
        elif action == "repeat":
            lines.insert(i, lines[i])
        elif action == "indent":
            lines[i] = " " * draw(st.integers(1, 4)) + lines[i]
        elif action == "cut":
            lines = lines[:i]
            break
        elif ":" in lines[i]:
            key = lines[i].split(":", 1)[0]
            hostile = draw(st.sampled_from(["[]", "{}", "null", "3", "[1, 2]", "{a: 1}", "true", "'{x}'", "&a x",
                                            "*a", "!!python/object:os.system ls", "- x", "'{question}'"]))
            lines[i] = f"{key}: {hostile}"
        if not lines:
            break
    return "\n".join(lines)


@FUZZ
@given(text=damaged_template_text())
def test_damaged_templates_files_load_or_raise_record_error(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "templates.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            schemes = load_schemes(path)
        except RecordError as err:
            assert err.file == str(path)
            return
        for s in schemes:
            assert s.arity in ("pair", "point") and isinstance(s.template, str)


@FUZZ
@given(data=json_values)
def test_templates_files_of_any_structure_load_or_raise_record_error(data):
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.yaml"
        try:
            path.write_text(yaml.safe_dump({"schemes": {"s": data}} if isinstance(data, dict) else data),
                            encoding="utf-8")
        except (yaml.YAMLError, UnicodeEncodeError):
            assume(False)
        try:
            load_schemes(path)
        except RecordError as err:
            assert err.file == str(path)


# -- truncation ---------------------------------------------------------------------------------------------

@FUZZ
@given(max_length=json_values, budgets=st.one_of(json_values, st.dictionaries(st.sampled_from(
    ["question", "answer", "rubric", "reference", "other"]), json_values, max_size=3)), head_fraction=json_values)
def test_truncation_policy_is_valid_or_raises_value_error(max_length, budgets, head_fraction):
    try:
        policy = TruncationPolicy(max_length=max_length, budgets=budgets, head_fraction=head_fraction)
    except ValueError:
        return
    assert isinstance(policy.max_length, int) and policy.max_length >= 1 and 0 < policy.head_fraction < 1
    assert all(isinstance(v, (int, float)) and v >= 1 for v in policy.budgets.values())


@FUZZ
@given(lengths=st.dictionaries(st.sampled_from(["question", "answer_a", "answer_b", "rubric"]),
                               st.integers(0, 5000), min_size=1),
       budgets=st.integers(0, 3000), space=st.integers(-5, 3000), floor=st.integers(0, 10))
def test_allocate_fits_the_space_or_raises(lengths, budgets, space, floor):
    try:
        alloc = allocate(lengths, {f: budgets for f in lengths}, space, floor)
    except TruncationError:
        assert sum(min(n, floor) for n in lengths.values()) > space
        return
    assert set(alloc) == set(lengths)
    assert sum(alloc.values()) <= max(space, sum(lengths.values()) if sum(lengths.values()) <= space else space)
    assert all(min(lengths[f], floor) <= alloc[f] <= lengths[f] for f in lengths)


@pytest.fixture(scope="module")
def bert_tokenizer(tiny_bert_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bert_dir)


@FUZZ
@given(data=st.data(), scheme=st.sampled_from(SCHEMES.names()), max_length=st.integers(8, 600),
       head_fraction=st.floats(0.05, 0.95), budget=st.none() | st.integers(1, 64))
def test_truncate_fits_max_length_or_raises_truncation_error(bert_tokenizer, data, scheme, max_length, head_fraction,
                                                            budget):
    arity = SCHEMES.get(scheme).arity
    record = data.draw(records(arity))
    names = ("question", "rubric", "reference", *(("answer_a", "answer_b") if arity == "pair" else ("answer",)))
    # records are Unicode text (loaders and the runtime refuse anything else)
    record = replace(record, **{f: no_surrogates(getattr(record, f)) for f in names if getattr(record, f) is not None})
    policy = TruncationPolicy(max_length=max_length, budgets={"answer": budget} if budget else {},
                              head_fraction=head_fraction)
    try:
        cut, info = truncate(record, scheme, bert_tokenizer, policy)
    except TruncationError:
        event("TruncationError")
        return
    except RenderError:
        event("RenderError")
        return  # the scheme needs a field this record lacks
    event("cut" if info.truncated else "fits")
    n = len(bert_tokenizer(render(cut, scheme), verbose=False)["input_ids"])
    assert n <= max_length and info.length_after == n
    for f in SCHEMES.get(scheme).fields:
        before, after = getattr(record, f), getattr(cut, f)
        assert (before is None) == (after is None)
        if before is not None and bert_tokenizer(before, add_special_tokens=False)["input_ids"]:
            assert bert_tokenizer(after, add_special_tokens=False)["input_ids"]  # cut, never dropped
    if info.length_before <= max_length:
        assert cut == record


# -- released-judge parsers --------------------------------------------------------------------------------

PARSER_HINTS = ["1", "2", "Tie", "[RESULT] ", "Rating: [[", "]]", "final decision is Response 1", "A", "B", " ", "\n",
                "1e309", "nan", "-0", "٣", "1_0", "10", "5", ","]


@pytest.mark.parametrize("name", PARSERS.names())
@settings(max_examples=80, deadline=None)
@given(text=st.lists(st.one_of(st.sampled_from(PARSER_HINTS), st.text(chars, max_size=6)), max_size=8).map("".join),
       study_fallback=st.booleans())
def test_parsers_parse_or_fail_cleanly(name, text, study_fallback):
    parser = PARSERS.get(name)
    parsed = parser(text, study_fallback=study_fallback)
    event("ok" if parsed.ok else "failed")
    assert parsed.raw == text
    if parsed.ok:
        assert not parsed.fallback and parsed.reason is None
        if parser.arity == "pair":
            assert isinstance(parsed.value, Verdict)
        else:
            assert isinstance(parsed.value, float) and math.isfinite(parsed.value)
    elif parsed.fallback:
        assert study_fallback and parser.study_default is not None and parsed.reason
    else:
        assert parsed.value is None and parsed.reason


# -- the HTTP server ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_client(tiny_bert_dir, tmp_path_factory):
    """A reward judge: it serves both /compare and /score."""
    judge = Judge.load(make_judge(tiny_bert_dir, tmp_path_factory.mktemp("fuzz-judge"), "reward"))
    with TestClient(create_app(judge, Limits(max_text_chars=5000, max_items=8)), raise_server_exceptions=False) as c:
        yield c


ITEM_FIELDS = {"/compare": ("question", "answer_a", "answer_b"), "/score": ("question", "answer")}


def items(path: str, extra: bool = False):
    return st.fixed_dictionaries({name: field_value for name in ITEM_FIELDS[path]},
                                 optional={"rubric": st.none() | field_value, "reference": st.none() | field_value,
                                           "id": json_values, **({"extra": json_values} if extra else {})})


def bodies(path: str):
    return st.one_of(items(path), items(path), items(path, extra=True),
                     st.fixed_dictionaries({"items": st.lists(items(path), max_size=4)},
                                           optional={"symmetric": st.booleans()}),
                     st.fixed_dictionaries({"items": st.lists(items(path, extra=True) | json_values, max_size=4)},
                                           optional={"symmetric": json_values, "extra": json_values}),
                     json_values)


def _answer_is_json_and_not_5xx(got) -> None:
    event(f"status {got.status_code}")
    assert got.status_code < 500, got.text
    payload = got.json()
    assert isinstance(payload, dict) and (got.status_code == 200 or isinstance(payload["error"], str))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/compare", "/score"]), data=st.data())
def test_server_answers_any_json_body_without_5xx(fuzz_client, path, data):
    content = json.dumps(data.draw(bodies(path))).encode()  # lone surrogates as \ud800 escapes
    if data.draw(st.integers(0, 3)) == 0:
        content = data.draw(damaged(content))
    _answer_is_json_and_not_5xx(fuzz_client.post(path, content=content))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=300), path=st.sampled_from(["/compare", "/score", "/healthz", "/nowhere"]))
def test_server_answers_any_bytes_without_5xx(fuzz_client, content, path):
    _answer_is_json_and_not_5xx(fuzz_client.post(path, content=content))


# -- what the fuzzing found, pinned -------------------------------------------------------------------------

@pytest.mark.parametrize("spec, field, value, words", [
    ("pandalm-test", "annotator1", False, "must be one of 0, 1, 2; got False"),  # JSON false is not vote 0
    ("judgelm-val", "score", [10**400, 1], "must be a pair of numbers"),  # int beyond float range
    ("judgelm-val", "question_id", [1], "must be a string or an integer"),  # unhashable id
    ("prometheus-mtbench", "gpt4_score", [10**400, 3], "must be a non-empty list of numbers"),
    ("alpacaeval-gpt4", "preference", 10**400, "is not a finite number"),
])
def test_found_by_fuzzing_source_values(fixture_root, tmp_path, spec, field, value, words):
    entry = next(m for m in MALFORMED if m.source == spec)
    file = entry.bad_file if field in ("score",) and entry.bad_file else entry.file
    root = tmp_path / "data"
    shutil.copytree(fixture_root, root)
    rows = _rows(root / file, entry.fmt)
    rows[0][field] = value
    text = json.dumps(rows) if entry.fmt == "json" else "".join(json.dumps(r) + "\n" for r in rows)
    (root / file).write_text(text, encoding="utf-8")
    source = SOURCES.get(spec)
    with pytest.raises(RecordError, match=words) as err:
        source.load(source.path(root))
    assert err.value.field == field


@pytest.mark.parametrize("text", ["null", "- a\n- b", "schemes:\n  s:\n    kind: [pair]\n",
                                  "schemes:\n  s:\n    kind: pair\n    params: [a]\n    template: '{question}'\n",
                                  "schemes:\n  [a, b]: {}\n", "schemes:\n  1: {kind: pair}\n"])
def test_found_by_fuzzing_templates(tmp_path, text):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(RecordError) as err:
        load_schemes(path)
    assert err.value.file == str(path)


@pytest.mark.parametrize("kwargs", [{"max_length": None}, {"max_length": "512"}, {"max_length": float("nan")},
                                    {"budgets": {"question": "64"}}, {"budgets": [1]}, {"head_fraction": None}])
def test_found_by_fuzzing_truncation_policy(kwargs):
    with pytest.raises(ValueError, match="TruncationPolicy"):
        TruncationPolicy(**kwargs)
    assert TruncationPolicy(max_length=10**400).max_length == 10**400  # huge is valid (an int beyond float range)
