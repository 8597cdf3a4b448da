"""The auto-tuner: at warm-up, measure a model's throughput on this machine and pick its batching.

For each instance count n in 1…N and batch size b in 1, 2, 4, … up to a bound, n sessions run
batches of b zeros concurrently, one thread each, for ``point_seconds``; images per second is
the point's throughput. The grid is measured in interleaved rounds (three by default: every
point, then every point again, ...) and each point is its median, because one 0.2 s point on
a shared CPU is noise (issue 14: ViT-Ti/16 gave b1 40, b2 34, b4 47 img/s in one bench run,
where ONNX Runtime alone on a quiet machine gives b1 82, b4 94). The whole measurement stops
at ``budget_seconds`` (what was measured by then is used), and a batch-size sweep stops early
once two sizes in a row gave under 90 % of its best. The CPU time other processes took
meanwhile is measured too (/proc/stat's busy time minus this process's): a result measured on
a busy machine is used but not cached, so the next start measures again.
:func:`choose` then takes the smallest instance count, and within it the smallest batch, whose
throughput is within ``tolerance`` (5 %) of the best measured: on the CPU, where the curve is
flat (ViT-Ti/16: b1 82, b4 94, b16 84 img/s), that is a small batch, which keeps latency low; on a
GPU, where it rises steeply, it is the largest batch that still pays.

The result is cached, one JSON file per model file and machine, keyed by the graph's SHA-256,
the CPU or GPU identity, ONNX Runtime's version, the threads the sessions get and the bounds,
so a restart reads it instead of measuring again. A file lock around "read, or measure and
write" makes the first worker process measure while the others wait and then read its result, and
:meth:`Tuner.exclusive` holds one lock around a worker's whole loading phase, so no two workers
measure at once: one measurement per server, taken while no other worker computes.
"""

from service.runtime.tuning.cache import TuneCache, cache_key, default_cache_dir
from service.runtime.tuning.curve import TOLERANCE, Point, TuneResult, batch_sizes, choose
from service.runtime.tuning.measure import measure, measure_point
from service.runtime.tuning.tuner import Tuner, tune

__all__ = [
    "TOLERANCE",
    "Point",
    "TuneCache",
    "TuneResult",
    "Tuner",
    "batch_sizes",
    "cache_key",
    "choose",
    "default_cache_dir",
    "measure",
    "measure_point",
    "tune",
]
