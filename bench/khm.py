#!/usr/bin/env python3
"""Saturation throughput of an N x N input-queued switch with FIFO inputs
(Karol, Hluchyj and Morgan, 1987), by slotted simulation of their model:
every input always has a head cell for a uniformly random output, each
output takes one of the heads asking for it at random per slot.

  bench/khm.py [SLOTS]     (default 1e6 slots: about +-0.001)

Prints, for N = 8, 16, 32, 64, the throughput with an input's own output
allowed (their model) and without it (hosts never send to themselves, as in
`evb sim --traffic uniform`). docs/sim.md quotes 2e7 slots.
"""
import random
import sys


def saturation(n, slots, own_output, seed=1):
    rnd = random.Random(seed)

    def pick(i):
        if own_output:
            return rnd.randrange(n)
        d = rnd.randrange(n - 1)
        return d + 1 if d >= i else d

    head = [pick(i) for i in range(n)]
    warm = slots // 10
    served = 0
    for t in range(slots):
        asking = {}
        for i, o in enumerate(head):
            asking.setdefault(o, []).append(i)
        for inputs in asking.values():
            winner = inputs[rnd.randrange(len(inputs))]
            head[winner] = pick(winner)
            if t >= warm:
                served += 1
    return served / (n * (slots - warm))


if __name__ == "__main__":
    slots = int(float(sys.argv[1])) if len(sys.argv) > 1 else 1_000_000
    print("N   own output allowed   no own output")
    for n in (8, 16, 32, 64):
        print(f"{n:<3} {saturation(n, slots, True):.4f}               {saturation(n, slots, False):.4f}")
