"""Attention backends by name: ``register_backend(name, cls)`` / ``get_backend(name)``.

A built-in backend is registered as a lazy ``"module:attr"`` string, so importing this
module imports no Triton; the class is imported when a plan asks for it.
Adding a backend is one file (a subclass of ``AttentionBackend`` declaring its
capabilities as class attributes) and one ``register_backend`` line (below for a
built-in one, anywhere before the engine is built for another).

Capabilities a backend class declares (see ``AttentionBackend``): ``supports_mla``,
``supports_cuda_graphs``, ``needs_triton`` and ``capability`` (the model capability,
such as ``triton_attention``, that a family declares to allow it). A layer that needs a
backend capability declares ``needs_attention_capability`` (MLAAttention: "supports_mla");
``oracle.check_model_fits`` refuses the pair at engine construction.
"""
from __future__ import annotations

from typing import Any

_BACKENDS: dict[str, Any] = {}


def register_backend(name: str, cls: Any, *, override: bool = False) -> None:
    """Make ``cls`` (a class or a lazy ``"module:attr"`` string) selectable as
    ``EngineConfig(attention_backend=name)``. A taken name is an error unless ``override``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"attention backend name {name!r} is invalid: expected a non-empty string")
    if isinstance(cls, str) and ":" not in cls:
        raise ValueError(f"attention backend {name!r}: {cls!r} is not a class or a lazy 'module:attr' string")
    if name in _BACKENDS and not override:
        raise ValueError(f"attention backend {name!r} is already registered; pass override=True to replace it")
    _BACKENDS[name] = cls


def unregister_backend(name: str) -> None:
    _BACKENDS.pop(name, None)


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def _unknown(name: object) -> ValueError:
    return ValueError(f"attention backend {name!r} is unknown: registered backends are "
                      f"{', '.join(repr(n) for n in backend_names())}")


def is_registered(name: str) -> bool:
    return name in _BACKENDS


def backend_class(name: str) -> Any:
    """The class registered as ``name`` (imported now if it was registered lazily).
    An unknown name is a ValueError listing the registered ones; a backend whose module
    cannot be imported (e.g. Triton not installed) is an ImportError."""
    if name not in _BACKENDS:
        raise _unknown(name)
    cls = _BACKENDS[name]
    if isinstance(cls, str):
        from core_runner.registry import import_string

        cls = import_string(cls, f"attention backend {name!r}")
        _BACKENDS[name] = cls
    return cls


def get_backend(name: str) -> Any:
    """An instance of the backend registered as ``name``."""
    return backend_class(name)()


def backends_with(capability: str) -> list[str]:
    """Registered backends whose class declares ``capability`` true (those that cannot be
    imported here are left out)."""
    out = []
    for name in backend_names():
        try:
            if getattr(backend_class(name), capability, False):
                out.append(name)
        except ImportError:
            pass
    return out


register_backend("torch", "core_runner.attention.torch_backend:TorchPagedAttention")
register_backend("triton", "core_runner.attention.triton_backend:TritonPagedAttention")
