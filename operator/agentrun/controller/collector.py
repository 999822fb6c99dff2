"""The garbage collector's pace while the operator runs.

Why: at 1000 concurrent runs Python's cyclic garbage collector, at its defaults, took about two fifths
of the operator's CPU (docs/benchmarks.md, 'Cheaper iterations'). Every iteration allocates thousands of
short-lived objects while a thousand runs keep their conversations alive; collecting the youngest
generation every 700 new objects catches many objects of requests still in flight, promotes them,
and the oldest generation, which holds every run's state, fills up and is walked whole again and again
(25 full collections of ~0.3 s in one 1000-run benchmark). Collecting the youngest generation every
50,000 new objects lets those objects die young: no full collection in the same benchmark, and the
same peak memory.

What the process holds once it has started (modules, classes, the models' validators: most of the
objects the collector tracks) lives as long as the process, so it is frozen out of every collection:
before that, a middle-generation collection during the runs still walked it, one pause of ~0.2 s.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def young_generation_threshold(threshold: int) -> Iterator[None]:
    """The youngest generation collected after ``threshold`` new objects while inside, and what exists on
    the way in frozen; the older generations keep their thresholds, and everything is put back on the way
    out (the demo runs the operator inside its own process, which goes on after it)."""
    before = gc.get_threshold()
    gc.collect()  # garbage left by start-up is collected once, not frozen with the rest
    gc.freeze()
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
