"""Chaos: one real `steward run` with Slack (HTTP mode, the fake Slack) and email (Dovecot and
an SMTP sink) enabled, a fake LLM that streams slowly and calls a tool before it answers,
a seeded random workload, and a killer that SIGKILLs the process at random instants and
right after activity, then starts it again. At the end the killing stops, Steward runs
until nothing more happens, and is stopped with SIGTERM (exit 0).

Then the test counts what the outside world received, from the fake Slack and the SMTP
sink (never from Steward's database): every allowed message has exactly one complete
answer in the right place (a top-level DM in the DM, a thread reply or a channel mention
in its thread, a mail as a reply in its mail thread to the sender); a stranger's DM is
refused once per conversation; channel chatter, a stranger's mail and an auto-reply get
nothing. Each user message carries a unique token (`m17`); the model's answer names the
tokens of the messages it answers (those after its last answer in the request, of the
request's own conversation) and ends with a marker, so "complete" is read off the final
text of the streamed, edited Slack message or the mail. Several queued follow-ups may be
answered together by one answer: each token must be in exactly one complete answer.

It prints `kills=K messages=N lost=X duplicate=Y wrong=Z (seed S); in doubt D` and fails
on any non-zero count of the first three, listing each message concerned. A mail answer
the SMTP server received twice under one Message-ID is in doubt by design when Steward's
run log says, for that Message-ID, that the reply "is sent again under the same
Message-ID" (`connectors/email/channel.py` `find`: killed between the final dot and the
mark on its Sent copy, the one window in doubt, Steward sends it again rather than risk
losing it; the receiver sees one message); these, and only these, are counted apart (D).
A DATA cut off before the final dot (the sink keeps what it held) was not sent, and
Steward must send it again: missing, that answer is lost, as is an answer missing for any
other reason.

The long run also fails unless its workload exercised each thing it is there for: a Slack
retry, an acknowledged event sent again, a thread reply acknowledged before its thread's
first message, a mail sent while Steward was down, and a tool call (its result back at the
model). The short run only prints these.

    STEWARD_CHAOS_SEED=123       replay a seed (else a random one, always printed)
    STEWARD_CHAOS_KILLS=15       kills (self-kills at internal kill points included)
    STEWARD_CHAOS_MESSAGES=40    user messages
    STEWARD_CHAOS_VERBOSE=1      also print every message and everything received (-s)

The short run is in the default suite (SQLite); the long one is `-m slow`, on both
backends (`STEWARD_CHAOS_KILLS`/`_MESSAGES` size both runs when set).
"""

from __future__ import annotations

import asyncio
import email.message
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from connectors.slack.inbound import REFUSAL
from tests.fakes.chaos_sender import SlackSender
from tests.fakes.chaos_servers import ChaosSink, ChaosSlack
from tests.fakes.chaos_steward import Killer, Steward
from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.fakes.mail_rig import ALLOWED, email_toml, mail
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
)
from tests.fakes.slack_events import mention_of, mentions, says
from tests.fakes.slack_rig import ENV, free_port
from tests.fakes.slack_server import BOT_ID

ALICE, BOB, EVE = "U0ALICE", "U0BOB", "U0EVE"  # Eve is not in allowed_users
ALLOWED_USERS = (ALICE, BOB)
CHANNEL = "C0GENERAL"
STRANGER = "eve@example.net"
MARKER = "END-OF-ANSWER"
TOKEN = re.compile(r"(?<![\w@.<])m\d+\b")
REFUSED = REFUSAL[:60]  # a bot message carrying this is the refusal
CHUNK, DELAY = 3, 0.025  # the model streams 3 characters every 25 ms

# kind: (weight, what is due: "answer", "refusal" or "nothing")
KINDS = {
    "dm": (18, "answer"),  # an allowed person's DM, top level
    "dm_reply": (10, "answer"),  # a reply in the thread under one of their DMs
    "mention": (10, "answer"),  # a channel message mentioning Steward
    "mention_reply": (10, "answer"),  # a reply (no mention) in a mention's thread
    "stranger_dm": (5, "refusal"),  # Eve's DM: refused once per conversation
    "stranger_reply": (2, "refusal"),  # Eve in a thread of her DM: its own conversation
    "chatter": (5, "nothing"),  # channel talk without a mention
    "chatter_reply": (3, "nothing"),  # a reply in a thread Steward is not in
    "mail_new": (12, "answer"),  # mail from the allowed sender, a new thread
    "mail_reply": (10, "answer"),  # a reply in one of their mail threads
    "mail_stranger": (3, "nothing"),  # mail from a sender not allowed
    "mail_auto": (3, "nothing"),  # Auto-Submitted: auto-replied, from the allowed sender
}
THREAD_OF = {"dm_reply": "dm", "mention_reply": "mention", "stranger_reply": "stranger_dm",
             "chatter_reply": "chatter", "mail_reply": "mail_new"}
