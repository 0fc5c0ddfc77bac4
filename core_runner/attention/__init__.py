from core_runner.attention.backend import AttentionBackend, AttnMetadata
from core_runner.attention.registry import backend_class, backend_names, get_backend, register_backend

__all__ = ["AttentionBackend", "AttnMetadata", "backend_class", "backend_names", "get_backend", "register_backend"]
