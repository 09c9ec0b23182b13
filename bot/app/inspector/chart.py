"""The usage chart: cost per day, one stacked bar per day with a segment per model, drawn
on the server as inline SVG (no script, no image request). Hovering a segment shows its
figures through SVG's own <title>."""

import math

from bot.app.inspector.html import Html, tag

PALETTE = ["#2456c7", "#e07b00", "#1b9e77", "#c2185b", "#7b52ab", "#8c6d1f", "#00838f",
           "#5d6d7e"]
WIDTH, HEIGHT = 1000, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 32, 64  # the unit above; day labels and legend below
MAX_LABELS = 15


def colours(models: list[str]) -> dict[str, str]:
    """A colour per model, the same on every page (by sorted name)."""
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(sorted(models))}


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value`: round gridlines."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value)


def cost_chart(days: list[str], cost: dict[str, list[float]], unit: str) -> Html:
    """`days` labels the bars in order; `cost[model][i]` is that model's cost on day i."""
    palette = colours(list(cost))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    totals = [sum(series[i] for series in cost.values()) for i in range(len(days))]
    top = nice_ceiling(max(totals, default=0.0))
    slot = plot_w / max(len(days), 1)
    parts = []
    for i in range(5):  # gridlines and their labels
        y = TOP + plot_h - plot_h * i / 4
        parts.append(tag("line", x1=LEFT, x2=WIDTH - RIGHT, y1=f"{y:.1f}", y2=f"{y:.1f}",
                         stroke="#e3e6ec" if i else "#8a93a5"))
        parts.append(tag("text", f"{top * i / 4:.2f}", x=LEFT - 6, y=f"{y + 4:.1f}",
                         text_anchor="end"))
    every = max(1, math.ceil(len(days) / MAX_LABELS))
    for i, day in enumerate(days):
        x = LEFT + slot * i + slot * 0.15
        base = TOP + plot_h
        for model in sorted(cost):
            value = cost[model][i]
            if value <= 0:
                continue
            h = plot_h * value / top
            base -= h
            parts.append(tag("rect", tag("title", f"{day} · {model}: {value:.4f} {unit}"),
                             x=f"{x:.1f}", y=f"{base:.1f}", width=f"{slot * 0.7:.1f}",
                             height=f"{h:.1f}", fill=palette[model]))
        if i % every == 0 or i == len(days) - 1:
            parts.append(tag("text", day, x=f"{x + slot * 0.35:.1f}", y=TOP + plot_h + 16,
                             text_anchor="middle"))
    if not any(totals):
        parts.append(tag("text", "no model calls in this period", x=LEFT + plot_w / 2,
                         y=TOP + plot_h / 2, text_anchor="middle"))
    x = LEFT
    for model, colour in palette.items():  # the legend, in one row under the labels
        parts.append(tag("rect", x=x, y=HEIGHT - 22, width=12, height=12, fill=colour))
        parts.append(tag("text", model, x=x + 16, y=HEIGHT - 12))
        x += 28 + 7 * len(model)
    parts.append(tag("text", unit, x=LEFT - 6, y=TOP - 14, text_anchor="end"))
    return tag("svg", parts, xmlns="http://www.w3.org/2000/svg", class_="chart",
               viewBox=f"0 0 {WIDTH} {HEIGHT}", width=WIDTH, height=HEIGHT, role="img",
               aria_label=f"cost per day and model, in {unit}")
