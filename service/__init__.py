"""patchserve: an inference server for vision transformers (ViT, DETR) on ONNX Runtime."""
