"""Building the request the model receives: system prompt, then the transcript's tail read
backwards page by page until the window budget is spent. Never the whole transcript."""

from bot.config import Config
from bot.llm.types import Message, Request, ToolCall, ToolSpec
from store import Entry, Store

PAGE = 100
SPOKEN = ("user", "assistant", "tool_result")  # what the model sees; `aborted` etc. are not
CHARS_PER_TOKEN = 3  # conservative: more text per token would only leave headroom

BASE_PROMPT = """You are {name}, a personal assistant who lives in the user's chat and mailbox.
Be concise and concrete. Use the tools when they help; never invent their results.
A tool result that says it was interrupted means Steward restarted while the tool ran and
did not repeat it, because it may already have taken effect: check before retrying."""


def system_prompt(config: Config) -> str:
    prompt = BASE_PROMPT.format(name=config.agent.name)
    if config.agent.system_prompt:
        prompt += "\n\n" + config.agent.system_prompt
    return prompt


async def tail_entries(store: Store, conversation_id: int, *, budget_chars: int,
                       upto: int | None = None) -> list[Entry]:
    """The newest entries that fit in `budget_chars`, oldest first. User entries after
    `upto` belong to later turns (follow-ups wait their turn) and are left out."""
    picked: list[Entry] = []
    used = 0
    before = None
    while True:
        page = await store.entries_page(conversation_id, before=before, limit=PAGE)
        for entry in reversed(page):
            if entry.kind == "user" and upto is not None and entry.seq > upto:
                continue
            if entry.kind not in SPOKEN:
                continue
            used += len(entry.text) + 200 * len((entry.data or {}).get("tool_calls", []))
            if used > budget_chars and picked:
                return picked[::-1]
            picked.append(entry)
        if len(page) < PAGE:
            return picked[::-1]
        before = page[0].seq


def answer_order(entries: list[Entry]) -> list[Entry]:
    """Entries in the order the conversation happened for the model: a follow-up that
    arrived while an earlier turn was working comes after that turn's answer, not in the
    middle of it (otherwise the model would see its own answer as the last word)."""
    ordered: list[Entry] = []
    held: list[Entry] = []
    working = None  # the turn whose user message was shown and whose answer was not
    for e in entries:
        if e.kind == "user":
            if working is not None and e.task_id is not None and e.task_id != working:
                held.append(e)
                continue
            working = e.task_id
        ordered.append(e)
        if e.kind == "assistant" and (e.data or {}).get("final") and e.task_id == working:
            ordered.extend(held)
            working = held[0].task_id if held else None
            held = []
    return ordered + held


def to_messages(entries: list[Entry]) -> list[Message]:
    """Entries as messages, with the tool-call pairing every provider insists on: results
    without their call are dropped, calls without a result get one saying so."""
    messages: list[Message] = []
    open_calls: dict[str, str] = {}

    def close_open_calls():
        for call_id, name in open_calls.items():
            messages.append(Message(role="tool", tool_call_id=call_id, name=name, is_error=True,
                                    content="error: no result was recorded for this call"))
        open_calls.clear()

    for e in answer_order([e for e in entries if e.kind in SPOKEN]):
        data = e.data or {}
        if e.kind == "tool_result":
            call_id = data.get("tool_call_id")
            if call_id in open_calls:
                messages.append(Message(role="tool", content=e.text, tool_call_id=call_id,
                                        name=open_calls.pop(call_id),
                                        is_error=bool(data.get("is_error"))))
            continue
        close_open_calls()
        if e.kind == "user":
            messages.append(Message(role="user", content=e.text))
        else:
            calls = [ToolCall.model_validate(c) for c in data.get("tool_calls", [])]
            messages.append(Message(role="assistant", content=e.text, tool_calls=calls))
            open_calls.update((c.id, c.name) for c in calls)
    close_open_calls()
    return messages


async def build_request(store: Store, config: Config, conversation_id: int, *,
                        tools: list[ToolSpec], model: str, upto: int | None = None) -> Request:
    window = config.llm.context_window - config.llm.max_output_tokens
    prompt = system_prompt(config)
    budget = max(window * CHARS_PER_TOKEN - len(prompt), 1000)
    entries = await tail_entries(store, conversation_id, budget_chars=budget, upto=upto)
    messages = to_messages(entries)
    # A window cut mid-exchange starts at the next user message (some providers insist).
    first_user = next((i for i, m in enumerate(messages) if m.role == "user"), 0)
    return Request(model=model, max_tokens=config.llm.max_output_tokens, tools=tools,
                   messages=[Message(role="system", content=prompt), *messages[first_user:]])
