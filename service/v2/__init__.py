"""The Open Inference Protocol (KServe v2): its codec, tensor inference and OpenAPI; the routes are HTTP's."""
