#!/usr/bin/env python3
"""The median of several `torsh-backend bench --json` runs, as the Markdown table docs/benchmarks.md
shows.

    python3 benches/median_table.py RUN1.json RUN2.json RUN3.json [--dtype f32] [--op conv2d ...]

For every case (op, variant, shape, dtype) and thread count in the runs it prints, per thread count:
our throughput, the best peer's (and which it was), ours / best peer as the median over the runs
with the range in brackets, and our fraction of the run's ceiling (FMA peak or copy bandwidth).
Each run's ratio comes from that run alone (ours and its peers timed interleaved); the medians are
taken cell by cell. A ratio at or above 1 is bold. Needs only the standard library.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def key(row: dict) -> tuple:
    """The identity of a case across runs."""
    return (row["section"], row["op"], row.get("variant"), row["shape"], row["dtype"])


def cell(values: list[float], fmt: str) -> str:
    """The median of `values`, with the range when there are several."""
    if not values:
        return "-"
    mid = statistics.median(values)
    text = format(mid, fmt)
    if len(values) > 1:
        text += f" [{format(min(values), fmt)}–{format(max(values), fmt)}]"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="JSON files of `bench --json`")
    parser.add_argument("--dtype", action="append", help="only these dtypes (default: all)")
    parser.add_argument("--op", action="append", help="only these ops (default: all)")
    args = parser.parse_args()
    docs = []
    for path in args.runs:
        try:
            with open(path) as f:
                docs.append(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            print(f"median_table: cannot read {path}: {e}", file=sys.stderr)
            return 1
    threads = sorted({r.get("threads") or 1 for d in docs for r in d["results"]})
    cases: dict[tuple, dict[int, list[dict]]] = {}
    for d in docs:
        for r in d["results"]:
            if r.get("error") or r.get("throughput") is None:
                continue
            if args.dtype and r["dtype"] not in args.dtype:
                continue
            if args.op and r["op"] not in args.op:
                continue
            cases.setdefault(key(r), {}).setdefault(r.get("threads") or 1, []).append(r)
    head = ["op", "dtype", "shape", "unit"]
    for t in threads:
        head += [f"ours {t}T", f"best peer {t}T", f"ours/best {t}T", f"of ceiling {t}T"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for (_, op, _, shape, dtype), per_thread in cases.items():
        unit = next(iter(per_thread.values()))[0]["unit"]
        line = [op, dtype, shape, unit]
        for t in threads:
            rows = per_thread.get(t, [])
            ours = [r["throughput"] for r in rows]
            peers = [r["peer"] for r in rows if r.get("peer")]
            names = sorted({p["key"] for p in peers})
            ratios = [r["ours_over_best_peer"] for r in rows if r.get("ours_over_best_peer")]
            fractions = [100 * r["fraction_of_ceiling"] for r in rows
                         if r.get("fraction_of_ceiling") is not None]
            ratio = cell(ratios, ".2f")
            if ratios and statistics.median(ratios) >= 1.0:
                ratio = f"**{ratio.split(' ')[0]}**" + ratio[len(ratio.split(' ')[0]):]
            best = cell([p["throughput"] for p in peers], ".4g")
            line += [cell(ours, ".4g"), f"{best} ({'/'.join(names)})" if names else "-", ratio,
                     cell(fractions, ".0f") + ("%" if fractions else "")]
        print("| " + " | ".join(line) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
