"""One module per task: what varies between classification, detection and embeddings lives here."""
