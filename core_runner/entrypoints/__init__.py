"""Network front ends over the engine (the OpenAI-compatible HTTP server)."""
