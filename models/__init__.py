"""PyTorch model code: ViT, DETR, matcher, losses, datasets and training. Never imported by the server."""
