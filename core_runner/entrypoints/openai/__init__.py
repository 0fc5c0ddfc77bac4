"""OpenAI-compatible HTTP server: ``create_app`` (FastAPI) and ``serve`` (uvicorn)."""