SAYINGS = ["what time is it?", "can you check the time for me", "is it late already?",
           "remind me what day it is", "please look at the clock", "how are we doing?"]


def size(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def chaos_seed() -> int:
    return int(os.environ.get("STEWARD_CHAOS_SEED") or random.SystemRandom().randrange(10**6))


# -- the workload ---------------------------------------------------------------------


@dataclass
class Msg:
    n: int
    kind: str
    author: str
    root: Msg | None  # the first message of the thread it replies in
    at: float  # when it is sent, in seconds from the start
    saying: str
    channel: str = ""  # Slack
    ts: str = ""
    event_ids: list[str] = field(default_factory=list)
    message_id: str = ""  # mail
    parent_id: str = ""  # mail: its In-Reply-To
    sent_at: float | None = None
    while_down: bool = False

    @property
    def token(self) -> str:
        return f"m{self.n}"

    @property
    def due(self) -> str:
        return KINDS[self.kind][1]

    @property
    def is_mail(self) -> bool:
        return self.kind.startswith("mail")

    @property
    def conv(self) -> tuple[str, str]:
        """The conversation it belongs to (the model answers per conversation)."""
        if self.root is not None:
            return ("mail" if self.is_mail else "thread", self.root.token)
        if self.kind in ("dm", "stranger_dm"):
            return ("dm", self.author)
        return ("mail" if self.is_mail else "thread", self.token)

    def slack_place(self) -> tuple[str, str | None]:
        """(channel, thread ts or None) where its answer or refusal belongs."""
        if self.root is not None:
            return self.root.channel, self.root.ts
        return (self.channel, None) if self.kind in ("dm", "stranger_dm") else (
            self.channel, self.ts)

    def describe(self) -> str:
        if self.is_mail:
            where = f"mail <{self.message_id}>"
            if self.parent_id:
                where += f" in reply to <{self.parent_id}>"
        else:
            where = f"{self.author} in {self.channel} ts {self.ts}"
            if self.root is not None:
                where += f" (thread {self.root.ts}, root {self.root.token})"
            where += f", events {','.join(self.event_ids)}"
        down = ", sent while steward was down" if self.while_down else ""
        return f"{self.token} [{self.kind}] {where}{down}"


def plan(rng: random.Random, count: int, gap: float) -> list[Msg]:
    names, weights = list(KINDS), [w for w, _ in KINDS.values()]
    roots: dict[str, list[Msg]] = {kind: [] for kind in THREAD_OF.values()}
    msgs: list[Msg] = []
    replies = {root: reply for reply, root in THREAD_OF.items()}
    at, follow = 0.5, None
    for n in range(1, count + 1):
        kind = rng.choices(names, weights)[0]
        root = None
        if follow is not None:  # a reply right after the thread's first message
            kind, root, follow = replies[follow.kind], follow, None
        elif kind in THREAD_OF:
            if roots[THREAD_OF[kind]]:
                root = rng.choice(roots[THREAD_OF[kind]][-4:])
            else:
                kind = THREAD_OF[kind]  # no thread to reply in yet: start one
        if kind in ("stranger_dm", "stranger_reply"):
            author = EVE
        elif kind == "dm_reply":
            author = root.author
        elif kind == "mail_stranger":
            author = STRANGER
        elif kind.startswith("mail"):
            author = ALLOWED
        else:
            author = rng.choice(ALLOWED_USERS)
        m = Msg(n, kind, author, root, at, rng.choice(SAYINGS))
        msgs.append(m)
        if kind in roots:
            roots[kind].append(m)
            if rng.random() < 0.3:
                follow = m
        at += rng.uniform(0.02, 0.3) if follow is not None else rng.expovariate(1 / gap)
    return msgs


class Model:
    """The fake LLM's responder: a tool call first (the clock, a safe tool), then the
    answer, naming the tokens of the messages after the last answer in the request that
    belong to the conversation of the newest one (a thread's history, fetched when Steward
    enters the thread, may hold other conversations' messages: context, not asked)."""

    def __init__(self, convs: dict[str, tuple[str, str]], trip):
        self.convs = convs
        self.trip = trip

    def __call__(self, request: dict, wire: str) -> Reply:
        self.trip("llm")
        messages = request.get("messages") or []
        if request.get("tools") and messages and messages[-1].get("role") != "tool":
            return Reply(tool_calls=[("call_clock", "current_time", {})], chunk_chars=CHUNK,
                         delay=DELAY)
        found: list[str] = []
        for message in reversed(messages):
            if message.get("role") == "assistant" and not message.get("tool_calls"):
                break
            if message.get("role") == "user":
                found[:0] = TOKEN.findall(_text(message.get("content")))
        conv = self.convs.get(found[-1]) if found else None
        tokens = [t for t in dict.fromkeys(found) if self.convs.get(t) == conv]
        return Reply(text=answer_text(tokens), chunk_chars=CHUNK, delay=DELAY)


def _text(content) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def answer_text(tokens: list[str]) -> str:
    return (f"Answer to {' '.join(tokens) or 'nothing'}: I looked at the clock, it is a fine "
            f"time, and there is nothing else you need to do about it today. {MARKER}")


# -- what the outside world received --------------------------------------------------


@dataclass
class Output:
    where: tuple  # ("slack", channel, thread ts or None) or ("mail", In-Reply-To)
    text: str
    tokens: list[str]
    complete: bool
    mail: email.message.Message | None = None
    rcpt: list[str] = field(default_factory=list)
    key: str = ""  # Slack: the delivery key in the message's metadata

    def show(self) -> str:
        text = " ".join(self.text.split())
        text = text if len(text) <= 90 else text[:87] + "..."
        if self.mail is not None:
            refs = " ".join((self.mail.get("References") or "").split())
            return (f"mail {self.mail.get('Message-ID')} to {','.join(self.rcpt)} In-Reply-To "
                    f"{self.where[1]} References [{refs}]: {text!r}")
        return f"slack {self.where[1]} thread {self.where[2]} key {self.key}: {text!r}"


def received(slack: ChaosSlack, sink: ChaosSink) -> tuple[list[Output], list[Output]]:
    """(answers, refusals) as Slack and the SMTP sink show them now."""
    answers, refusals = [], []
    with slack._lock:
        channels = list(slack.messages)
    for channel in channels:
        for m in slack.history(channel):
            if m.get("bot_id") != BOT_ID:
                continue
            thread = m.get("thread_ts")
            out = Output(("slack", channel, thread if thread != m["ts"] else None),
                         m.get("text") or "", [], False, key=str(
                             ((m.get("metadata") or {}).get("event_payload") or {}).get("key")
                             or ""))
            if REFUSED in out.text:
                refusals.append(out)
                continue
            out.tokens = TOKEN.findall(out.text)
            out.complete = out.text.rstrip().endswith(MARKER)
            answers.append(out)
    for captured in list(sink.messages):
        msg = captured.message
        part = next((p for p in msg.walk() if p.get_content_type() == "text/plain"), msg)
        body = (part.get_payload(decode=True) or b"").decode(
            part.get_content_charset() or "utf-8", "replace")
        answers.append(Output(("mail", _strip(msg.get("In-Reply-To"))), body,
                              TOKEN.findall(body), body.rstrip().endswith(MARKER), msg,
                              list(captured.rcpt_tos)))
    return answers, refusals


def cut_off(sink: ChaosSink) -> list[Output]:
    """The mail answers whose DATA the connection ended before the final dot (Steward was
    killed inside the exchange): the server dropped them, and Steward must send them
    again. Read from what the sink received, dot-stuffing undone."""
    out = []
    for raw in sink.cut_off:
        lines = [line[1:] if line.startswith(b"..") else line for line in raw.splitlines(True)]
        msg = email.message_from_bytes(b"".join(lines))
        part = next((p for p in msg.walk() if p.get_content_type() == "text/plain"), msg)
        body = (part.get_payload(decode=True) or b"").decode(
            part.get_content_charset() or "utf-8", "replace")
        out.append(Output(("mail", _strip(msg.get("In-Reply-To"))), body, TOKEN.findall(body),
                          body.rstrip().endswith(MARKER), msg, []))
    return out


def _strip(value) -> str:
    return str(value or "").strip().strip("<>")


def _one_reply_sent_again(hits: list[Output], again: set[str]) -> bool:
    """Copies of one mail reply, under one Message-ID that Steward's log says it sent
    again after a cut (the final-dot window): one message to the receiver."""
    ids = {_strip(a.mail.get("Message-ID")) if a.mail is not None else None for a in hits}
    return len(ids) == 1 and ids <= again


def right_place(m: Msg, out: Output, msgs: list[Msg]) -> bool:
    if m.is_mail:
        if out.mail is None:
            return False
        thread = {x.message_id for x in msgs if x.is_mail and x.conv == m.conv and x.sent_at}
        root = (m.root or m).message_id
        refs = (out.mail.get("References") or "").split()
        return (out.rcpt == [ALLOWED] and out.where[1] in thread and bool(refs)
                and _strip(refs[0]) == root
                and str(out.mail.get("Subject") or "").startswith("Re:"))
    return out.where == ("slack", *m.slack_place())


@dataclass
class Tally:
    lost: list[str] = field(default_factory=list)
    duplicate: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    # Mail answers sent again under one Message-ID, killed in the final-dot window.
    in_doubt: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicate or self.wrong)


