"""The JSON that evb writes, as pandas DataFrames.

``load(path)`` reads any of them (``evb run --json``, ``evb sim --json``,
``evb scan --json``, ``evb fabric conflicts --json``); the functions below
turn the parts that are tables into DataFrames, one row per node, sample,
consumer, host, link or scan point. Nested objects become columns named
with dots (``summary.eb.built_gbps_per_node``). pandas is imported when a
function is called, so ``import evb`` does not need it.
"""

from __future__ import annotations

import json
from typing import Any


def load(path) -> dict:
    """The JSON file at ``path``; ``kind`` says what wrote it."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _frame(rows: list[Any]):
    import pandas

    rows = [r for r in rows if r is not None]
    return pandas.json_normalize(rows) if rows else pandas.DataFrame()


def _of(doc, kind: str) -> dict:
    if not isinstance(doc, dict):
        doc = load(doc)
    if kind and doc.get("kind") != kind:
        raise ValueError(f"not an {kind} JSON (its kind is {doc.get('kind')!r})")
    return doc


def run_nodes(run):
    """``evb run``: one row per endpoint (its final report)."""
    return _frame(_of(run, "evb-run")["nodes"])


def run_timeline(run):
    """``evb run``: the once-a-second samples (built Gb/s, events/s, ...)."""
    return _frame(_of(run, "evb-run")["timeline"])


def run_consumers(run):
    """``evb run`` with consumers: one row per consumer (batches, Gb/s, busy)."""
    c = _of(run, "evb-run")["summary"].get("consumers") or {}
    return _frame(c.get("per_consumer", []))


def sim_hosts(sim):
    """``evb sim``: one row per host (sent and received Gb/s)."""
    return _frame(_of(sim, "evb-sim")["hosts"])


def sim_links(sim):
    """``evb sim``: one row per output port (utilisation, PortXmitWait)."""
    return _frame(_of(sim, "evb-sim")["links"])


def sim_timeseries(sim):
    """``evb sim``: the received Gb/s every ``sim.sample_us``."""
    return _frame(_of(sim, "evb-sim")["timeseries"])


def scan_points(scan):
    """``evb scan``: one row per point, its axes as columns, by rank."""
    doc = _of(scan, "evb-scan")
    rows = []
    for p in doc["points"]:
        row = {k: v for k, v in p["params"]}
        row.update(
            index=p["index"],
            figure_gbps=p["figure_gbps"],
            ci95_gbps=p.get("ci95_gbps"),
            summary=p["summary"],
        )
        rows.append(row)
    frame = _frame(rows)
    return frame.sort_values("figure_gbps", ascending=False) if len(frame) else frame


def table(doc, key: str):
    """Any list of objects in a JSON document, by its dotted key
    (``"summary.consumers.per_producer"``, a fabric report's lists)."""
    if not isinstance(doc, dict):
        doc = load(doc)
    value: Any = doc
    for part in key.split("."):
        value = value[part]
    return _frame(list(value))
