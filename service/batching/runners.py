"""Which runner takes the next batch: N instances, and an optional wide runner for a request that arrives alone.

On a CPU the two loads want different sessions. A lone request runs fastest on one session
whose intra-op threads span every core. Under load, that session's parallel sections keep
waiting for whichever of its threads a decode thread has pushed off its core, while one
single-threaded session per core, side by side, never waits for another thread: on 2 cores two
of them served 19 % more at concurrency 16 (47.9 against 40.3 req/s) and took 1.5x as long for a
lone request (p50 42.8 against 28.5 ms; ``python -m bench.variants``, docs/performance.md,
"Threads on a small CPU"). Each session holds its own copy of the weights. The wide runner gives
both: the N instances serve batches under load, and a further session with every core (the
*wide* runner) takes a batch of one that arrives while every instance is idle and nothing else
waits. The two never run at once, so the threads that compute never outnumber the cores: while
the wide runner runs, no instance starts a batch, and it starts only when every instance is idle.

**A full batch may wait behind a running one** (:meth:`RunnerPool.stage`). When every instance
is busy and a batch is full (``max_batch_size``), it is handed to the instance whose run began
first, to start in that runner's thread the moment its run returns, without a trip back through
the event loop. Without it, a runner whose batch ends waits idle until the loop, itself often
waiting for a core beside the decoders, has answered that batch and handed over the next: on 2
cores at concurrency 16 the runner threads were idle 5 % of the run that way, and the CPU 8 %
(``python -m bench.profile``'s scheduler table, docs/performance.md). One batch at most waits
behind each instance, and only a full one, so a batch that could still grow is never sent early.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class RunnerPool:
    """Hands out runner indices: instances ``0 … instances-1``, and ``instances`` for the wide runner.

    Args:
        instances: the model's sessions fed with batches (at least 1).
        wide: whether a wide runner follows them.
    """

    def __init__(self, instances: int, *, wide: bool = False) -> None:
        if instances < 1:
            raise ValueError("a batcher needs at least one runner")
        self.instances = instances
        self.wide: int | None = instances if wide else None  # the wide runner's index
        self._idle = list(reversed(range(instances)))  # instance 0 is used first
        self._running_one: list[int] = []  # instances running one batch, none behind it; oldest run first
        self._wide_running = False
        self._arriving = 0  # inputs on their way to the queue (arriving())
        self.wide_batches = 0  # batches the wide runner took or ran for a claim (tests and logs)
        self.staged_batches = 0  # batches handed to an instance behind its running one (tests and logs)

    @contextlib.contextmanager
    def arriving(self, count: int) -> Iterator[None]:
        """While the block runs, ``count`` inputs are on their way: admitted, being decoded, not yet queued.

        A lone queued input takes the wide runner only when nothing else is on its way: under load,
        requests reach the queue one at a time as their decoding ends, yet none of them is alone.
        """
        self._arriving += count
        try:
            yield
        finally:
            self._arriving -= count

    def available(self) -> bool:
        """A batch may start now: an instance is idle, and the wide runner (every core) is not running."""
        return bool(self._idle) and not self._wide_running

    def take(self, batch_size: int, queued: int) -> int:
        """The runner for a batch of ``batch_size`` inputs, with ``queued`` inputs waiting or on their way behind it.

        The wide runner when there is one, the batch is a lone input, nothing waits or is on its
        way (:meth:`arriving`) and every instance is idle; else an idle instance (the one freed
        last; instance 0 at first). Call only when :meth:`available`.
        """
        assert self.available(), "take a runner only when one is available"
        alone = batch_size == 1 and queued == 0 and self._arriving == 0
        if self.wide is not None and alone and len(self._idle) == self.instances:
            self._wide_running = True
            self.wide_batches += 1
            return self.wide
        runner = self._idle.pop()
        self._running_one.append(runner)
        return runner

    def room_behind(self) -> bool:
        """A full batch may wait behind a running one now: no instance is idle (else it takes that one),
        the wide runner is not running, and some instance runs one batch with none behind it."""
        return not self._idle and not self._wide_running and bool(self._running_one)

    def stage(self) -> int:
        """The instance a full batch waits behind: of those running one batch, the one whose run
        began first. Call only when :meth:`room_behind`; the runner runs the two in order, and each
        is given back (:meth:`give_back`) when it ends."""
        assert self.room_behind(), "stage a batch only when there is room behind a running one"
        self.staged_batches += 1
        return self._running_one.pop(0)

    def claim_alone(self) -> int | None:
        """The runner a lone input arriving now would take, taken for it (:mod:`service.batching.alone`).

        None unless a batch may start (:meth:`available`) and nothing but that input is on its way
        (:meth:`arriving`); the caller checks that nothing is queued. Given back with
        ``give_back(runner, claim=True)``.
        """
        if not self.available() or self._arriving > 1:  # (available: an instance is idle)
            return None
        if self.wide is not None and len(self._idle) == self.instances:
            self._wide_running = True
            return self.wide
        return self._idle.pop()

    def give_back(self, runner: int, *, claim: bool = False, ran: bool = True) -> None:
        """``runner``'s batch is done, or its ``claim`` ended (``ran``: the model ran for it): it is idle
        again, or runs the batch that waited behind it (:meth:`stage`), begun just now."""
        if claim and ran and runner == self.wide:
            self.wide_batches += 1
        if runner == self.wide:
            self._wide_running = False
        elif claim:
            self._idle.append(runner)
        elif runner in self._running_one:
            self._running_one.remove(runner)
            self._idle.append(runner)
        else:  # its staged batch runs now: the newest run
            self._running_one.append(runner)