def tally(msgs: list[Msg], answers: list[Output], refusals: list[Output],
          sent_copies: dict[str, list[str]] | None = None,
          cut: list[Output] | None = None, again: set[str] | None = None) -> Tally:
    """`sent_copies`: In-Reply-To -> the copies in the Sent folder (for diagnosis only).
    `cut`: mail answers the SMTP server got all of but the final dot (see `cut_off`): not
    sent, never in doubt. `again`: the Message-IDs of replies Steward's log says it sent
    again after a cut (see `SentAgain`); a mail answer received more than once is in doubt
    only if all its copies carry one Message-ID, and that one is among them."""
    t = Tally()
    cut = [c for c in cut or [] if c.complete]
    again = again or set()
    sent_copies = sent_copies or {}
    sent = [m for m in msgs if m.sent_at is not None]
    complete = [a for a in answers if a.complete]
    used: set[int] = set()  # ids of outputs accounted for

    def listing(outs: list[Output]) -> str:
        return "".join(f"\n      -> {o.show()}" for o in outs) or "\n      -> (nothing)"

    for m in sent:
        if m.due == "answer":
            hits = [a for a in complete if m.token in a.tokens]
            # What else showed up for it: a cut-off answer naming it, or a message saying
            # no answer could be had, in its place.
            here = ("mail", m.message_id) if m.is_mail else ("slack", *m.slack_place())
            partial = [a for a in answers if not a.complete and (
                m.token in a.tokens or (not a.tokens and a.where == here))]
            used.update(id(a) for a in hits)
            if not hits:
                used.update(id(a) for a in partial)
                journaled = "".join(f"\n      Sent folder: {c}"
                                    for c in sent_copies.get(m.message_id, []))
                cuts = [c for c in cut if m.token in c.tokens] if m.is_mail else []
                # Cut off before the final dot: not sent, and Steward should have sent it
                # again.
                note = "\n      (cut off inside DATA, before the final dot: it should have " \
                       "been sent again)" if cuts else ""
                t.lost.append(f"lost {m.describe()}{listing(cuts or partial)}{note}"
                              f"{journaled}")
            elif len(hits) > 1 and _one_reply_sent_again(hits, again):
                t.in_doubt.append(f"in doubt {m.describe()}: sent again under one Message-ID"
                                  f"{listing(hits)}")
            elif len(hits) > 1:
                t.duplicate.append(f"duplicate {m.describe()}: {len(hits)} answers"
                                   f"{listing(hits)}")
            elif not right_place(m, hits[0], msgs):
                t.wrong.append(f"wrong place {m.describe()}{listing(hits)}")
        else:
            hits = [a for a in answers if m.token in a.tokens]
            used.update(id(a) for a in hits)
            if hits:
                should = "nothing" if m.due == "nothing" else "a refusal only"
                t.wrong.append(f"answered (should get {should}) {m.describe()}{listing(hits)}")

    due_refusals: dict[tuple, list[Msg]] = {}
    for m in sent:
        if m.due == "refusal":
            due_refusals.setdefault(("slack", *m.slack_place()), []).append(m)
    for where, refused in due_refusals.items():
        here = [r for r in refusals if r.where == where]
        used.update(id(r) for r in here)
        names = ", ".join(m.describe() for m in refused)
        if not here:
            t.lost.append(f"lost refusal in {where[1]} thread {where[2]} for {names}")
        elif len(here) > 1:
            t.duplicate.append(f"duplicate refusal: {len(here)} in {where[1]} thread "
                               f"{where[2]} for {names}")
    for r in refusals:
        if id(r) not in used:
            t.wrong.append(f"refusal where none was due: {r.show()}")
    for a in answers:
        if id(a) in used:
            continue
        what = "an incomplete answer" if not a.complete else "an answer to nothing asked"
        t.wrong.append(f"stray output, {what}: {a.show()}")
    return t


