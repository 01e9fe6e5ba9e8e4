#!/usr/bin/env python3
"""A Filter Unit in Python: joins a running event builder and consumes its
built batches until the end of the run, reading the data in place.

    evb run -n 2 --consumers 1 --external-consumers 1 --rendezvous /tmp/rdv &
    python3 consumer.py /tmp/rdv             # checks every event's number
    python3 consumer.py /tmp/rdv --no-check  # reads one number per fragment

Prints one line at the end:
    consumer rank R: batches B events E bytes Y bad_events X lost_bus L
"""

import sys

import numpy as np

import evb


def bad_events(batch) -> int:
    """Events whose fragments do not start with their number.

    Each event starts with mep * events + e as a little-endian u64; the
    fragment's size table says where. NumPy reads the fragment in place.
    """
    n = batch.events
    want = batch.mep * n + np.arange(n, dtype=np.uint64)
    bad = 0
    for s in range(batch.sources):
        frag = batch.fragment(s)
        if len(frag) == 0:
            continue  # a source a partial batch lacks
        sizes = np.frombuffer(frag, dtype="<u4", count=n)
        starts = 4 * n + np.concatenate(([0], np.cumsum(sizes[:-1], dtype=np.int64)))
        data = np.frombuffer(frag, dtype=np.uint8)
        full = sizes >= 8
        # The first 8 bytes of each event, as little-endian u64.
        idx = starts[full, None] + np.arange(8)
        numbers = data[idx].astype(np.uint64) @ (np.uint64(1) << (8 * np.arange(8, dtype=np.uint64)))
        bad += int(np.count_nonzero(numbers != want[full]))
    return bad


def first_numbers(batch) -> int:
    """Reads the first event's number of every fragment, in place."""
    seen = 0
    for s in range(batch.sources):
        ev = batch.event(0, s)
        if len(ev) >= 8:
            seen += int(np.frombuffer(ev, dtype="<u8", count=1)[0] == batch.mep * batch.events)
    return seen


def main() -> int:
    if len(sys.argv) < 2:
        print(f"usage: {sys.argv[0]} RENDEZVOUS_DIR [--no-check]", file=sys.stderr)
        return 2
    check = not (len(sys.argv) > 2 and sys.argv[2] == "--no-check")
    batches = events = size = bad = 0
    with evb.Consumer(sys.argv[1]) as consumer:
        for batch in consumer:
            with batch:  # released (its credit back to its BU) at the end
                batches += 1
                events += batch.events
                size += len(batch.payload)
                if check:
                    bad += bad_events(batch)
                elif batch.events > 0:
                    first_numbers(batch)
        print(
            f"consumer rank {consumer.rank}: batches {batches} events {events} bytes {size} "
            f"bad_events {bad} lost_bus {len(consumer.lost_bus)}",
            flush=True,
        )
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
