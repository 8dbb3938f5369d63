"""One router per resource; each route only translates (``service.api.translate``) and calls the runtime."""
