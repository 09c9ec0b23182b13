"""Work and what came in: tasks by state with their phases, one task whole, schedules,
approvals waiting for a person, quarantined submissions."""

import asyncio
import json
import time

from aiohttp import web

from bot.agent.approval import KIND as APPROVAL
from bot.agent.approval import code_of
from bot.app.doctor_checks import OK, judge_health
from bot.app.inspector.html import Html, link, table, tag, url
from bot.app.inspector.pages.layout import (
    PAGE_SIZE,
    as_json,
    clip,
    conversation_keys,
    decoded,
    folded,
    page,
    said,
    source,
    state_class,
    text_param,
    when,
    zone,
)
from bot.app.inspector.words import (
    ago,
    kind_in_words,
    state_in_words,
    trigger_in_words,
    waiting_for,
)
from bot.app.lease_holder import holder_alive
from bot.runtime.supervision import read_health
from store import STATES

ERROR_CHARS = 300  # of a task's error in a listing; the task's page has all of it


def conversation_link(keys: dict[int, str], conversation_id: int | None):
    if conversation_id is None:
        return "-"
    return link(keys[conversation_id], "/transcript", key=keys[conversation_id])


async def tasks(request: web.Request) -> web.Response:
    store = source(request).store
    state = text_param(request, "state")
    if state is not None and state not in STATES:
        raise web.HTTPBadRequest(text=f"state must be one of {', '.join(STATES)}")
    kind = text_param(request, "kind")
    key = text_param(request, "key")
    before = text_param(request, "before_id")
    conversation_id = (await store.get_conversation(key)).id if key else None
    counts = await store.count_tasks()
    tabs = [tag("a", f"all ({sum(counts.values())})", href=_tasks_url(None, kind, key),
                class_=None if state else "here")]
    tabs += [tag("a", f"{s} ({counts.get(s, 0)})", href=_tasks_url(s, kind, key),
                 class_="here" if s == state else None) for s in STATES]
    found = await store.list_tasks(state=state, kind=kind, conversation_id=conversation_id,
                                   before_id=before, newest_first=True, limit=PAGE_SIZE)
    keys = await conversation_keys(store, [t.conversation_id for t in found])
    now = time.time()
    rows = [[tag("a", kind_in_words(t.kind, t.inputs), href=url("/task", id=t.id),
                 title=f"task {t.id}"),
             conversation_link(keys, t.conversation_id), state_said(t, now), t.phase or "start",
             _nowrap(ago(now - t.created_at)), _nowrap(ago(now - t.updated_at)),
             _tries(t),
             tag("span", clip(t.error, ERROR_CHARS), class_="error") if t.error else "-"]
            for t in found]
    more = (tag("div", tag("a", "older tasks →",
                           href=_tasks_url(state, kind, key, before_id=found[-1].id)),
                class_="pager")
            if len(found) == PAGE_SIZE else "")
    scope = "".join(f" · {label} {value}" for label, value in (("kind", kind), ("of", key))
                    if value)
    return page("Tasks" + scope, "/tasks", await _serving(source(request).config.home),
                tag("div", tabs, class_="tabs"),
                table(["what", "conversation", "state", "step", "started", "last change",
                       "tries", "error"], rows,
                      f"no {state} tasks" if state else "no tasks", id="tasks"), more)


async def _serving(home) -> str:
    """One line on the `steward run` of this home, as `steward doctor` judges its health."""
    health = await asyncio.to_thread(read_health, home)
    status, detail, fix = judge_health(health, time.time())
    return tag("p", f"{detail}{f' ({fix})' if fix else ''}",
               class_="error" if status != OK else None)


def state_said(t, now: float) -> Html:
    """The state in words; a "running" task nobody runs is "interrupted — will resume"
    (the next `steward run` takes it up again)."""
    stale = t.stalled(now, holder_alive)
    return tag("span", state_in_words(t.state, stale),
               class_="state-resumes" if stale else f"state-{t.state}",
               title=f"state {t.state}" + (f", lease of {t.lease_owner} until "
                                          f"{when(t.lease_expires)}" if t.lease_owner else ""))


def _nowrap(text: str) -> Html:
    return tag("span", text, class_="nowrap")


def _tries(t) -> str:
    said = []
    if t.attempts:
        said.append(f"{t.attempts} failed")
    if t.crashes:
        said.append(f"{t.crashes} crash{'es' if t.crashes > 1 else ''}")
    return ", ".join(said) or "-"


def _tasks_url(state, kind, key, before_id=None) -> str:
    return url("/tasks", state=state, kind=kind, key=key, before_id=before_id)


