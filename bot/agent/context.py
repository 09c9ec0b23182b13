"""Building the request the model receives, in an order that keeps the provider's prompt
cache warm: the stable prefix first (system prompt, long-term facts, the latest compaction
summary), then the transcript after the summary's cut, read backwards from the tail page
by page until the window budget is spent. Time and memory depend on the window, never on
the length of the history: the head marker says where the context starts.
"""

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from bot.config import Config
from bot.llm.types import Message, Request, ToolCall, ToolSpec
from store import Conversation, Entry, Store

PAGE = 100
SPOKEN = ("user", "assistant", "tool_result")  # what the model sees; `aborted` etc. are not
WITHDRAWS = "withdraws"  # a note's data: positions of messages taken back (bot.agent.inbox)
CHARS_PER_TOKEN = 3  # before the provider has reported any usage: errs on the large side

BASE_PROMPT = """You are {name}, a personal assistant who lives in the user's chat and mailbox.
Be concise and concrete. Use the tools when they help; never invent their results.
A tool result that says it was interrupted means Steward restarted while the tool ran and
did not repeat it, because it may already have taken effect: check before retrying."""


def system_prompt(config: Config) -> str:
    prompt = BASE_PROMPT.format(name=config.agent.name)
    if config.agent.system_prompt:
        prompt += "\n\n" + config.agent.system_prompt
    return prompt


def entry_chars(entry: Entry) -> int:
    return len(entry.text) + 200 * len((entry.data or {}).get("tool_calls", []))


@dataclass
class Window:
    """The transcript part of a context: the summary the head marker holds (if any), the
    position it covers up to, and the spoken entries after it that fit the budget."""

    summary: str | None
    cut_seq: int
    entries: list[Entry]
    last_seq: int  # the conversation's position when read
    chars: int = 0
    complete: bool = True  # False: older entries after the cut did not fit the budget
    gap: int = 0  # when not complete: the size of the newest entry that did not fit


async def head_of(store: Store, conversation: Conversation) -> tuple[str | None, int]:
    """(summary, cut) from the conversation's head marker, or (None, 0)."""
    if not conversation.head_seq:
        return None, 0
    [marker] = await store.entries_page(conversation.id, after=conversation.head_seq - 1,
                                        limit=1)
    return marker.text, int((marker.data or {}).get("cut_seq", marker.seq))


def withdrawn_by(entry: Entry) -> list[int]:
    """The positions of the messages this entry says were taken back before they were
    answered (a deleted question): they are left out of the model's context. The note
    always comes after them."""
    return list((entry.data or {}).get(WITHDRAWS) or ())


async def read_window(store: Store, conversation: Conversation, budget_chars: int) -> Window:
    summary, cut = await head_of(store, conversation)
    picked: list[Entry] = []
    used = 0
    withdrawn: set[int] = set()
    before = conversation.last_seq + 1
    while True:
        page = await store.entries_page(conversation.id, before=before, limit=PAGE)
        for entry in reversed(page):
            if entry.seq <= cut:
                return Window(summary, cut, picked[::-1], conversation.last_seq, used)
            withdrawn.update(withdrawn_by(entry))
            if entry.kind not in SPOKEN or entry.seq in withdrawn:
                continue
            if used + entry_chars(entry) > budget_chars and picked:
                return Window(summary, cut, picked[::-1], conversation.last_seq, used, False,
                              entry_chars(entry))
            used += entry_chars(entry)
            picked.append(entry)
        if len(page) < PAGE:
            return Window(summary, cut, picked[::-1], conversation.last_seq, used)
        before = page[0].seq


