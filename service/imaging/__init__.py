"""One image at a time: pre-scan, decode, preprocess (resize policies), draw; numpy and Pillow only.

Knows nothing of models, batches or HTTP: the manifest's preprocessing spec lives here and the
runtime builds a :class:`~service.imaging.preprocess.Preprocessor` from it.
"""
