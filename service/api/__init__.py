"""The OpenAI-compatible HTTP service (FastAPI): ``create_app`` in ``app``, ``serve`` in ``server``."""
