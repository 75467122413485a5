"""Model registry: models are found by name; duplicates and unknown names are errors."""

from __future__ import annotations

from collections.abc import Callable

_MODELS: dict[str, Callable] = {}


def register(name: str) -> Callable:
    """Class decorator: make a model available as `name`."""

    def add(cls):
        if name in _MODELS:
            raise ValueError(f"model {name!r} is already registered (by {_MODELS[name].__module__})")
        _MODELS[name] = cls
        cls.name = name
        return cls

    return add


def get(name: str) -> Callable:
    """The model class registered as `name`."""
    try:
        return _MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}: known models are {', '.join(sorted(_MODELS))}") from None


def names() -> list[str]:
    return sorted(_MODELS)
