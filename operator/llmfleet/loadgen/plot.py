"""The sweep's TTFT-TPOT-throughput picture (matplotlib, Agg: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def draw_pareto(points: Sequence[dict], frontier: Sequence[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 5), constrained_layout=True)
    for axis, latency_key, label in ((axes[0], "ttft_p99_ms", "p99 TTFT (ms)"),
                                     (axes[1], "tpot_p99_ms", "p99 TPOT (ms)")):
        usable = [point for point in points if point[latency_key] is not None]
        axis.scatter([point["output_tokens_per_second"] for point in usable],
                     [point[latency_key] for point in usable], color="tab:gray", label="sweep step")
        for point in usable:
            axis.annotate(f"c={point['concurrency']}", (point["output_tokens_per_second"], point[latency_key]),
                          textcoords="offset points", xytext=(4, 4), fontsize=8)
        axis.plot([point["output_tokens_per_second"] for point in frontier],
                  [point[latency_key] for point in frontier], "o-", color="tab:red",
                  label="Pareto frontier (throughput, TTFT, TPOT)")
        axis.set_xlabel("output tokens/s")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        axis.legend(loc="upper left")
    figure.suptitle(title)
    figure.savefig(path, dpi=120)
    plt.close(figure)
