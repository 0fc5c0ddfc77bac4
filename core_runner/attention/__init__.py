from core_runner.attention.backend import AttentionBackend, AttnMetadata, get_backend

__all__ = ["AttentionBackend", "AttnMetadata", "get_backend"]
