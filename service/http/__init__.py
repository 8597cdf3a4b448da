"""The HTTP layer: the app factory, middleware, thin routers, and the one mapping of errors to responses."""
