"""Usage and cost per day and model: the ledger (`spend_report`, as `steward usage` reads
it, days in `[agent] timezone`, cost in `[limits] currency`) as a chart and a table."""

import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from aiohttp import web

from bot.app.inspector.chart import cost_chart
from bot.app.inspector.html import link, table, tag
from bot.app.inspector.pages.layout import int_param, page, source

DAY = 86400


async def usage(request: web.Request) -> web.Response:
    src = source(request)
    days = min(int_param(request, "days", low=1, default=30), 366)
    limits = src.config.limits
    zone = ZoneInfo(src.config.agent.timezone)
    now = datetime.now(zone)
    offset = now.utcoffset().total_seconds()
    start = now.replace(hour=0, minute=0, second=0, microsecond=0).timestamp() \
        - DAY * (days - 1)
    found = await src.store.spend_report(start, day_offset=offset)
    today = int((time.time() + offset) // DAY)
    numbers = list(range(today - days + 1, today + 1))
    labels = [datetime.fromtimestamp(d * DAY, UTC).strftime("%m-%d") for d in numbers]
    position = {d: i for i, d in enumerate(numbers)}
    cost = {m: [0.0] * days for m in sorted({r["model"] for r in found})}
    for r in found:
        if r["day"] in position:  # a row stamped in the future (clock skew) is left out
            cost[r["model"]][position[r["day"]]] += r["cost"] * limits.per_usd
    rows = [[datetime.fromtimestamp(r["day"] * DAY, UTC).strftime("%Y-%m-%d"),
             r["owner"] or "-", r["model"], r["calls"], r["input_tokens"], r["output_tokens"],
             f"{r['cost'] * limits.per_usd:.4f}"] for r in reversed(found)]
    total = sum(r["cost"] for r in found) * limits.per_usd
    calls = sum(r["calls"] for r in found)
    spans = [[" · ", link(f"{n} days", "/usage", days=n)] for n in (7, 30, 90, 365)]
    return page(f"Usage · the last {days} days", "/usage",
                tag("p", f"{calls} model calls, {total:.2f} {limits.currency}", spans,
                    class_="meta"),
                cost_chart(labels, cost, limits.currency),
                tag("h2", "By day, person and model"),
                table(["day", "person", "model", "calls", "input tokens", "output tokens",
                       f"cost ({limits.currency})"], rows,
                      f"no model calls in the last {days} days"))
