"""PyTorch -> ONNX: export, parity check, manifest writing, checkpoint import."""
