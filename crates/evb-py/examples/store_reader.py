#!/usr/bin/env python3
"""Reads an event store (a directory or s3://bucket/prefix?endpoint=URL)
object by object: every object verified by evb, every fragment checked to
start with its event's number, in place.

    python3 store_reader.py /data/evb

Prints one line at the end:
    store: objects N events E bytes Y bad_objects X bad_events Z
"""

import sys

import numpy as np

import evb


def main() -> int:
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} STORE", file=sys.stderr)
        return 2
    store = evb.Store(sys.argv[1])
    objects = events = size = bad_events = 0
    for obj in store:
        objects += 1
        for i in range(obj.events):
            event = obj.event(i)
            events += 1
            size += len(event)
            number = obj.mep * obj.mep_events + obj.event_number(i)
            for col in range(len(obj.sources)):
                frag = obj.fragment(i, col)
                k = min(len(frag), 8)
                if k == 0:
                    continue
                got = int.from_bytes(np.frombuffer(frag, dtype=np.uint8, count=k).tobytes(), "little")
                if got != number % (1 << (8 * k)):
                    bad_events += 1
    for name, reason in store.bad:
        print(f"bad: {name}: {reason}", file=sys.stderr)
    print(
        f"store: objects {objects} events {events} bytes {size} "
        f"bad_objects {len(store.bad)} bad_events {bad_events}",
        flush=True,
    )
    return 0 if not store.bad and bad_events == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
