"""The statements of a step, stated once: what each insert of a step writes (its columns,
their PostgreSQL types and where each value comes from) and the statements that move
tasks on. Both backends run what is rendered from here: SQLite the statements as text
(`store/steps.py` `plan`), PostgreSQL the server-side `steward_step`
(`store/postgres/step_function.py`), whose arguments `step_function.call_args` builds
from the same columns; and the general commit (`store/commit.py`) runs SQLite's text on
either database.
Adding a column to a step is one `Col` here, plus the migration that adds it and
recreates the function (tests/test_store_step_function.py says when one is missing).
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

from store.hotpath import json_text
from store.records import PENDING, TERMINAL
from store.schema import storable


@dataclass(frozen=True)
class Col:
    name: str  # the table's column
    pg: str  # its type on PostgreSQL (the function takes an array of it)
    value: Callable  # the value from the insert's source (see `Insert.source`)


@dataclass(frozen=True)
class Insert:
    """An insert of one row per item. `cols`: the values a step sends, in the order it
    sends them; `fixed`: (column, SQLite expression, PostgreSQL expression), with `{now}`
    the step's clock; `prefix`: of the function's argument names (`s_channel` ...)."""

    table: str
    prefix: str
    source: str  # what `Col.value` is called with, for the reader
    cols: tuple[Col, ...]
    fixed: tuple[tuple[str, str, str], ...] = ()

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.cols] + [f[0] for f in self.fixed]

    def sqlite(self, lead: tuple[str, ...] = (), tail: str = "",
               trail: tuple[str, ...] = ()) -> str:
        """As SQLite text: `lead` columns first (?1 ...), then the step's, then the
        fixed ones with the clock bound next, then `trail` columns."""
        n = len(lead) + len(self.cols)
        values = [f"?{i}" for i in range(1, n + 1)]
        now = f"?{n + 1}"
        values += [f[1].format(now=now) for f in self.fixed]
        values += [f"?{n + 2 + i}" for i in range(len(trail))]
        return (f"INSERT INTO {self.table} ({', '.join([*lead, *self.names, *trail])})\n"
                f"VALUES ({', '.join(values)}){tail}")

    def __post_init__(self):
        # One function per insert that builds the whole row: a generator over the columns
        # cost a step's rows a third more than the hand-written tuples they replace.
        names = {f"_v{i}": c.value for i, c in enumerate(self.cols)}
        source = f"lambda a, b: ({''.join(f'{n}(a, b), ' for n in names)})"
        object.__setattr__(self, "row", eval(source, names))


def bind(sql: str, names: list[str]) -> str:
    """SQLite's ?1, ?2 ... as the names of the function's arguments or variables."""
    return re.sub(r"\?(\d+)", lambda m: names[int(m.group(1)) - 1], sql)


def _opt(f):
    """`f(x)` of a value that may be None."""
    return lambda x: None if x is None else f(x)


_s = storable
_json = json_text
_opt_s = _opt(_s)
_opt_json = _opt(_json)


SUBMISSIONS = Insert(
    "submissions", "s", "(submission, external id)", (
        Col("channel", "text", lambda sub, x: _s(sub.channel)),
        Col("external_id", "text", lambda sub, x: _s(x)),
        Col("conversation_id", "bigint", lambda sub, x: sub.conversation_id),
        Col("task_id", "text", lambda sub, x: _opt_s(sub.task_id)),
        Col("state", "text",
            lambda sub, x: "quarantined" if sub.quarantine_reason else "accepted"),
        Col("reason", "text", lambda sub, x: _opt_s(sub.quarantine_reason)),
        Col("payload", "text", lambda sub, x: _opt_json(sub.payload)),
    ), (("created_at", "{now}", "p_now"),))

# Each entry's conversation and position come first (reserved per conversation).
ENTRIES = Insert(
    "entries", "e", "(entry, clock)", (
        Col("kind", "text", lambda e, t: _s(e.kind)),
        Col("author", "text", lambda e, t: _opt_s(e.author)),
        Col("text", "text", lambda e, t: _s(e.text)),
        Col("data", "text", lambda e, t: _opt_json(e.data)),
        Col("ref", "text", lambda e, t: _opt_s(e.ref)),
        Col("task_id", "text", lambda e, t: _opt_s(e.task_id)),
        Col("created_at", "float8", lambda e, t: t if e.created_at is None else e.created_at),
    ))

# A spawn with a dedupe key (a delivery) is told apart: its key is sent after these.
TASKS = Insert(
    "tasks", "t", "(new task, clock)", (
        Col("id", "text", lambda nt, t: _s(nt.id)),
        Col("kind", "text", lambda nt, t: _s(nt.kind)),
        Col("parent_id", "text", lambda nt, t: nt.parent_id),
        Col("conversation_id", "bigint", lambda nt, t: nt.conversation_id),
        Col("inputs", "text", lambda nt, t: _json(nt.inputs)),
        Col("idem_key", "text", lambda nt, t: _opt_s(nt.idem_key)),
        Col("run_after", "float8", lambda nt, t: max(float(nt.run_after), t)),
    ), (("state", f"'{PENDING}'", f"'{PENDING}'"), ("phase", "''", "''"),
        ("attempts", "0", "0"), ("crashes", "0", "0"), ("created_at", "{now}", "p_now"),
        ("updated_at", "{now}", "p_now")))

USAGE = Insert(
    "usage", "g", "(usage record, the updated task's id)", (
        Col("task_id", "text", lambda u, task: u.task_id or task),
        Col("conversation_id", "bigint", lambda u, task: u.conversation_id),
        Col("provider", "text", lambda u, task: _s(u.provider)),
        Col("model", "text", lambda u, task: _s(u.model)),
        Col("input_tokens", "int", lambda u, task: u.input_tokens),
        Col("output_tokens", "int", lambda u, task: u.output_tokens),
        Col("cache_read_tokens", "int", lambda u, task: u.cache_read_tokens),
        Col("cache_write_tokens", "int", lambda u, task: u.cache_write_tokens),
        Col("cost_usd", "float8", lambda u, task: float(u.cost_usd)),
        Col("ok", "bool", lambda u, task: bool(u.ok)),
        Col("error", "text", lambda u, task: _opt_s(u.error)),
    ), (("created_at", "{now}", "p_now"),))


# ?1 conversation, ?2 entries to add, ?3 now, ?4 offset of the last head marker among
# them (NULL: none). SET reads the old last_seq, as `commit._entries` does.
SEQ = """UPDATE conversations SET last_seq = last_seq + ?2, updated_at = ?3,
    head_seq = CASE WHEN ?4 IS NULL THEN head_seq ELSE last_seq + 1 + ?4 END
WHERE id = ?1 RETURNING last_seq"""
# A sleeper that waits for other tasks (a turn for the older one) is due at once if any of
# them settled before it went to sleep: ?1 the sleeper, {those} the tasks it waits for.
WAKE_IF_SETTLED = f"""UPDATE tasks SET run_after = 0.0 WHERE id = ?1 AND EXISTS (
    SELECT 1 FROM tasks o WHERE o.id {{those}}
    AND o.state IN ({", ".join(f"'{s}'" for s in sorted(TERMINAL))}))"""
# Sleepers woken early: {ids} the sleepers, ?2 now, ?3 'pending' (a parameter: written
# in, it is ix_tasks_ready's condition, and PostgreSQL's planner took that index).
WAKE_SLEEPERS = ("UPDATE tasks SET run_after = 0.0, updated_at = ?2 "
                 "WHERE id {ids} AND state = ?3")