async def task(request: web.Request) -> web.Response:
    store = source(request).store
    task_id = text_param(request, "id", required=True)
    t = await store.get_task(task_id)
    keys = await conversation_keys(store, [t.conversation_id])
    children = await store.list_tasks(parent_id=t.id, limit=PAGE_SIZE)
    now = time.time()
    facts = [["what", kind_in_words(t.kind, t.inputs)], ["kind", t.kind],
             ["state", state_said(t, now)], ["phase", t.phase or "(start)"],
             ["attempts (failed tries of this phase)", t.attempts],
             ["crashes (since its last phase)", t.crashes],
             ["parent", link(t.parent_id, "/task", id=t.parent_id) if t.parent_id else "-"],
             ["conversation", conversation_link(keys, t.conversation_id)],
             ["waits for", t.wait_mode or "-"], ["due", when(t.run_after or None)],
             ["lease", f"{t.lease_owner} until {when(t.lease_expires)}" if t.lease_owner
              else "-"],
             ["idempotency key", t.idem_key or "-"],
             ["created", f"{when(t.created_at)} ({ago(now - t.created_at)})"],
             ["updated", f"{when(t.updated_at)} ({ago(now - t.updated_at)})"],
             ["error", tag("pre", clip(t.error), class_="error") if t.error else "-"]]
    kids = [[tag("a", kind_in_words(c.kind, c.inputs), href=url("/task", id=c.id),
                 title=f"task {c.id}"), state_said(c, now), c.phase or "(start)",
             ago(now - c.updated_at)] for c in children]
    return page(f"Task {t.id}", "/tasks", table(["", ""], facts, ""),
                tag("h2", "Children"),
                table(["what", "state", "step", "last change"], kids, "no child tasks"),
                tag("h2", "Inputs"), as_json(t.inputs),
                tag("h2", "Checkpoint"), as_json(t.checkpoint),
                tag("h2", "Result"), as_json(t.result))


async def schedules(request: web.Request) -> web.Response:
    store = source(request).store
    everything = request.query.get("all") == "1"
    found = await store.list_schedules(state=None if everything else "active", limit=200)
    keys = await conversation_keys(store, [s.conversation_id for s in found])
    owner_zone, now = zone(request), time.time()

    def next_time(s):
        if s.next_fire_at is None:
            return "-"
        return [said(s.next_fire_at, owner_zone, now), f" ({ago(now - s.next_fire_at)})"]

    rows = [[s.name, tag("span", trigger_in_words(s.trigger, s.timezone),
                         title=json.dumps(s.trigger)),
             next_time(s), said(s.last_fire_at, owner_zone, now) if s.last_fire_at else "never",
             f"{s.fired} time{'' if s.fired == 1 else 's'}", state_class(s.state),
             conversation_link(keys, s.conversation_id), s.deliver.get("channel") or "-",
             tag("pre", clip(s.prompt, 500))] for s in found]
    toggle = (link("only active ones", "/schedules") if everything
              else link("also finished and cancelled ones", "/schedules", all=1))
    return page("Schedules", "/schedules",
                tag("p", f"Times in {owner_zone.key}. ", toggle, class_="meta"),
                table(["name", "when", "next", "last", "fired", "state", "conversation",
                       "delivers to", "does"], rows,
                      "no schedules" if everything else "no active schedules",
                      id="schedules"))


async def approvals(request: web.Request) -> web.Response:
    """Requests waiting for a person's yes. Answered elsewhere (a reply, Slack's buttons,
    `steward ask "yes CODE"`): this page only shows them."""
    store = source(request).store
    waiting = await store.list_tasks(kind=APPROVAL, active=True, limit=200)
    answered = await store.list_tasks(kind=APPROVAL, active=False, newest_first=True,
                                      limit=20)
    keys = await conversation_keys(store, [t.conversation_id for t in waiting + answered])

    def call(t):
        c = (t.inputs or {}).get("call") or {}
        return tag("code", c.get("name", "?"), "(",
                   json.dumps(c.get("arguments"), ensure_ascii=False), ")")

    owner_zone, now = zone(request), time.time()

    def asks(t):
        return f"may I {(t.inputs or {}).get('summary') or 'do this'}?"

    rows = [[waiting_for((t.inputs or {}).get("who"), t.created_at, owner_zone, now),
             asks(t), tag("details", tag("summary", "the tool call"), call(t)),
             (t.inputs or {}).get("channel") or "-", tag("code", code_of(t.id)),
             _expires((t.inputs or {}).get("expires_at"), now),
             conversation_link(keys, t.conversation_id)] for t in waiting]
    done = [[said(t.updated_at, owner_zone, now), (t.inputs or {}).get("who") or "-", asks(t),
             (t.result or {}).get("approval") or t.state,
             conversation_link(keys, t.conversation_id), link("task", "/task", id=t.id)]
            for t in answered]
    return page("Approvals pending", "/approvals",
                tag("p", "Answer in the conversation the request went to (yes CODE / no "
                         "CODE, or Slack's buttons); this page only shows them.",
                    class_="meta"),
                table(["waiting", "asks", "tool call", "channel", "code", "refused unless "
                       "answered", "conversation"], rows, "no approvals pending",
                      id="approvals"),
                tag("h2", "Recently settled"),
                table(["settled", "who", "asked", "outcome", "conversation", "task"], done,
                      "none settled yet", id="settled"))


def _expires(at, now: float) -> str:
    try:
        return ago(now - float(at))
    except (TypeError, ValueError):
        return "-"


async def quarantine(request: web.Request) -> web.Response:
    store = source(request).store
    channel = text_param(request, "channel")
    found = await store.list_submissions(state="quarantined", channel=channel, limit=200)
    rows = [[when(q["created_at"]), q["channel"], q["external_id"],
             tag("pre", clip(q["reason"] or "-", 2000)), folded("payload", decoded(q["payload"]))]
            for q in found]
    channels = sorted({q["channel"] for q in found})
    filters = [link("all", "/quarantine")] + [[" · ", link(c, "/quarantine", channel=c)]
                                              for c in channels]
    return page("Quarantine" + (f" · {channel}" if channel else ""), "/quarantine",
                tag("p", "Inbound items that could not be processed, with the reason. They "
                         "are kept, never retried.", class_="meta"),
                tag("p", filters, class_="tabs"),
                table(["when", "channel", "external id", "reason", "payload"], rows,
                      f"nothing quarantined from {channel}" if channel
                      else "nothing quarantined"))

