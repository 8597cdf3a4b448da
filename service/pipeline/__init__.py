"""The ``/v1`` request pipeline: decode and preprocess a request's images, batch them, collect the outputs."""
