"""The run as a picture (pure: SVG text, no plotting library): replicas over time above, each
request's TTFT at its arrival below (log scale, the SLO as a line, misses in red)."""

from __future__ import annotations

import math
from xml.sax.saxutils import escape

from llmfleet.simulation.fleet import FleetRun

WIDTH, PANEL_HEIGHT, MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, GAP = 900, 220, 70, 20, 40, 50
# More dots than this add bytes, not information: requests are thinned evenly beyond it.
MAX_DOTS = 20_000


def _step_points(run: FleetRun, serving: bool) -> list[tuple[float, int]]:
    times = sorted({0.0, run.end_s} | {t for span in run.replicas
                                       for t in (span.created_s, span.ready_s, span.removed_s, span.ended_s)
                                       if t is not None and t <= run.end_s})
    return [(time_s, run.replicas_at(time_s)[1 if serving else 0]) for time_s in times]


def timeline_svg(run: FleetRun, slo_ttft_ms: float, title: str) -> str:
    end_s = max(run.end_s, 1e-9)
    plot_width = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    top1, top2 = MARGIN_TOP, MARGIN_TOP + PANEL_HEIGHT + GAP
    height = top2 + PANEL_HEIGHT + 40

    def x(time_s: float) -> float:
        return MARGIN_LEFT + plot_width * time_s / end_s

    existing, serving = _step_points(run, False), _step_points(run, True)
    most = max([count for _, count in existing] + [1])

    def y_replicas(count: float) -> float:
        return top1 + PANEL_HEIGHT * (1 - count / most)

    def step_path(points: list[tuple[float, int]]) -> str:
        path, previous = [], None
        for time_s, count in points:
            if previous is not None:
                path.append(f"L{x(time_s):.1f},{y_replicas(previous):.1f}")
            path.append(f"{'M' if previous is None else 'L'}{x(time_s):.1f},{y_replicas(count):.1f}")
            previous = count
        return " ".join(path)

    ttfts = [(request.arrival.arrival_ms / 1000, request.ttft_ms) for request in run.requests
             if request.ttft_ms is not None]
    low = max(1.0, min([ttft for _, ttft in ttfts] + [slo_ttft_ms]) / 2)
    high = max([ttft for _, ttft in ttfts] + [slo_ttft_ms]) * 2

    def y_ttft(ttft_ms: float) -> float:
        share = (math.log10(max(ttft_ms, low)) - math.log10(low)) / (math.log10(high) - math.log10(low))
        return top2 + PANEL_HEIGHT * (1 - share)

    stride = max(1, math.ceil(len(ttfts) / MAX_DOTS))
    dots = [f'<circle cx="{x(at_s):.1f}" cy="{y_ttft(ttft):.1f}" r="1.2" '
            f'fill="{"#d62728" if ttft > slo_ttft_ms else "#1f77b4"}"/>' for at_s, ttft in ttfts[::stride]]
    decades = [10 ** power for power in range(math.ceil(math.log10(low)), math.floor(math.log10(high)) + 1)]
    seconds_ticks = [end_s * share / 5 for share in range(6)]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
        'font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="13">{escape(title)}</text>',
        f'<rect x="{MARGIN_LEFT}" y="{top1}" width="{plot_width}" height="{PANEL_HEIGHT}" fill="none" stroke="#888"/>',
        f'<rect x="{MARGIN_LEFT}" y="{top2}" width="{plot_width}" height="{PANEL_HEIGHT}" fill="none" stroke="#888"/>',
        f'<path d="{step_path(existing)}" fill="none" stroke="#ff7f0e" stroke-width="1.5"/>',
        f'<path d="{step_path(serving)}" fill="none" stroke="#2ca02c" stroke-width="1.5"/>',
        f'<text x="{MARGIN_LEFT + 5}" y="{top1 + 14}" fill="#ff7f0e">replicas (starting and draining included)</text>',
        f'<text x="{MARGIN_LEFT + 5}" y="{top1 + 28}" fill="#2ca02c">replicas serving</text>',
        *(f'<text x="{MARGIN_LEFT - 6}" y="{y_replicas(count) + 4:.1f}" text-anchor="end">{count}</text>'
          for count in sorted({0, most})),
        *dots,
        f'<line x1="{MARGIN_LEFT}" x2="{WIDTH - MARGIN_RIGHT}" y1="{y_ttft(slo_ttft_ms):.1f}" '
        f'y2="{y_ttft(slo_ttft_ms):.1f}" stroke="#d62728" stroke-dasharray="4,3"/>',
        f'<text x="{WIDTH - MARGIN_RIGHT - 5}" y="{y_ttft(slo_ttft_ms) - 4:.1f}" text-anchor="end" '
        f'fill="#d62728">SLO {slo_ttft_ms:g} ms</text>',
        f'<text x="{MARGIN_LEFT + 5}" y="{top2 + 14}">TTFT per request (ms, log scale), at its arrival</text>',
        *(f'<text x="{MARGIN_LEFT - 6}" y="{y_ttft(value) + 4:.1f}" text-anchor="end">{value:g}</text>'
          for value in decades),
        *(f'<text x="{x(tick):.1f}" y="{top2 + PANEL_HEIGHT + 16}" text-anchor="middle">{tick:.0f}</text>'
          for tick in seconds_ticks),
        f'<text x="{MARGIN_LEFT + plot_width / 2}" y="{top2 + PANEL_HEIGHT + 32}" text-anchor="middle">'
        'time (s)</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"
