"""Spending caps: what the ledger says the model has cost, against `[limits]`; and each
person's rate of model calls.

Caps are per day and per month (in the agent's timezone), overall and per person (the
conversation's owner; a schedule's turns count for the person whose conversation it runs
in). Before every model call the turn asks `check`: at a cap it answers with a short
notice instead of calling the model; past `warn_at` of a cap the answer carries a note,
once per cap and period (a submission keyed by both: `claim_note`).
Amounts are the ledger's cost (USD) times `[limits] per_usd`, shown in `currency`.

The rate (`person_calls_per_hour`) is counted in places: a person's model calls in a
clock hour are the submissions `RATE` "<person>:<hour>:<n>", n below the rate, and
`check` takes the first free one for the call it clears (`_take_place`). A place is taken
by one commit, so several runners and workers, and restarts, never let more calls through
than there are places; a call that did not happen after all (a crash before it, a turn
that first waits for a compaction) costs its place, never lets one more through. With
every place taken the call is refused like one at a cap, the notice in full once per
person and hour and briefly after that (`Cap.repeated`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, replace
from datetime import datetime
from zoneinfo import ZoneInfo

from store import Store, Writes

NOTES = "budget-note"  # submissions: one note per cap and period
RATE = "budget-rate"  # submissions: one per model call a person may make in an hour
HOUR = 3600.0
PLACES_READ = 500  # places looked up at a time, from the first of the hour


@dataclass(frozen=True)
class Cap:
    name: str  # "daily", "monthly", or "hourly" (the rate)
    personal: bool  # the asker's own cap, not the overall one
    limit: float  # in the configured currency; for the rate, model calls
    spent: float
    period: str  # "2026-12-01", "2026-12": the note is once per this
    calls: bool = False  # the rate: limit and spent count model calls, not money
    resets: str = ""  # the rate: when its hour ends, on the agent's clock ("15:00 CET")
    repeated: bool = False  # its notice was said already this period: the short one

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
    """Where this person's next model call stands against the caps and the rate. Not a
    mere look: a call it clears has taken its place in the person's rate."""
    budget = config.limits
    at = at or time.time()
    caps = await _spending(store, config, owner, at)
    over = next((c for c in caps if c.reached), None)
    if over is not None:
        return Verdict(over=over)
    if owner and budget.person_calls_per_hour > 0:
        rate = await _take_place(store, config, owner, at)
        if rate is not None:
            return Verdict(over=rate)
    for cap in caps:
        if cap.spent >= cap.limit * budget.warn_at and \
                await store.submission_state(NOTES, _note_key(cap, owner)) is None:
            return Verdict(near=cap)
    return Verdict()


async def _spending(store: Store, config, owner: str | None, at: float) -> list[Cap]:
    budget = config.limits
    limits = [("daily", budget.daily_limit or 0.0, None), ("monthly", budget.monthly_limit, None)]
    if owner:
        limits += [("daily", budget.person_daily_limit, owner),
                   ("monthly", budget.person_monthly_limit, owner)]
    if not any(limit > 0 for _, limit, _ in limits):
        return []
    day_start, day, month_start, month = _starts(config.agent.timezone, at)
    caps = []
    for name, limit, who in limits:
        if limit <= 0:
            continue
        daily = name == "daily"
        spent = await store.spend_since(day_start if daily else month_start, owner=who)
        caps.append(Cap(name, who is not None, limit, spent * budget.per_usd,
                        day if daily else month))
    return caps


async def _take_place(store: Store, config, owner: str, at: float) -> Cap | None:
    """Take a free place in the person's rate for this hour (None), or say the rate is
    reached. The places are looked up from the first, so a busy hour costs one read; a
    place another runner took meanwhile is a duplicate commit, and the next one is tried."""
    limit = config.limits.person_calls_per_hour
    hour = int(at // HOUR)
    person = hashlib.sha256(owner.encode()).hexdigest()[:24]  # a short key for any owner
    places = [f"{person}:{hour}:{n}" for n in range(limit)]
    for start in range(0, limit, PLACES_READ):
        batch = places[start:start + PLACES_READ]
        taken = await store.known_submissions(RATE, batch)
        for place in batch:
            if place in taken:
                continue
            writes = Writes()
            writes.submit(RATE, place)
            if not (await store.commit(writes)).duplicate:
                return None
    ends = datetime.fromtimestamp((hour + 1) * HOUR, ZoneInfo(config.agent.timezone))
    cap = Cap("hourly", True, limit, limit, str(hour), calls=True,
              resets=ends.strftime("%H:%M %Z"))
    return replace(cap, repeated=not await claim_note(store, cap, owner))


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
    if cap.calls and cap.repeated:
        return f"(Still at your hourly rate: I am not calling the model before {cap.resets}.)"
    if cap.calls:
        return (f"I have reached your hourly rate ({cap.limit:g} model calls an hour), so I "
                f"am not calling the model before {cap.resets}. The owner can raise it in "
                "the [limits] section of the config.")
    return (f"I have reached {_which(cap)} ({money(cap.spent, currency)} of "
            f"{money(cap.limit, currency)}), so I am not calling the model until it resets. "
            "The owner can raise it in the [limits] section of the config.")


def near_note(cap: Cap, currency: str) -> str:
    return (f"(Spending is at {money(cap.spent, currency)} of {_which(cap)} of "
            f"{money(cap.limit, currency)}.)")


def summary(limits) -> str:
    """What bounds spend, in a line (`steward init`, `steward doctor`): "10.00 USD a day
    in all, 120 model calls an hour per person"; the defaults that are off are named."""
    money_of = [(limits.daily_limit or 0.0, "a day in all"),
                (limits.monthly_limit, "a month in all"),
                (limits.person_daily_limit, "a day per person"),
                (limits.person_monthly_limit, "a month per person")]
    on = [f"{money(amount, limits.currency)} {what}" for amount, what in money_of if amount > 0]
    if limits.person_calls_per_hour > 0:
        on.append(f"{limits.person_calls_per_hour} model calls an hour per person")
    off = ([] if limits.daily_limit else ["no daily cap"]) + \
        ([] if limits.person_calls_per_hour else ["no hourly rate"])
    return "; ".join(([", ".join(on)] if on else []) + off)
