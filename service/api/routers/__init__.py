"""One router per resource; each route only translates (``tokenmold.service.api.translate``) and calls the runtime."""
