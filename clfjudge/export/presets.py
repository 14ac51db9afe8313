"""Export presets: a YAML file of `clfjudge export` options (the repository's ``export/*.yaml``: fp32, int8 per
instruction set, int4, OpenVINO bf16, CUDA), read as data, checked key by key and type by type.

A key is a `clfjudge export` option's long name (``--parity-config`` -> ``parity_config``); repeatable options
(``provider``, ``threshold``) take lists. ``parity_config`` is relative to the preset's directory.
"""
from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("expected true or false")
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise TypeError("expected a positive integer")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TypeError("expected a non-empty string")
    return value


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise TypeError("expected a list of strings")
    return [_str(v) for v in value]


def _provider(value: Any) -> list[str]:
    from ..models.onnx_session import PROVIDERS

    names = _strings(value)
    unknown = [n for n in names if n not in PROVIDERS]
    if unknown:
        raise TypeError(f"unknown provider(s) {unknown}; known: {', '.join(PROVIDERS.names())}")
    return names


def _isa(value: Any) -> str:
    import yaml

    from .quantize import INT8_CONFIG

    known = ["auto", *sorted((yaml.safe_load(Path(INT8_CONFIG).read_text()) or {}).get("isa") or {})]
    if value not in known:
        raise TypeError(f"expected one of {', '.join(known)}")
    return value


# preset key -> (the parsed `clfjudge export` option it sets, its check)
OPTIONS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "int8": ("int8", _bool),
    "int4": ("int4", _bool),
    "optimize": ("optimize", _bool),
    "fallback": ("fallback", _bool),
    "provider": ("providers", _provider),
    "openvino": ("openvino", _strings),
    "isa": ("isa", _isa),
    "opset": ("opset", _int),
    "source": ("source", _str),
    "n": ("n_records", _int),
    "threshold": ("thresholds", _strings),
    "parity_config": ("parity_config", _str),
}


def load_preset(path: str | Path) -> dict[str, Any]:
    """The preset's options, keyed as `clfjudge export`'s parsed arguments. Errors name the file and the key."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"export preset {path} not found (the repository's presets: export/*.yaml)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ValueError(f"{path}{f', line {mark.line + 1}' if mark else ''}: not valid YAML: "
                         f"{getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a mapping of clfjudge export options (keys: {', '.join(OPTIONS)})")
    options = {}
    for key, value in data.items():
        if key not in OPTIONS:
            close = difflib.get_close_matches(str(key), OPTIONS, n=1)
            raise ValueError(f"{path}: unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                             + f"; known: {', '.join(OPTIONS)}")
        dest, check = OPTIONS[key]
        try:
            options[dest] = check(value)
        except TypeError as exc:
            raise ValueError(f"{path}: key {key!r}: {exc}, got {value!r}") from None
    if "parity_config" in options:
        options["parity_config"] = str(path.parent / options["parity_config"])
    return options


def apply_preset(args: Any, preset: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """Set each preset option on ``args`` that the command line left at its default (an option given there wins);
    returns the options the preset set."""
    taken = []
    for dest, value in preset.items():
        if getattr(args, dest) == defaults[dest]:
            setattr(args, dest, value)
            taken.append(dest)
    return taken
