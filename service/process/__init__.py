"""The process: the uvicorn entry point, its connection protocol, the container's health check."""
