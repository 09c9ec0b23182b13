"""The usage charts (cost per day, calls per day): one stacked bar per day with a segment
per model, drawn on the server as inline SVG (no script, no image request). Hovering a
segment shows its figures through SVG's own <title>."""

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


def nice_step(value: float, *, whole: bool = False) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value`: a gridline step
    whose multiples are round (`whole`: at least 1, for counts)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    step = next(s * power for s in (1, 2, 5, 10) if s * power >= value * (1 - 1e-9))
    return max(step, 1.0) if whole else step


def tick(value: float, step: float) -> str:
    """A gridline's label with the decimals its step needs: 0.001 stays 0.001, never 0.00."""
    if value == 0:
        return "0"
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{value:.{decimals}f}"


GRIDLINES = 4  # above the baseline


def bar_chart(name: str, days: list[str], series: dict[str, list[float]], unit: str, *,
              value_text, empty: str, whole: bool = False) -> Html:
    """One stacked bar per day, a segment per model; `series[model][i]` is that model's
    value on day i. The axis goes up in round steps labelled with the digits they need;
    `value_text(v)` says a segment's value on hover; `empty` is said when nothing is drawn
    (the caller knows why: no calls, or calls that cost nothing)."""
    palette = colours(list(series))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    totals = [sum(values[i] for values in series.values()) for i in range(len(days))]
    step = nice_step(max(totals, default=0.0) / GRIDLINES, whole=whole)
    top = step * GRIDLINES
    slot = plot_w / max(len(days), 1)
    parts = []
    for i in range(GRIDLINES + 1):  # gridlines and their labels
        y = TOP + plot_h - plot_h * i / GRIDLINES
        parts.append(tag("line", x1=LEFT, x2=WIDTH - RIGHT, y1=f"{y:.1f}", y2=f"{y:.1f}",
                         stroke="#e3e6ec" if i else "#8a93a5"))
        parts.append(tag("text", tick(step * i, step), x=LEFT - 6, y=f"{y + 4:.1f}",
                         text_anchor="end", class_="y"))
    every = max(1, math.ceil(len(days) / MAX_LABELS))
    for i, day in enumerate(days):
        x = LEFT + slot * i + slot * 0.15
        base = TOP + plot_h
        for model in sorted(series):
            value = series[model][i]
            if value <= 0:
                continue
            h = max(plot_h * value / top, 1.0)  # a cost too small to see is still a line
            base -= h
            parts.append(tag("rect", tag("title", f"{day} · {model}: {value_text(value)}"),
                             x=f"{x:.1f}", y=f"{base:.1f}", width=f"{slot * 0.7:.1f}",
                             height=f"{h:.1f}", fill=palette[model]))
        if i % every == 0 or i == len(days) - 1:
            parts.append(tag("text", day, x=f"{x + slot * 0.35:.1f}", y=TOP + plot_h + 16,
                             text_anchor="middle"))
    if not any(totals):
        parts.append(tag("text", empty, x=LEFT + plot_w / 2, y=TOP + plot_h / 2,
                         text_anchor="middle", class_="empty"))
    x = LEFT
    for model, colour in palette.items():  # the legend, in one row under the labels
        parts.append(tag("rect", x=x, y=HEIGHT - 22, width=12, height=12, fill=colour))
        parts.append(tag("text", model, x=x + 16, y=HEIGHT - 12))
        x += 28 + 7 * len(model)
    parts.append(tag("text", unit, x=LEFT - 6, y=TOP - 14, text_anchor="end"))
    return tag("svg", parts, xmlns="http://www.w3.org/2000/svg", class_="chart", id=name,
               viewBox=f"0 0 {WIDTH} {HEIGHT}", width=WIDTH, height=HEIGHT, role="img",
               aria_label=f"{name} per day and model, in {unit}")
