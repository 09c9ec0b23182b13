"""Compaction: old history becomes a summary entry (a head marker) so the context window
stays within bounds; the old entries stay on disk and searchable.

A compaction is a workflow task like any other (`bot/agent/compact.py`, next to the turn):
it picks the cut (here), spawns an `llm_call` for the summary (an effect sandwich, with its
usage in the ledger), and on success appends the summary as a `compaction` entry that
becomes the conversation's head in the same commit. A failed summary loses nothing: the
turn goes on with the oldest entries left out of its window, and compaction is tried again
later with backoff.

The cut keeps about `keep_recent_tokens` of the newest history verbatim and falls only at a
clean position: just before a user message, with no exchange open (see `Exchanges`), so a
tool call is never summarised while its result stays in the window, nor a question while
its answer does. A message taken back (withdrawn) is left out of the summary, as it is
left out of the context.
"""

import time

from bot.memory.transcript import PAGE, SPOKEN, entry_chars, withdrawn_by
from bot.provenance import of_entry
from store import FAILED, Entry, Store

KIND = "compact"
BACKOFF_BASE, BACKOFF_MAX = 60.0, 3600.0
LOOKBACK_PAGES = 10  # how far back a cut's open exchanges are looked for (see `open_at`)
SHORT_LINE = 300  # a line's length past the budget, while an open exchange is finished




def _calls(entry: Entry) -> set[str]:
    return {c["id"] for c in (entry.data or {}).get("tool_calls", [])}


def _question(entry: Entry) -> bool:
    """A message a turn answers (imported history and notes have no turn: none waits)."""
    return entry.kind == "user" and entry.task_id is not None


def _answered_upto(entry: Entry) -> int | None:
    """For a turn's final answer: the position up to which it took messages in."""
    data = entry.data or {}
    if entry.kind != "assistant" or not data.get("final"):
        return None
    return int(data.get("answers_upto", entry.seq))


class Exchanges:
    """What is open at a position, reading forward from a clean one.

    A tool call is open from its assistant entry until its result; the next assistant
    entry of any turn closes what is left (turns of a conversation run one at a time and
    record all their results before calling the model again, so a call still open then
    never gets one). A question (a user entry a turn answers) is open until a final answer
    that took it in (`answers_upto`), or until a note withdraws it. A position is clean
    when nothing is open and a user entry follows: the place for a cut."""

    def __init__(self, after: int = 0):
        self.calls: set[str] = set()
        self.questions: set[int] = set()
        self.answered = after

    @property
    def calls_closed(self) -> bool:
        return not self.calls

    @property
    def clean(self) -> bool:
        return not self.calls and not self.questions

    def add(self, entry: Entry) -> None:
        gone = withdrawn_by(entry)
        if gone:
            self.questions.difference_update(gone)
        if entry.kind == "tool_result":
            self.calls.discard((entry.data or {}).get("tool_call_id"))
        elif entry.kind == "assistant":
            self.calls = _calls(entry)
            upto = _answered_upto(entry)
            if upto is not None and upto > self.answered:
                self.answered = upto
                self.questions = {q for q in self.questions if q > upto}
        elif _question(entry) and entry.seq > self.answered:
            self.questions.add(entry.seq)


async def open_at(store: Store, conversation_id: int, cut: int, after: int) -> int | None:
    """None if nothing is open at position `cut` (everything up to it can be summarised
    while what follows stays verbatim), else the position of the oldest open thing: a tool
    call without its result by `cut`, or a question without its answer or withdrawal by
    `cut`. Reads backwards from `cut` to the last final answer and the position it
    answered up to (one turn's span), at most `LOOKBACK_PAGES` pages: a question older
    than that with no answer in between belongs to a turn that died."""
    results: set[str] = set()
    withdrawn: set[int] = set()
    questions: list[int] = []
    seen_assistant = False
    answered: int | None = None
    before = cut + 1
    for _ in range(LOOKBACK_PAGES):
        page = await store.entries_page(conversation_id, before=before, limit=PAGE)
        for entry in reversed(page):
            if entry.seq <= after or (answered is not None and entry.seq <= answered):
                page = []  # done: everything older is answered (or was cut cleanly before)
                break
            withdrawn.update(withdrawn_by(entry))
            if entry.kind == "tool_result" and not seen_assistant:
                results.add((entry.data or {}).get("tool_call_id"))
            elif entry.kind == "assistant":
                if not seen_assistant:
                    seen_assistant = True
                    if _calls(entry) - results:
                        return entry.seq
                upto = _answered_upto(entry)
                if upto is not None and answered is None:
                    answered = upto
            elif _question(entry):
                questions.append(entry.seq)
        if len(page) < PAGE:
            break
        before = page[0].seq
    still = [q for q in questions if q not in withdrawn]
    return min(still) if still else None


async def _user_at_or_before(store: Store, conversation_id: int, seq: int,
                             after: int) -> int | None:
    """The position of the newest user entry at or before `seq` and after `after`."""
    before = seq + 1
    while True:
        page = await store.entries_page(conversation_id, before=before, limit=PAGE)
        for entry in reversed(page):
            if entry.seq <= after:
                return None
            if entry.kind == "user":
                return entry.seq
        if len(page) < PAGE:
            return None
        before = page[0].seq


