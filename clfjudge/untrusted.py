"""Reading a model directory as untrusted input: a judge or a model someone else wrote must not run code, read
files outside its directory or exhaust memory. ``read_json`` (size and nesting limits, errors naming the file and
line), ``inside`` (a file name a directory's configuration gives stays in that directory) and
``check_onnx_external_data`` (an ONNX file's external tensors live beside it)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .data.records import RecordError

# A judge card, a config.json or a tokenizer_config.json is kilobytes (a tokenizer config with every added
# token of a large vocabulary: a few MB); one past this is refused before it is parsed.
MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_JSON_DEPTH = 64


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def read_json(path: str | Path, what: str = "configuration file", max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON file that a model directory holds (``what``: the kind of file, for errors), refused (``RecordError``
    naming the file) when it is larger than ``max_bytes``, nested deeper than ``max_depth`` or not JSON."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise RecordError(str(path), None, None, f"is {size} bytes, more than the {max_bytes} a {what} may "
                                                 "have: refused")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RecordError(str(path), exc.lineno, None, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # undecodable bytes, absurd nesting or numbers
        raise RecordError(str(path), None, None, f"not a readable {what}: {exc}") from None
    if _depth(data) > max_depth:
        raise RecordError(str(path), None, None, f"is nested deeper than {max_depth} levels: refused")
    return data


def inside(directory: str | Path, name: str, where: str) -> Path:
    """``directory / name`` where ``name`` (a file a configuration names; ``where`` says which file and field) is a
    relative path that stays inside ``directory`` (links followed); anything else is refused."""
    root = Path(directory).resolve()
    if not isinstance(name, str) or not name or Path(name).is_absolute():
        raise ValueError(f"{where}: {name!r} is not a file name inside {root}: refused")
    path = (root / name).resolve()
    if path != root and root not in path.parents:
        raise ValueError(f"{where}: {name!r} points outside {root}: refused")
    return path


def check_onnx_external_data(path: str | Path) -> None:
    """Refuse an ONNX file whose external-data tensors name a location outside its own directory (onnxruntime
    would read any file the process can)."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            inside(path.parent, ExternalDataInfo(tensor).location, f"{path}: tensor {tensor.name!r} external data")
