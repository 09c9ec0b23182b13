"""The inspector's pages, one module per area; `ROUTES` is every path the server has."""

from bot.app.inspector.pages import conversations, health, search, usage, work

ROUTES = {
    "/": conversations.index,
    "/transcript": conversations.transcript,
    "/context": conversations.context,
    "/document": conversations.document,
    "/tasks": work.tasks,
    "/task": work.task,
    "/schedules": work.schedules,
    "/approvals": work.approvals,
    "/quarantine": work.quarantine,
    "/usage": usage.usage,
    "/search": search.search,
    "/health": health.health,
}