class ContextCache:
    """The last window of each active conversation, extended with new entries instead of
    re-read, and dropped when the conversation goes idle (or the cache is full). A cached
    window is always the window `read_window` would give: it is read afresh when the head
    marker moved, or when older entries would fit again (the budget grew, or a message was
    taken back)."""

    def __init__(self, *, max_conversations: int = 64, idle_seconds: float = 600.0):
        self.max = max_conversations
        self.idle = idle_seconds
        self._windows: OrderedDict[int, tuple[float, int | None, Window]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    async def window(self, store: Store, conversation: Conversation,
                     budget_chars: int) -> Window:
        now = time.monotonic()
        for cid, (used_at, *_rest) in list(self._windows.items()):
            if now - used_at > self.idle:
                del self._windows[cid]
        cached = self._windows.pop(conversation.id, None)
        window = None
        if cached and cached[1] == conversation.head_seq:
            window = await _extend(store, conversation, cached[2], budget_chars)
        if window is None:
            window = await read_window(store, conversation, budget_chars)
        self._windows[conversation.id] = (now, conversation.head_seq, window)
        while len(self._windows) > self.max:
            self._windows.popitem(last=False)
        return window


async def _extend(store: Store, conversation: Conversation, window: Window,
                  budget_chars: int) -> Window | None:
    """`window` brought up to the conversation's newest entries and to the budget, or None
    when it must be read afresh (older entries than it holds would fit now)."""
    entries, used = list(window.entries), window.chars
    after = window.last_seq
    while after < conversation.last_seq:
        page = await store.entries_page(conversation.id, after=after, limit=PAGE)
        for entry in page:
            gone = set(withdrawn_by(entry))
            if gone:
                if not window.complete and min(gone) < (entries[0].seq if entries else 0):
                    return None  # perhaps the entry that did not fit: read afresh
                used -= sum(entry_chars(e) for e in entries if e.seq in gone)
                entries = [e for e in entries if e.seq not in gone]
            if entry.kind in SPOKEN:
                entries.append(entry)
                used += entry_chars(entry)
        if len(page) < PAGE:
            break
        after = page[-1].seq
    complete, gap = window.complete, window.gap
    if not complete and used + gap <= budget_chars:
        return None  # room for older entries: read afresh
    while len(entries) > 1 and used > budget_chars:
        gap = entry_chars(entries.pop(0))
        used -= gap
        complete = False
    return Window(window.summary, window.cut_seq, entries, conversation.last_seq, used,
                  complete, gap if not complete else 0)


def answer_order(entries: list[Entry]) -> list[Entry]:
    """Entries in the order the conversation happened for the model: a follow-up that
    arrived while an earlier turn was working comes after that turn's answer, not in the
    middle of it (otherwise the model would see its own answer as the last word). Every
    assistant entry of a turn says which messages the turn took in (`answers_upto`); held
    messages up to there belong before it."""
    ordered: list[Entry] = []
    held: list[Entry] = []
    working = None  # the turn whose user message was shown and whose answer was not

    def release(upto: int) -> None:
        nonlocal held
        ordered.extend(h for h in held if h.seq <= upto)
        held = [h for h in held if h.seq > upto]

    for e in entries:
        if e.kind == "user":
            if working is not None and e.task_id is not None and e.task_id != working:
                held.append(e)
                continue
            working = e.task_id
        data = e.data or {}
        if e.kind == "assistant" and e.task_id == working and "answers_upto" in data:
            release(data["answers_upto"])
        ordered.append(e)
        if e.kind == "assistant" and data.get("final") and e.task_id == working:
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


@dataclass
class Assembled:
    request: Request
    estimated_tokens: int
    window: Window = field(repr=False)


async def tokens_per_char(store: Store, conversation_id: int) -> float:
    """From the provider's last reported usage in this conversation: its input tokens over
    the characters of the request that produced them."""
    result = await store.last_result(kind="llm_call", conversation_id=conversation_id)
    if isinstance(result, dict) and result.get("request_chars"):
        usage = (result.get("response") or {}).get("usage") or {}
        if usage.get("input_tokens"):
            return usage["input_tokens"] / result["request_chars"]
    return 1 / CHARS_PER_TOKEN


def request_chars(request: Request) -> int:
    return sum(len(m.content) + sum(len(str(c.arguments)) + 50 for c in m.tool_calls)
               for m in request.messages) + sum(len(str(t.parameters)) for t in request.tools)


async def build_request(store: Store, config: Config, conversation_id: int, *,
                        tools: list[ToolSpec], model: str, upto: int | None = None,
                        facts: str = "", cache: ContextCache | None = None,
                        recall=None) -> Assembled:
    """The request for the model. `recall(conversation, text, in_window)` may return
    memories found outside the window for the newest message; they go last but one."""
    conversation = await store.get_conversation_by_id(conversation_id)
    ratio = await tokens_per_char(store, conversation_id)
    window_tokens = config.llm.context_window - config.llm.max_output_tokens
    prompt = system_prompt(config)
    if facts:
        prompt += "\n\nWhat you know about the people here (long-term memory):\n" + facts
    fixed = len(prompt) + sum(len(str(t.parameters)) + len(t.description) for t in tools)
    budget = max(int(window_tokens / ratio) - fixed, 2000)
    if cache is not None:
        window = await cache.window(store, conversation, budget)
    else:
        window = await read_window(store, conversation, budget)
    if window.summary:
        prompt += ("\n\nSummary of the earlier conversation (the full messages are kept; "
                   "search_history finds them):\n" + window.summary)
    entries = [e for e in window.entries
               if not (e.kind == "user" and upto is not None and e.seq > upto)]
    messages = to_messages(entries)
    # A window cut mid-exchange starts at the next user message (some providers insist).
    first_user = next((i for i, m in enumerate(messages) if m.role == "user"), 0)
    messages = messages[first_user:]
    last_user = next((i for i in range(len(messages) - 1, -1, -1)
                      if messages[i].role == "user"), None)
    if recall is not None and last_user is not None:
        found = await recall(conversation, messages[last_user].content,
                             {e.id for e in window.entries})
        if found:
            messages.insert(last_user, Message(role="system", content=(
                "Possibly relevant, from earlier history (search_history has more):\n"
                + found)))
    request = Request(model=model, max_tokens=config.llm.max_output_tokens, tools=tools,
                      messages=[Message(role="system", content=prompt), *messages])
    return Assembled(request, int(request_chars(request) * ratio) + 1, window)
