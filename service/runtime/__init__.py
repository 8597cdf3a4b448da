"""What serves: ONNX Runtime sessions, the manifest, the model repository, loading, tuning, model control."""