async def choose_cut(store: Store, conversation_id: int, *, after: int, last_seq: int,
                     keep_chars: int, most_chars: int | None = None) -> int | None:
    """The position to summarise up to: everything after it (at least `keep_chars` of the
    newest spoken history) stays verbatim, a user message follows it, and no exchange is
    open at it (`open_at`). None when there is nothing worth summarising.

    With `most_chars` (what a small window can hold of it), a message that would take the
    kept part past it is summarised with the older ones: the cut falls after it, where
    less is kept (a long paste in a 4k window would otherwise stay verbatim for good)."""
    kept, before, cut = 0, last_seq + 1, None
    within = None  # the oldest user position so far that keeps no more than most_chars
    while cut is None:
        page = await store.entries_page(conversation_id, before=before, limit=PAGE)
        for entry in reversed(page):
            if entry.seq <= after:
                return None
            if entry.kind in SPOKEN:
                kept += entry_chars(entry)
            if entry.kind != "user":
                continue
            if most_chars is not None and kept > most_chars and within is not None:
                cut = within
                break
            if kept >= keep_chars:
                cut = entry.seq - 1
                break
            if most_chars is not None and kept <= most_chars and entry.seq - 1 > after:
                within = entry.seq - 1
        else:
            if len(page) < PAGE:
                return None
            before = page[0].seq
    # Older cuts keep more: step back past whatever is open until a clean one.
    while cut > after:
        problem = await open_at(store, conversation_id, cut, after)
        if problem is None:
            return cut
        user = await _user_at_or_before(store, conversation_id, problem, after)
        if user is None:
            return None
        cut = user - 1
    return None


async def transcript_between(store: Store, conversation_id: int, after: int, upto: int,
                             budget_chars: int) -> tuple[str, int]:
    """The spoken entries in (after, upto] as text, oldest first, without withdrawn
    messages: (text, the last position included). `after` and `upto` are clean cuts;
    past the budget the text stops at the newest clean position before it (else at one
    where no tool call is open; else lines are shortened until the next such position),
    so the stop is a cut of the same kind."""
    lines: list[tuple[int, str]] = []  # (position, line)
    used, last = 0, after
    state = Exchanges(after)
    clean = relaxed = None  # the newest clean / calls-closed stop
    over = False

    def text(upto_seq: int) -> str:
        return "\n".join(line for seq, line in lines if seq <= upto_seq)

    while last < upto:
        page = await store.entries_page(conversation_id, after=last, limit=PAGE)
        if not page:
            break
        for entry in page:
            if entry.seq > upto:
                return text(last), last
            if entry.kind == "user" and lines and state.calls_closed:
                if over:
                    return text(last), last
                relaxed = last
                if state.clean:
                    clean = last
            gone = set(withdrawn_by(entry))
            if gone:  # the note always comes after what it takes back
                used -= sum(len(line) for seq, line in lines if seq in gone)
                lines = [(seq, line) for seq, line in lines if seq not in gone]
            state.add(entry)
            if entry.kind in SPOKEN:
                line = _line(entry)
                if not over and used + len(line) > budget_chars and lines:
                    stop = clean if clean is not None else relaxed
                    if stop is not None and any(seq <= stop for seq, _ in lines):
                        return text(stop), stop
                    over = True
                if over:
                    line = line[:SHORT_LINE]
                lines.append((entry.seq, line))
                used += len(line)
            last = entry.seq
    return text(last), last


def _line(entry: Entry) -> str:
    who = {"user": entry.author or "user", "assistant": "assistant",
           "tool_result": f"tool {(entry.data or {}).get('name', '')}"}[entry.kind]
    calls = "".join(f" [calls {c['name']}({c['arguments']})]"
                    for c in (entry.data or {}).get("tool_calls", []))
    return f"{who}: {entry.text[:4000]}{calls}"


async def outside_between(store: Store, conversation_id: int, after: int,
                          upto: int) -> str | None:
    """Why the entries in (after, upto] hold outside text (bot/provenance.py), or None: a
    summary of them keeps that mark."""
    while after < upto:
        page = await store.entries_page(conversation_id, after=after, limit=PAGE)
        for entry in page:
            if entry.seq > upto:
                return None
            if entry.kind in SPOKEN and (why := of_entry(entry)):
                return why
        if len(page) < PAGE:
            return None
        after = page[-1].seq
    return None


def _fruitless(task) -> bool:
    """A compaction that failed, or found nothing old enough to summarise (one message
    bigger than what is kept, say): trying again at once would do the same."""
    return task.state == FAILED or "skipped" in (task.result or {})


async def compaction_due(store: Store, conversation_id: int) -> bool:
    """Whether a new compaction may start: none running, and the backoff after the last
    fruitless ones (doubling, up to an hour) has passed."""
    recent = await store.list_tasks(kind=KIND, conversation_id=conversation_id,
                                    newest_first=True, limit=8)
    if any(not t.terminal for t in recent):
        return False
    failures = 0
    for t in recent:
        if not _fruitless(t):
            break
        failures += 1
    if not failures:
        return True
    wait = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** (failures - 1))
    return time.time() - recent[0].updated_at >= wait
