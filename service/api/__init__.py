"""The HTTP layer: thin routers over the core in ``service/``."""
