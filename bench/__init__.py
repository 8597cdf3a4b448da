"""Side-by-side benchmarks of patchserve (not tests; see bench/run.py)."""
