"""Reading a model directory as untrusted input: a judge or a model someone else wrote must not run code, read
files outside its directory or exhaust memory. One rule, ``inside``: a file is opened only where it resolves inside
its directory, links followed (a Hugging Face cache snapshot's files are links into its repository's blob store:
there too). ``read_json``: size and nesting limits, errors naming the file and line. ``check_directory`` applies
both to every file of a directory before anything in it is loaded (``judges.base.open_card`` and
``judges.foreign.describe``, which every loader, exporter and the server go through: the libraries that read the
files, transformers, tokenizers, onnxruntime, follow links), and ``check_onnx_external_data`` to the tensors an
ONNX file names."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .data.records import RecordError

# A judge card, a config.json or a tokenizer_config.json is kilobytes (a tokenizer config with every added
# token of a large vocabulary: a few MB); one past this is refused before it is parsed.
MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_JSON_DEPTH = 64
# tokenizer.json holds a vocabulary and its merges: Llama 3's is 9 MB, Gemma 3's 33 MB.
MAX_JSON_BYTES_OF = {"tokenizer.json": 64 * 1024 * 1024}
# Fields of a model's configuration files that name other files (transformers opens them), and of an index the
# shards of its weights.
FILE_FIELDS = ("vocab_file", "merges_file", "tokenizer_file", "spm_file", "sentencepiece_model_file")
SHARD_FIELD = "weight_map"
# A Hugging Face cache snapshot, models--OWNER--NAME/snapshots/REVISION/, links its files into models--.../blobs/.
HUB_REPO_PREFIX = "models--"


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
              max_depth: int = MAX_JSON_DEPTH, shown: str | Path | None = None) -> Any:
    """A JSON file that a model directory holds (``what``: the kind of file, for errors), refused (``RecordError``
    naming the file, as ``shown`` if given) when it is larger than ``max_bytes``, nested deeper than ``max_depth``
    or not JSON."""
    path = Path(path)
    name = str(shown or path)
    size = path.stat().st_size
    if size > max_bytes:
        raise RecordError(name, None, None, f"is {size} bytes, more than the {max_bytes} a {what} may have: refused")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RecordError(name, exc.lineno, None, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # undecodable bytes, absurd nesting or numbers
        raise RecordError(name, None, None, f"not a readable {what}: {exc}") from None
    if _depth(data) > max_depth:
        raise RecordError(name, None, None, f"is nested deeper than {max_depth} levels: refused")
    return data


def allowed_roots(directory: str | Path) -> tuple[Path, ...]:
    """Where the files of ``directory`` may resolve: inside it, and for a Hugging Face cache snapshot also in its own
    repository's blob store (never another repository's)."""
    root = Path(directory).resolve()
    repo = root.parent.parent
    if root.parent.name == "snapshots" and repo.name.startswith(HUB_REPO_PREFIX) and (repo / "blobs").is_dir():
        return root, repo / "blobs"
    return (root,)


def inside(directory: str | Path, name: str, where: str) -> Path:
    """``directory / name`` where ``name`` (a file a configuration names, or a file of the directory; ``where`` says
    which file and field) is a relative path that resolves inside ``directory`` (links followed, to wherever they
    lead: ``allowed_roots``); anything else is refused."""
    roots = allowed_roots(directory)
    root = roots[0]
    if not isinstance(name, str) or not name or Path(name).is_absolute():
        raise ValueError(f"{where}: {name!r} is not a file name inside {root}: refused")
    path = (root / name).resolve()
    if not any(path == r or r in path.parents for r in roots):
        raise ValueError(f"{where}: {name!r} points outside {root} (to {path}): refused")
    return path


def check_directory(directory: str | Path) -> Path:
    """Refuse a model or judge directory (``ValueError`` / ``RecordError`` naming the file) with a file or folder
    that resolves outside it (``inside``: a link to another model's weights, to a secret), a JSON file past the
    size or nesting limits (``read_json``; tokenizer.json's own size limit) or a configuration naming a file
    outside (``FILE_FIELDS``, an index's shards), before any of its files is loaded. Returns the directory."""
    directory = Path(directory)
    for entry in sorted(directory.iterdir()):
        path = inside(directory, entry.name, str(directory))
        if entry.suffix != ".json" or not path.is_file():
            continue
        data = read_json(path, f"{entry.name} file", max_bytes=MAX_JSON_BYTES_OF.get(entry.name, MAX_JSON_BYTES),
                         shown=entry)
        if not isinstance(data, dict):
            continue
        for key in FILE_FIELDS:
            if isinstance(data.get(key), str):
                inside(directory, data[key], f"{entry} field {key!r}")
        shards = data.get(SHARD_FIELD)
        for tensor, shard in (shards.items() if isinstance(shards, dict) else ()):
            inside(directory, shard, f"{entry} field '{SHARD_FIELD}.{tensor}'")
    return directory


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
