"""Is Steward well: the `steward run` of this home and each of its loops' last progress
(`health.json`, as `steward doctor` judges it), the last good backup (doctor's own row),
and what went wrong in the last day (tasks that failed or last failed a try, inputs
quarantined, tasks a dead process left running)."""

import asyncio
import time

from aiohttp import web

from bot.app.backup_schedule import backup_status
from bot.app.doctor_checks import FAIL, OK, judge_health
from bot.app.inspector.html import link, table, tag, url
from bot.app.inspector.pages.layout import clip, conversation_keys, page, said, source, zone
from bot.app.inspector.pages.work import ERROR_CHARS, conversation_link, state_said
from bot.app.inspector.words import ago, kind_in_words
from bot.app.lease_holder import holder_alive
from bot.runtime.supervision import read_health
from store.inspect_reads import quarantined_since, recent_errors

DAY = 86400.0
LOOKBACK = 7 * DAY  # how far back a task may have been made and still fail today
SHOWN_ERRORS = 50
RUNNING_LOOKED_AT = 500  # running tasks checked for a dead holder


def _status(status: str, text) -> object:
    name = "ok" if status == OK else "fail" if status == FAIL else "warn"
    return tag("span", text, class_=f"status-{name}")


async def health(request: web.Request) -> web.Response:
    src = source(request)
    store, config = src.store, src.config
    now = time.time()
    owner_zone = zone(request)
    found = await asyncio.to_thread(read_health, config.home)
    status, detail, fix = judge_health(found, now)
    service = tag("div", tag("b", "steward run: "), _status(status, detail),
                  tag("div", fix, class_="meta") if fix else "", class_="box", id="service")
    loops = []
    for name, loop in ((found or {}).get("loops") or {}).items():
        last = loop.get("last_progress")
        loops.append([name, loop.get("state") or "-",
                      ago(now - float(last)) if last else "never",
                      loop.get("outages") or 0, loop.get("error") or "-"])
    connected = [[name, "connected" if up else "connecting"]
                 for name, up in ((found or {}).get("connected") or {}).items()]
    started = (found or {}).get("started_at")
    since = tag("p", f"started {ago(now - float(started))}, last said how it is "
                     f"{ago(now - float(found.get('updated_at') or now))}", class_="meta") \
        if found and started else ""
    b_status, b_detail, b_fix = await asyncio.to_thread(backup_status, config, now)
    backup = tag("div", tag("b", "backup: "), _status(b_status, b_detail),
                 tag("div", b_fix, class_="meta") if b_fix else "", class_="box", id="backup")
    async with store.reading() as conn:
        errors = await recent_errors(conn, now - DAY, lookback=LOOKBACK, limit=SHOWN_ERRORS)
        quarantined = await quarantined_since(conn, now - DAY)
    running = await store.list_tasks(state="running", limit=RUNNING_LOOKED_AT)
    stale = [t for t in running if t.stalled(now, holder_alive)]
    keys = await conversation_keys(store, [t.conversation_id for t in errors + stale])
    error_rows = [[said(t.updated_at, owner_zone, now),
                   tag("a", kind_in_words(t.kind, t.inputs), href=url("/task", id=t.id),
                       title=f"task {t.id}"),
                   conversation_link(keys, t.conversation_id), state_said(t, now),
                   tag("span", clip(t.error or t.state, ERROR_CHARS), class_="error")]
                  for t in errors]
    stale_rows = [[tag("a", kind_in_words(t.kind, t.inputs), href=url("/task", id=t.id),
                       title=f"task {t.id}"), conversation_link(keys, t.conversation_id),
                   f"held by {t.lease_owner or 'nobody'}, last change {ago(now - t.updated_at)}"]
                  for t in stale]
    inbound = (link(f"{quarantined} inbound item{'' if quarantined == 1 else 's'} "
                    "quarantined in the last day", "/quarantine") if quarantined
               else "nothing quarantined in the last day")
    return page("Health", "/health", service, since,
                table(["loop", "state", "last progress", "store outages waited out",
                       "last error"], loops, "no loops: `steward run` is not serving",
                      id="loops"),
                table(["connector", "now"], connected, "", id="connected") if connected
                else "", backup,
                tag("h2", "Errors of the last day"), tag("p", inbound, class_="meta"),
                table(["when", "what", "conversation", "state", "error"], error_rows,
                      "no errors in the last day", id="errors"),
                tag("h2", "Interrupted, will resume"),
                table(["what", "conversation", "why"], stale_rows,
                      "no task was left running by a process that is gone", id="stale"))
