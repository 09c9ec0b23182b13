"""Usage and cost per day and model: the ledger (`spend_report`, as `steward usage` reads
it, days in `[agent] timezone`, cost in `[limits] currency`) as a chart and a table."""

import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from aiohttp import web

from bot.app.inspector.chart import bar_chart
from bot.app.inspector.html import link, table, tag
from bot.app.inspector.pages.layout import int_param, page, source
from bot.app.inspector.words import amount, money

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
    models = sorted({r["model"] for r in found})
    cost = {m: [0.0] * days for m in models}
    calls_of = {m: [0.0] * days for m in models}
    shown = [r for r in found if r["day"] in position]  # a row stamped in the future
    for r in shown:                                      # (clock skew) is left out of all
        cost[r["model"]][position[r["day"]]] += r["cost"] * limits.per_usd
        calls_of[r["model"]][position[r["day"]]] += r["calls"]
    rows = [[datetime.fromtimestamp(r["day"] * DAY, UTC).strftime("%Y-%m-%d"),
             r["owner"] or "-", r["model"], r["calls"], r["input_tokens"], r["output_tokens"],
             amount(r["cost"] * limits.per_usd)] for r in reversed(shown)]
    total = sum(r["cost"] for r in shown) * limits.per_usd
    calls = sum(r["calls"] for r in shown)
    spans = [[" · ", link(f"{n} days", "/usage", days=n)] for n in (7, 30, 90, 365)]
    none = "no model calls in this period"
    unpriced = f"{calls} model call{'' if calls == 1 else 's'}, none with a cost " \
        "(a local model, or one without a price)"
    return page(f"Usage · the last {days} days", "/usage",
                tag("p", f"{calls} model calls, {money(total, limits.currency)}", spans,
                    class_="meta", id="totals"),
                tag("h2", f"Cost per day ({limits.currency})"),
                bar_chart("cost", labels, cost, limits.currency,
                          value_text=lambda v: f"{v:.4f} {limits.currency}",
                          empty=unpriced if calls else none),
                tag("h2", "Model calls per day"),
                bar_chart("calls", labels, calls_of, "calls", whole=True,
                          value_text=lambda v: f"{v:.0f} calls", empty=none),
                tag("h2", "By day, person and model"),
                table(["day", "person", "model", "calls", "input tokens", "output tokens",
                       f"cost ({limits.currency})"], rows,
                      f"no model calls in the last {days} days"))
