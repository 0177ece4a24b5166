"""Plots the JSON lines of `make bench` (results.jsonl) as two PNGs:
throughput per scenario next to its baseline, and p50/p99 latency per
scenario next to its baseline's where it has one.

    python3 plot.py results.jsonl docs/
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, outdir):
    rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]

    tp = [r for r in rows if r.get("baseline_msgs_per_sec")]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    x = range(len(tp))
    ax.bar([i - 0.2 for i in x], [r["msgs_per_sec"] for r in tp], 0.4, label="pipeline")
    ax.bar([i + 0.2 for i in x], [r["baseline_msgs_per_sec"] for r in tp], 0.4, label="baseline (raw librdkafka / no attackers)")
    for i, r in zip(x, tp):
        ax.text(i - 0.2, r["msgs_per_sec"], f'{r["msgs_per_sec"]:,.0f}', ha="center", va="bottom", fontsize=7)
        ax.text(i + 0.2, r["baseline_msgs_per_sec"], f'{r["baseline_msgs_per_sec"]:,.0f}', ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(x), [f'{r["scenario"]}\nvs {r["baseline"]}' for r in tp], fontsize=7)
    ax.set_ylabel("messages / s")
    ax.set_yscale("log")
    ax.set_title("kfpipe throughput (2 cores, broker + Redis on the same machine)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{outdir}/bench-throughput.png", dpi=110)

    lat = [r for r in rows if r.get("p99_ms")]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    x = range(len(lat))
    ax.bar([i - 0.3 for i in x], [r["p50_ms"] for r in lat], 0.2, label="p50")
    ax.bar([i - 0.1 for i in x], [r["p99_ms"] for r in lat], 0.2, label="p99")
    bp50 = [r.get("extra", {}).get("baseline_p50_ms", 0) for r in lat]
    bp99 = [r.get("extra", {}).get("baseline_p99_ms", 0) for r in lat]
    ax.bar([i + 0.1 for i in x], bp50, 0.2, label="baseline p50")
    ax.bar([i + 0.3 for i in x], bp99, 0.2, label="baseline p99")
    for i, r in zip(x, lat):
        ax.text(i - 0.1, r["p99_ms"], f'{r["p99_ms"]:.1f}', ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.axhline(100, color="red", lw=0.8, ls="--")
    ax.text(len(lat) - 0.5, 100, "seed target p99 100 ms", color="red", fontsize=7, ha="right", va="bottom")
    ax.set_xticks(list(x), [f'{r["scenario"]}\n({r["extra"].get("latency", "produce -> handler")[:40]})' if r.get("extra") else r["scenario"] for r in lat], fontsize=6)
    ax.set_ylabel("ms")
    ax.set_title("kfpipe latency per scenario")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{outdir}/bench-latency.png", dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
