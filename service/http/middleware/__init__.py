"""Pure ASGI middleware, one per file (no per-request task or body buffering, unlike BaseHTTPMiddleware)."""