async def sent_folder(account) -> dict[str, list[str]]:
    """In-Reply-To -> "<Message-ID> flags (...)" of each copy in the Sent folder."""
    def work(c):
        typ, _ = c.select("Sent", readonly=True)
        if typ != "OK":
            return {}
        typ, data = c.uid("FETCH", "1:*", "(FLAGS BODY.PEEK[HEADER.FIELDS (MESSAGE-ID "
                                          "IN-REPLY-TO)])")
        found: dict[str, list[str]] = {}
        for part in data:
            if not isinstance(part, tuple):
                continue
            head = email.message_from_bytes(part[1])
            flags = re.search(rb"FLAGS \(([^)]*)\)", part[0])
            found.setdefault(_strip(head.get("In-Reply-To")), []).append(
                f"{head.get('Message-ID')} flags ({(flags.group(1) if flags else b'').decode()})")
        return found
    return await asyncio.to_thread(account._call, work)


# `connectors/email/channel.py` `find`, sending a reply cut off before its Sent copy was
# marked (after the final dot) again.
SENT_AGAIN = re.compile(r"reply <([^>\s]+)> was cut off before its Sent copy was marked as "
                        r"sent:[^\n]*sent again under the same Message-ID")


class SentAgain:
    """The Message-IDs of the replies Steward's run logs (`run*.log` in its home) say were
    sent again after a cut. Read again on each call, a log only from where it grew (the
    logs of dead runs never change)."""

    def __init__(self, home: Path):
        self.home = home
        self._read: dict[Path, int] = {}
        self._found: set[str] = set()

    def __call__(self) -> set[str]:
        for path in sorted(self.home.glob("run*.log")):
            with open(path, "rb") as f:
                f.seek(self._read.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written is read next time
            self._read[path] = self._read.get(path, 0) + end
            self._found.update(SENT_AGAIN.findall(data[:end].decode(errors="replace")))
        return set(self._found)


ULID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")
OWN_ID = re.compile(r"<(c\d+(?:-[0-9a-f]+)?\.[^>@]+@[^>]+)>")


def log_lines(home: Path, problem: str, limit: int = 6) -> str:
    """The run logs' lines naming a task or reply that the problem's listing names."""
    needles = set(ULID.findall(problem)) | set(OWN_ID.findall(problem))
    if not needles:
        return ""
    found = []
    for path in sorted(home.glob("run*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if any(n in line for n in needles):
                found.append(f"\n      log {path.name}: {line[:260]}")
    more = f"\n      log: ... {len(found) - limit} more" if len(found) > limit else ""
    return "".join(found[:limit]) + more


def satisfied(msgs: list[Msg], slack: ChaosSlack, sink: ChaosSink) -> bool:
    """Everything due is there (maybe more: the count tells)."""
    answers, refusals = received(slack, sink)
    tokens = {t for a in answers if a.complete for t in a.tokens}
    places = {r.where for r in refusals}
    for m in msgs:
        if m.sent_at is None:
            return False
        if m.due == "answer" and m.token not in tokens:
            return False
        if m.due == "refusal" and ("slack", *m.slack_place()) not in places:
            return False
    return True


# -- the run --------------------------------------------------------------------------


def write_config(home: Path, store_url: str, llm: FakeLLMServer, slack: ChaosSlack,
                 port: int, account, sink: ChaosSink) -> None:
    home.mkdir(parents=True)
    users = ", ".join(f'"{u}"' for u in ALLOWED_USERS)
    (home / "config.toml").write_text(f"""
[store]
url = "{store_url}"
[llm]
provider = "openai"
base_url = "{llm.url}/v1"
model = "fake-model"
[slack]
enabled = true
mode = "http"
http_port = {port}
api_base_url = "{slack.url}"
allowed_users = [{users}]
stream_update_seconds = 0.15
{email_toml(account, sink)}[runtime]
lease_seconds = 2.0
retry_base_seconds = 0.05
retry_max_seconds = 0.1
drain_seconds = 5.0
[limits]
person_calls_per_hour = 0  # hundreds of messages an hour from a few people, on purpose
""")


def environment(home: Path, account) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_", "SLACK_"))}
    env.update(ENV, STEWARD_HOME=str(home), STEWARD_CONFIG=str(home / "config.toml"),
               STEWARD_IMAP_PASSWORD=account.password)
    return env


class Workload:
    def __init__(self, msgs: list[Msg], seed: int, slack: ChaosSlack, sink: ChaosSink,
                 account, sender: SlackSender, steward: Steward, killer: Killer,
                 rng: random.Random):
        self.msgs = msgs
        self.seed = seed
        self.slack = slack
        self.sink = sink
        self.account = account
        self.sender = sender
        self.steward = steward
        self.killer = killer
        self.rng = rng

    async def run(self) -> None:
        began = time.monotonic()
        for m in self.msgs:
            await asyncio.sleep(max(0.0, began + m.at - time.monotonic()))
            m.while_down = not self.steward.alive or self.steward.killed
            if m.is_mail:
                await self._mail(m)
            else:
                self._slack(m)
            m.sent_at = time.monotonic()
        self.sender.close()

    def _slack(self, m: Msg) -> None:
        if m.root is not None:
            m.channel = m.root.channel
        elif m.kind in ("dm", "stranger_dm"):
            m.channel = self.slack.dm_of(m.author)
        else:
            m.channel = CHANNEL
        text = f"{m.token} {m.saying}"
        if m.kind == "mention":
            text = mentions(text)
        stored, body = says(self.slack, m.channel, m.author, text,
                            thread_ts=m.root.ts if m.root is not None else None)
        m.ts = stored["ts"]
        bodies = [body] + ([mention_of(stored, m.channel)] if m.kind == "mention" else [])
        for b in bodies:
            m.event_ids.append(b["event_id"])
            self.sender.put(b)

    async def _mail(self, m: Msg) -> None:
        domain = "example.net" if m.kind == "mail_stranger" else "example.com"
        m.message_id = f"{m.token}.s{self.seed}@{domain}"
        body = f"Please take care of {m.token}, thanks. {m.saying.capitalize()}"
        headers = {"Auto-Submitted": "auto-replied"} if m.kind == "mail_auto" else None
        if m.root is None:
            raw = mail(sender=m.author, subject=f"Errand {m.n}", body=body,
                       message_id=m.message_id, headers=headers)
        else:
            thread = [x for x in self.msgs if x.conv == m.conv and x.sent_at is not None]
            references = [x.message_id for x in thread]
            ours = [o.mail for o in received(self.slack, self.sink)[0]
                    if o.mail is not None and (o.mail.get("References") or "").split()[:1]
                    == [f"<{m.root.message_id}>"]]
            if ours and self.rng.random() < 0.5:  # a reply to Steward's reply
                theirs = ours[-1]
                references = [_strip(r) for r in (theirs.get("References") or "").split()]
                references.append(_strip(theirs.get("Message-ID")))
            m.parent_id = references[-1]
            raw = mail(sender=m.author, subject=f"Re: Errand {m.root.n}", body=body,
                       message_id=m.message_id, in_reply_to=m.parent_id,
                       references=references)
        await self.account.append(raw)
        self.killer.trip("mail-append")


async def quiesce(steward: Steward, slack: ChaosSlack, sink: ChaosSink,
                  llm: FakeLLMServer, sender: SlackSender, done, *, quiet: float,
                  give_up: float) -> bool:
    """Wait until everything due is in and nothing has happened for `quiet` seconds (or,
    if something is missing, nothing for `give_up` seconds). True if all is in."""
    assert await steward.ready(), steward.tail()
    last, changed = None, time.monotonic()
    while True:
        now = time.monotonic()
        mark = (len(slack.calls), len(sink.messages), len(sink.stages), len(llm.requests),
                sender.drained)
        if mark != last:
            last, changed = mark, now
        if sender.drained:
            if now - changed >= quiet and done():
                return True
            if now - changed >= give_up:
                return False
        if not steward.alive:
            raise AssertionError(f"steward died while settling:\n{steward.tail()}")
        await asyncio.sleep(0.1)


async def chaos(home: Path, store_url: str, account, *, kills: int, messages: int, seed: int,
                budget: float, require_coverage: bool = False) -> str:
    """`require_coverage`: fail unless the workload exercised each thing it is meant to
    (see the module's docstring); else that is only printed."""
    print(f"chaos: seed {seed}, {kills} kills, {messages} messages, logs in {home}")
    msgs = plan(random.Random(f"{seed}:plan"), messages,
                gap=max(0.25, kills * 3.4 / max(1, messages)))
    convs = {m.token: m.conv for m in msgs}
    again = SentAgain(home)
    with ChaosSlack() as slack, FakeLLMServer() as llm:
        for user, name in ((ALICE, "Alice"), (BOB, "Bob"), (EVE, "Eve")):
            slack.add_user(user, name)
        sink = await ChaosSink().start()
        port = free_port()
        write_config(home, store_url, llm, slack, port, account, sink)
        steward = Steward(home, environment(home, account), port)
        killer = Killer(steward, random.Random(f"{seed}:kill"))
        sender = SlackSender(f"http://127.0.0.1:{port}/slack/events",
                             random.Random(f"{seed}:send"), on_ack=lambda: killer.trip("ack"))
        llm.responder = Model(convs, killer.trip)
        slack.on_call = lambda method, _params, result: result.get("ok") and killer.trip(
            {"chat.postMessage": "slack-post", "chat.update": "slack-update"}.get(
                method, "slack-other"))
        sink.on_smtp = lambda stage: killer.trip(f"smtp-{stage}")
        workload = Workload(msgs, seed, slack, sink, account, sender, steward, killer,
                            random.Random(f"{seed}:mail"))
        tasks: list[asyncio.Task] = []
        settled = False
        try:
            async with asyncio.timeout(budget):
                await steward.start()
                tasks = [asyncio.create_task(sender.run()),
                         asyncio.create_task(workload.run()),
                         asyncio.create_task(killer.run(kills))]
                await asyncio.gather(*tasks)
                settled = await quiesce(steward, slack, sink, llm, sender,
                                        lambda: satisfied(msgs, slack, sink),
                                        quiet=5.0, give_up=20.0)
                code = await steward.terminate()
        except TimeoutError:
            pytest.fail(f"chaos: the test's own timeout ({budget:.0f} s), seed {seed}, "
                        f"{steward.deaths} kills so far\n" + "\n".join(steward.history[-10:])
                        + "\n" + steward.tail(), pytrace=False)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await steward.stop_quietly()
            await sink.stop()

    answers, refusals = received(slack, sink)
    t = tally(msgs, answers, refusals, await sent_folder(account), cut_off(sink), again())
    line = (f"kills={steward.deaths} messages={sum(m.sent_at is not None for m in msgs)} "
            f"lost={len(t.lost)} duplicate={len(t.duplicate)} wrong={len(t.wrong)} "
            f"(seed {seed}); in doubt {len(t.in_doubt)}")
    print(line)
    if os.environ.get("STEWARD_CHAOS_VERBOSE"):
        print("\n".join(steward.history))
        for m in msgs:
            print(m.describe())
        for out in answers + refusals:
            print(f"  {out.show()}")
    details = "\n".join(["", *(p + log_lines(home, p) for p in [*t.lost, *t.duplicate,
                                                                  *t.wrong, *t.in_doubt])])
    if details.strip():
        print(details)
    def acked(m: Msg) -> float:
        return min((sender.deliveries[e].first_ack or float("inf")) for e in m.event_ids)

    early = [m for m in msgs if m.root is not None and not m.is_mail and m.event_ids
             and acked(m) < acked(m.root)]
    if os.environ.get("STEWARD_CHAOS_VERBOSE"):
        print("acked before their thread's first message:", ", ".join(
            f"{m.token} ({m.kind}, {acked(m.root) - acked(m):.2f}s before {m.root.token})"
            for m in early))
    # What the workload exercised: (what, how many times).
    exercised = [
        ("Slack retries", sender.retries),
        ("acked events sent again", sum(d.acks > 1 for d in sender.deliveries.values())),
        ("thread replies acked before their thread's first message", len(early)),
        ("mails sent while down", sum(m.while_down for m in msgs if m.is_mail)),
        ("tool results back at the model", sum(
            1 for r in llm.requests if isinstance(r.body, dict)
            and (r.body.get("messages") or [{}])[-1].get("role") == "tool")),
    ]
    stats = (f"runs {steward.runs}, kills by the test {steward.kills}, self-kills "
             f"{steward.self_kills}, "
             + ", ".join(f"{what} {count}" for what, count in exercised)
             + f", settled {settled}; logs in {home}")
    print(stats)
    if steward.crashes:
        pytest.fail(f"{line}\nsteward exited by itself: {steward.crashes}\n{steward.tail()}",
                    pytrace=False)
    if code != 0:
        pytest.fail(f"{line}\nSIGTERM: exit {code}\n{steward.tail()}", pytrace=False)
    if not t.clean:
        pytest.fail(f"{line}{details}\n{stats}", pytrace=False)
    missing = [what for what, count in exercised if not count]
    if require_coverage and missing:
        pytest.fail(f"{line}\nthe workload never exercised: {', '.join(missing)}\n{stats}",
                    pytrace=False)
    return line


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_chaos_short(store_url, tmp_path, account):
    await chaos(tmp_path / "home", store_url, account,
                kills=size("STEWARD_CHAOS_KILLS", 15),
                messages=size("STEWARD_CHAOS_MESSAGES", 40), seed=chaos_seed(), budget=240)


@pytest.mark.slow
async def test_chaos_long(store_url, tmp_path, account):
    kills = size("STEWARD_CHAOS_KILLS", 250)
    await chaos(tmp_path / "home", store_url, account, kills=kills,
                messages=size("STEWARD_CHAOS_MESSAGES", 500), seed=chaos_seed(),
                budget=120 + kills * 8.0, require_coverage=True)


async def test_a_mail_cut_off_before_the_dot_is_lost_and_one_sent_again_is_in_doubt(
        tmp_path):
    """The tally itself: a real SMTP connection that sends a whole answer but closes before
    the dot leaves that answer lost (it was not sent), whatever the log says; an answer the
    sink got twice under one Message-ID is in doubt if Steward's log says it sent that
    reply again, and a duplicate otherwise."""
    sink = await ChaosSink().start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", sink.port)

        async def say(line: str) -> str:
            writer.write(line.encode() + b"\r\n")
            await writer.drain()
            return (await reader.readline()).decode()

        assert (await reader.readline()).startswith(b"220")
        for command in ("EHLO steward.test", "MAIL FROM:<steward@example.com>",
                        "RCPT TO:<ana@example.com>"):
            answer = await say(command)
            while answer[3:4] == "-":  # EHLO's lines
                answer = (await reader.readline()).decode()
        assert (await say("DATA")).startswith("354")
        writer.write(b"Message-ID: <c1.k1@steward.test>\r\n"
                     b"In-Reply-To: <m1.s1@example.com>\r\nSubject: Re: hi\r\n\r\n"
                     b"Answering m1.\r\n..dot-stuffed\r\n" + MARKER.encode() + b"\r\n")
        await writer.drain()
        writer.close()  # killed: no final dot
        await writer.wait_closed()
        for _ in range(100):
            if sink.cut_off:
                break
            await asyncio.sleep(0.02)
        [cut] = cut_off(sink)
        assert cut.tokens == ["m1"] and cut.complete and sink.messages == []
        assert ".dot-stuffed" in cut.text and "..dot" not in cut.text
    finally:
        await sink.stop()
    sent = [Msg(n, "mail_new", "ana", None, 0.0, "hi", message_id=f"m{n}.s1@example.com",
                sent_at=1.0) for n in (1, 2)]
    # The line `find` logs (as `steward -v run` writes it), among others, in a log whose
    # last line is still being written.
    (tmp_path / "run000.log").write_text(
        "2025-01-01 10:00:00,000 WARNING connectors.email.channel: email: reply "
        "<c1.k1@steward.test> was cut off before its Sent copy was marked as sent: not sent "
        "(cut off before the final dot) or, cut off just after the dot, sent; it is sent "
        "again under the same Message-ID\n"
        "2025-01-01 10:00:00,001 INFO bot.runtime.runner: something else\n")
    (tmp_path / "run001.log").write_text("2025-01-01 10:00:01,000 WARNING connectors.email."
                                         "channel: email: reply <c9.k9@steward.test> was ")
    again = SentAgain(tmp_path)
    assert again() == {"c1.k1@steward.test"}
    # Cut off before the dot, never received whole: lost, sent again or not.
    t = tally(sent, [], [], {}, [cut], again())
    assert t.in_doubt == [] and len(t.lost) == 2
    assert "m1.s1" in t.lost[0] and "should have been sent again" in t.lost[0]

    def answer(message_id: str) -> Output:
        msg = email.message.EmailMessage()
        msg["Message-ID"], msg["In-Reply-To"] = f"<{message_id}>", "<m1.s1@example.com>"
        msg["References"], msg["Subject"] = "<m1.s1@example.com>", "Re: hi"
        return Output(("mail", "m1.s1@example.com"), f"Answering m1. {MARKER}", ["m1"], True,
                      msg, [ALLOWED])
    twice = [answer("c1.k1@steward.test"), answer("c1.k1@steward.test")]
    t = tally(sent[:1], twice, [], {}, [], again())
    assert [line.split()[:2] for line in t.in_doubt] == [["in", "doubt"]]
    assert "m1.s1" in t.in_doubt[0] and t.clean
    # Without the log line, or under two Message-IDs, it is a duplicate.
    assert len(tally(sent[:1], twice, [], {}, [], set()).duplicate) == 1
    other = [answer("c1.k1@steward.test"), answer("c1.k2@steward.test")]
    assert len(tally(sent[:1], other, [], {}, [], again()).duplicate) == 1
    # The half-written line, once finished, is read.
    log = tmp_path / "run001.log"
    log.write_text(log.read_text() + "cut off before its Sent copy was marked as sent: ...; "
                   "it is sent again under the same Message-ID\n")
    assert again() == {"c1.k1@steward.test", "c9.k9@steward.test"}
