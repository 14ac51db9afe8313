"""Readers: every record and every error carries the line it starts on."""
from __future__ import annotations

import gzip
import io
import json
import zipfile

import pytest

from clfjudge.data.readers import iter_csv, iter_json_array, iter_json_dict, iter_jsonl, location
from clfjudge.data.records import RecordError


def test_jsonl_lines_skip_blanks_and_report_bad_json(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": \n', encoding="utf-8")
    items = iter_jsonl(path)
    assert next(items) == (1, {"a": 1})
    assert next(items) == (3, {"a": 2})
    with pytest.raises(RecordError) as err:
        next(items)
    assert (err.value.file, err.value.line, err.value.field) == (str(path), 4, None)
    assert "invalid JSON" in str(err.value)


def test_jsonl_lines_are_newline_separated_only(tmp_path):
    path = tmp_path / "u.jsonl"
    path.write_text('{"a": "x\u2028y\x85z"}\r\n{"a": 2}\n', encoding="utf-8")
    assert list(iter_jsonl(path)) == [(1, {"a": "x\u2028y\x85z"}), (2, {"a": 2})]


def test_jsonl_gzip_and_zip_member(tmp_path):
    rows = [{"q": "x"}, {"q": "y"}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    assert [obj for _, obj in iter_jsonl(gz)] == rows
    archive = tmp_path / "t.json.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("t.json", text + "{broken\n")
        z.writestr("__MACOSX/._t.json", b"\0")
    items = iter_jsonl(archive)  # the only data member is found without naming it
    assert [next(items)[1], next(items)[1]] == rows
    with pytest.raises(RecordError) as err:
        next(items)
    assert (err.value.file, err.value.line) == (location(archive, "t.json"), 3)


def test_json_array_lines_of_multiline_elements(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[\n  {\n    "a": "x\\ny"\n  },\n  {"a": 2},\n\n  {\n    "a": 3\n  }\n]\n', encoding="utf-8")
    assert list(iter_json_array(path)) == [(2, {"a": "x\ny"}), (5, {"a": 2}), (7, {"a": 3})]


@pytest.mark.parametrize("text, line, message", [
    ('[\n {"a": 1},\n {"a": }\n]', 3, "invalid JSON"),
    ('[\n {"a": 1}\n {"a": 2}\n]', 3, "expected ','"),
    ('[\n {"a": 1},\n', 3, "invalid JSON"),
    ('{"a": 1}', 1, "top-level JSON list"),
    ('[{"a": 1}] x', 1, "extra data"),
])
def test_json_array_errors_are_located(tmp_path, text, line, message):
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecordError) as err:
        list(iter_json_array(path))
    assert err.value.line == line and message in str(err.value)


def test_json_dict_of_records(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('{\n "k1": {"a": 1},\n "k2":\n  {"a": 2}\n}\n', encoding="utf-8")
    assert list(iter_json_dict(path)) == [(2, "k1", {"a": 1}), (3, "k2", {"a": 2})]
    path.write_text('{\n "k1": {"a": 1},\n "k2" {"a": 2}\n}\n', encoding="utf-8")
    with pytest.raises(RecordError) as err:
        list(iter_json_dict(path))
    assert err.value.line == 3


def test_csv_rows_report_their_first_line(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text('id,text\n1,"two\nlines"\n\n2,plain\n3,"x",extra\n', encoding="utf-8")
    rows = iter_csv(path)
    assert next(rows) == (2, {"id": "1", "text": "two\nlines"})
    assert next(rows) == (5, {"id": "2", "text": "plain"})
    with pytest.raises(RecordError) as err:
        next(rows)
    assert err.value.line == 6 and "3 cells" in str(err.value)


def test_csv_cells_beyond_the_default_size_limit(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("id,text\n1," + "x" * 300_000 + "\n", encoding="utf-8")
    assert len(next(iter_csv(path))[1]["text"]) == 300_000


def test_invalid_utf8_is_located(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "\xff"}\n')
    with pytest.raises(RecordError) as err:
        list(iter_jsonl(path))
    assert err.value.line == 2 and "UTF-8" in str(err.value)


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000, "nested too deeply"),
    ("[" + "1" * 5000 + "]", "Exceeds the limit"),  # an int beyond Python's int-string limit (a ValueError)
])
def test_json_the_parser_refuses_is_a_located_error(tmp_path, text, message):
    """Nesting beyond the recursion limit and huge integers are not JSONDecodeErrors; they are still bad lines."""
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n' + text + "\n", encoding="utf-8")
    with pytest.raises(RecordError) as err:
        list(iter_jsonl(path))
    assert err.value.line == 2 and message in str(err.value)
    array = tmp_path / "a.json"
    array.write_text('[{"a": 1}, ' + text + "]", encoding="utf-8")
    with pytest.raises(RecordError) as err:
        list(iter_json_array(array))
    assert (err.value.line, err.value.index) == (1, 1) and "record 1" in str(err.value)


def test_json_array_errors_name_the_record_index(tmp_path):
    """A minified array is all on line 1: the element's index says which one is broken."""
    path = tmp_path / "min.json"
    path.write_text('[{"a": 1},{"a": 2},{"a": tru}]', encoding="utf-8")
    with pytest.raises(RecordError) as err:
        list(iter_json_array(path))
    assert str(err.value).startswith(f"{path}:1: record 2: invalid JSON")


@pytest.mark.parametrize("suffix", [".gz", ".zip"])
def test_damaged_archives_name_their_file(tmp_path, suffix):
    text = "".join(json.dumps({"q": str(i ** 7)}) + "\n" for i in range(300)).encode()
    path = tmp_path / f"t.jsonl{suffix}"
    if suffix == ".gz":
        data = gzip.compress(text)
    else:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("t.jsonl", text)
        data = buffer.getvalue()
    for damaged in (data[: len(data) // 2], data[:200] + bytes(b ^ 0xFF for b in data[200:220]) + data[220:]):
        path.write_bytes(damaged)
        with pytest.raises(RecordError) as err:
            list(iter_jsonl(path))
        assert err.value.file.startswith(str(path)) and "not a valid" in str(err.value)
