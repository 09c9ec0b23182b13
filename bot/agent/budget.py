"""Spending caps: what the ledger says the model has cost, against `[limits]`.

Caps are per day and per month (in the agent's timezone), overall and per person (the
conversation's owner; a schedule's turns count for the person whose conversation it runs
in). Before every model call the turn asks `check`: at a cap it answers with a short
notice instead of calling the model; past `warn_at` of a cap the answer carries a note,
once per cap and period (a submission keyed by both: `claim_note`).
Amounts are the ledger's cost (USD) times `[limits] per_usd`, shown in `currency`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from store import Store, Writes

NOTES = "budget-note"  # submissions: one note per cap and period


@dataclass(frozen=True)
class Cap:
    name: str  # "daily" or "monthly"
    personal: bool  # the asker's own cap, not the overall one
    limit: float  # in the configured currency
    spent: float
    period: str  # "2026-12-01", "2026-12": the note is once per this

    @property
    def reached(self) -> bool:
        return self.spent >= self.limit


@dataclass(frozen=True)
class Verdict:
    over: Cap | None = None  # a cap is reached: do not call the model
    near: Cap | None = None  # past warn_at of a cap, not noted yet in its period


def _starts(zone: str, at: float) -> tuple[float, str, float, str]:
    local = datetime.fromtimestamp(at, ZoneInfo(zone))
    day = local.replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    return day.timestamp(), day.strftime("%Y-%m-%d"), month.timestamp(), month.strftime("%Y-%m")


async def check(store: Store, config, owner: str | None, *, at: float | None = None) -> Verdict:
    """Where this person's next model call stands against the caps."""
    budget = config.limits
    limits = [("daily", budget.daily_limit, None), ("monthly", budget.monthly_limit, None)]
    if owner:
        limits += [("daily", budget.person_daily_limit, owner),
                   ("monthly", budget.person_monthly_limit, owner)]
    if not any(limit > 0 for _, limit, _ in limits):
        return Verdict()
    day_start, day, month_start, month = _starts(config.agent.timezone, at or time.time())
    caps = []
    for name, limit, who in limits:
        if limit <= 0:
            continue
        daily = name == "daily"
        spent = await store.spend_since(day_start if daily else month_start, owner=who)
        caps.append(Cap(name, who is not None, limit, spent * budget.per_usd,
                        day if daily else month))
    over = next((c for c in caps if c.reached), None)
    if over is not None:
        return Verdict(over=over)
    for cap in caps:
        if cap.spent >= cap.limit * budget.warn_at and \
                await store.submission_state(NOTES, _note_key(cap, owner)) is None:
            return Verdict(near=cap)
    return Verdict()


def _note_key(cap: Cap, owner: str | None) -> str:
    return f"{cap.name}:{cap.period}:{owner if cap.personal else '*'}"


async def claim_note(store: Store, cap: Cap, owner: str | None) -> bool:
    """Take the one note of `cap` in its period: True for the first to ask. A commit of its
    own, so that turns of several conversations racing for it never undo each other's work
    (a crash right after it costs the note, never repeats it)."""
    writes = Writes()
    writes.submit(NOTES, _note_key(cap, owner))
    return not (await store.commit(writes)).duplicate


def money(amount: float, currency: str) -> str:
    return f"{amount:.2f} {currency}"


def _which(cap: Cap) -> str:
    return f"{'your' if cap.personal else 'the'} {cap.name} spending cap"


def over_notice(cap: Cap, currency: str) -> str:
    return (f"I have reached {_which(cap)} ({money(cap.spent, currency)} of "
            f"{money(cap.limit, currency)}), so I am not calling the model until it resets. "
            "The owner can raise it in the [limits] section of the config.")


def near_note(cap: Cap, currency: str) -> str:
    return (f"(Spending is at {money(cap.spent, currency)} of {_which(cap)} of "
            f"{money(cap.limit, currency)}.)")
