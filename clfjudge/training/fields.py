"""A recipe's fields: help text beside each (``described``: what ``clfjudge train --help`` and an unknown key's error
say), YAML / ``--set`` values coerced to each field's declared type (``coerce``), and an options block read from its
mapping, key by key (``options_from_dict``: a judge kind's block, such as ``embedding:`` or ``verdict:``).

Below ``config.py`` and the kinds' option blocks (``<kind>_config.py``), which all read their recipe keys through it.
"""
from __future__ import annotations

import types
from dataclasses import field, fields, is_dataclass
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


def described(text: str, default: Any = None, factory: Any = None) -> Any:
    """A config field with its help text (what ``clfjudge train --help`` and an unknown key's error say)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


def options_from_dict(cls: type[T], data: dict[str, Any], where: str) -> T:
    """An options block from the recipe's mapping, each value coerced to its field's type; an unknown key is refused
    naming ``where`` (file: block) and every known key with its help."""
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown}; known: "
                         + "; ".join(f"{name}: {f.metadata['help']}" for name, f in known.items()))
    hints = get_type_hints(cls)
    return cls(**{k: coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()})


_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Coerce a YAML value or a --set string to the field's declared type (YAML reads 2e-5 as a string)."""
    import yaml

    if tp is Any:
        return value
    if is_dataclass(tp):  # a nested options block (embedding: ...)
        if isinstance(value, tp):
            return value
        value = yaml.safe_load(value) if isinstance(value, str) else value
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping of {tp.__name__} keys, got {value!r}")
        return tp.from_dict(value, where)
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "~")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return coerce(value, inner[0], where)
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE | _FALSE:
                return text in _TRUE
            raise ValueError
        if tp is int:
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not number.is_integer():
                raise ValueError
            return int(number)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tp is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
        if origin is list:
            if isinstance(value, str):
                text = value.strip()
                value = (yaml.safe_load(text) if text.startswith("[")
                         else [v.strip() for v in text.split(",") if v.strip()])
            if not isinstance(value, list):
                raise ValueError
            return [coerce(v, args[0], where) for v in value]
        if origin is dict:
            if isinstance(value, str):
                value = yaml.safe_load(value)
            if not isinstance(value, dict):
                raise ValueError
            return {str(k): coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    except (TypeError, ValueError, yaml.YAMLError):
        raise ValueError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}") from None
    raise TypeError(f"{where}: unsupported config type {tp}")
