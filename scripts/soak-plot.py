#!/usr/bin/env python3
"""Draw the soak's samples (make soak writes .run/soak.csv) as docs/soak.png.

    scripts/soak-plot.py [soak.csv] [soak.png]
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src = sys.argv[1] if len(sys.argv) > 1 else ".run/soak.csv"
dst = sys.argv[2] if len(sys.argv) > 2 else "docs/soak.png"
with open(src, newline="") as f:
    rows = list(csv.DictReader(f))
if not rows:
    sys.exit(f"{src}: no samples")
minutes = [float(r["seconds"]) / 60 for r in rows]
panels = [
    ("rss_mib", "RSS, all daemons (MiB)"),
    ("heap_mib", "Go heap in use, all daemons (MiB)"),
    ("goroutines", "goroutines, all daemons"),
    ("fds", "open file descriptors, all daemons"),
    ("redis_mib", "Redis used_memory (MiB)"),
    ("lag", "consumer lag (messages)"),
]
fig, axes = plt.subplots(3, 2, figsize=(11, 9), sharex=True)
for ax, (col, title) in zip(axes.flat, panels):
    ax.plot(minutes, [float(r[col]) for r in rows], linewidth=1.2)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
for ax in axes[-1]:
    ax.set_xlabel("minutes")
fig.suptitle("kfpipe soak (make soak): sampled every 10 s", fontsize=12)
fig.tight_layout()
fig.savefig(dst, dpi=90)
print(f"wrote {dst}")
