"""The evb event builder from Python.

- ``Consumer``: a Filter Unit in this process. It joins a running event
  builder (``evb run --external-consumers K --rendezvous DIR``, or a cluster
  job) and receives built batches under the same protocol, credits and
  liveness as evb's own consumers. A batch is yours until you release it
  (or drop it), which returns its credit to its builder unit.
- ``Store``: an event store (a directory or ``s3://bucket/prefix``) read
  object by object, each verified before you see it.
- Data is never copied: ``batch.event(e, s)``, ``batch.fragment(s)`` and
  ``obj.event(i)`` are buffers over evb's own memory; wrap them in
  ``memoryview`` or ``numpy.frombuffer`` (``evb.as_array``). They stay
  valid after the batch is released.
- ``evb.frames``: the JSON that ``evb run``, ``evb sim`` and ``evb fabric``
  write, as pandas DataFrames.

A consumer is used from the thread that opened it; it lets go of the GIL
while it waits. See docs/integration.md.
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

from ._evb import Batch, Bytes, StoredObject, __version__
from ._evb import ConsumerHandle as _ConsumerHandle
from ._evb import StoreHandle as _StoreHandle

__all__ = ["Consumer", "Store", "Batch", "Bytes", "StoredObject", "as_array", "__version__"]


class Consumer:
    """A Filter Unit joining the run whose rendezvous directory is given.

    ``rank``: the consumer endpoint to take (default: the first external
    consumer rank ``evb run`` left free). ``config``: the run's
    configuration (default: the one ``evb run`` published). ``wait``:
    seconds to wait for the run to be published. Iterating
    yields batches until the end of the run; lost builder units are listed
    in ``lost_bus``.
    """

    def __init__(
        self,
        rendezvous: str,
        rank: Optional[int] = None,
        run_id: Optional[int] = None,
        config: Optional[str] = None,
        overrides: Sequence[str] = (),
        wait: float = 60.0,
    ) -> None:
        self._h = _ConsumerHandle(str(rendezvous), rank, run_id, config, list(overrides), wait)

    def next(self, timeout: float = 1.0) -> Optional[Batch]:
        """The next batch within ``timeout`` seconds, or None (see ``ended``)."""
        return self._h.next(timeout)

    def poll(self, timeout: float = 0.0) -> None:
        """Keeps the consumer alive (heartbeats, credits) without taking a batch."""
        self._h.poll(timeout)

    def __iter__(self) -> Iterator[Batch]:
        while not self._h.ended:
            batch = self._h.next(1.0)
            if batch is not None:
                yield batch

    @property
    def ended(self) -> bool:
        return self._h.ended

    @property
    def lost_bus(self) -> list:
        """Builder units lost so far: (BU index, reason)."""
        return self._h.lost_bus

    @property
    def rank(self) -> int:
        return self._h.rank

    def stats(self) -> dict:
        return self._h.stats()

    def close(self) -> None:
        """Leaves the run and writes the final report ``evb run`` counts."""
        self._h.close()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


class Store:
    """An event store read object by object; bad objects go to ``bad``."""

    def __init__(self, target: str, max_object_mib: int = 0) -> None:
        self._h = _StoreHandle(str(target), max_object_mib)

    def __iter__(self) -> Iterator[StoredObject]:
        while True:
            obj = self._h.next()
            if obj is None:
                return
            yield obj

    @property
    def bad(self) -> list:
        """Objects that failed verification: (name, reason)."""
        return self._h.bad


def as_array(data: Bytes, dtype="uint8"):
    """``data`` as a read-only NumPy array, without a copy."""
    import numpy

    return numpy.frombuffer(data, dtype=dtype)
