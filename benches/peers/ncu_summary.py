#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (`ncu --metrics gpu__time_duration.sum --csv`) kernel by kernel: the total,
and the kernels grouped by name (kiln's `k<n>_` prefixes and template arguments dropped, so the four
layers' copies of one kernel are one line), largest first.

Why: per-kernel CUDA events add each launch's overhead (a 3 ms graph sums to 5.7 ms that way), so they rank
kernels but do not time them; under ncu each kernel's duration is its own. Every kernel runs with the
caches ncu leaves it (flushed between kernels by default), so the sum exceeds a graph's time.

  python3 benches/peers/ncu_summary.py kiln.csv [top]
"""
import collections
import csv
import re
import sys


def rows(path):
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(unit, 1e-6)
        yield r["Kernel Name"], value * scale


def group(name):
    name = re.sub(r"^k\d+_", "", name)
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"\(.*", "", name)
    return re.sub(r"_\d+$", "", name)


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    total, count = 0.0, 0
    groups = collections.defaultdict(lambda: [0.0, 0])
    for name, ms in rows(path):
        total += ms
        count += 1
        g = groups[group(name)]
        g[0] += ms
        g[1] += 1
    print(f"{path}: {count} kernels, {total:.3f} ms summed")
    for name, (ms, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {ms:8.4f} ms {100 * ms / max(total, 1e-12):5.1f}%  x{n:<4} {name[:110]}")


if __name__ == "__main__":
    main()
