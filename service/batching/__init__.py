"""Dynamic batching: one :class:`~service.batching.batcher.Batcher` per model version, its buffers and clock."""
