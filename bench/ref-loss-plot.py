#!/usr/bin/env python3
"""The reference study's comparison as a chart: built Gb/s per node lost on
an imperfect tree against a clean one, per credits and parallel sends, from
two `evb scan --replications R --json` results over the same two axes
(event_builder.credits, event_builder.parallel_sends).

  bench/ref-loss-plot.py CLEAN.json IMPERFECT.json OUT.svg

Writes an SVG line chart (one line per credits value, the loss with its 95 %
interval, the two intervals combined in quadrature) and prints a markdown
table of both figures and the loss.
"""
import json
import math
import sys


def points(path):
    d = json.load(open(path))
    out = {}
    for p in d["points"]:
        k = tuple(v for _, v in p["params"])
        out[k] = (p["figure_gbps"], p.get("ci95_gbps") or 0.0)
    return out


def main():
    clean, imperfect, svg = points(sys.argv[1]), points(sys.argv[2]), sys.argv[3]
    credits = sorted({int(k[0]) for k in clean})
    sends = sorted({int(k[1]) for k in clean})
    print("| credits | parallel sends | clean 72 hosts | imperfect 64 hosts | lost |")
    print("| --- | --- | --- | --- | --- |")
    loss = {}
    for c in credits:
        for s in sends:
            k = (str(c), str(s))
            (a, da), (b, db) = clean[k], imperfect[k]
            loss[(c, s)] = (a - b, math.hypot(da, db))
            print(f"| {c} | {s} | {a:.2f} +- {da:.2f} | {b:.2f} +- {db:.2f} | {a - b:.2f} +- {math.hypot(da, db):.2f} |")
    w, h, left, right, top, bottom = 640, 400, 60, 120, 30, 50
    # The axis follows the losses; intervals that run off it are cut at
    # its ends (a few points with one credit swing widely between seeds).
    ymin = math.floor(min(0.0, min(l for l, _ in loss.values())) / 10) * 10
    ymax = math.ceil((max(l for l, _ in loss.values()) + 5) / 10) * 10

    def x(i):
        return left + (w - left - right) * i / max(1, len(sends) - 1)

    def y(v):
        v = min(max(v, ymin), ymax)
        return top + (h - top - bottom) * (ymax - v) / (ymax - ymin)

    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="14">built Gb/s per node lost: imperfect 64-host tree against clean 72-host tree</text>']
    for v in range(int(ymin), int(ymax) + 1, 10):
        parts.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{w - right}" y2="{y(v):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>')
    for i, s in enumerate(sends):
        parts.append(f'<text x="{x(i):.1f}" y="{h - bottom + 18}" text-anchor="middle">{s}</text>')
    parts.append(f'<text x="{(left + w - right) / 2}" y="{h - 10}" text-anchor="middle">parallel sends</text>')
    parts.append(f'<text x="16" y="{(top + h - bottom) / 2}" text-anchor="middle" transform="rotate(-90 16 {(top + h - bottom) / 2})">Gb/s lost</text>')
    for j, c in enumerate(credits):
        col = colours[j % len(colours)]
        pts = [(x(i), y(loss[(c, s)][0])) for i, s in enumerate(sends)]
        parts.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (col, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
        for i, s in enumerate(sends):
            l, d = loss[(c, s)]
            parts.append(f'<line x1="{x(i):.1f}" y1="{y(l - d):.1f}" x2="{x(i):.1f}" y2="{y(l + d):.1f}" stroke="{col}"/>')
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(l):.1f}" r="3" fill="{col}"/>')
        parts.append(f'<text x="{w - right + 10}" y="{top + 20 + 18 * j}" fill="{col}">credits {c}</text>')
    parts.append("</svg>")
    open(svg, "w").write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
