"""Tools the agent can call: a typed async function plus its JSON schema and replay policy.

    @tool(policy=Policy.SAFE)
    async def add(ctx: ToolContext, a: int, b: Annotated[int, Field(description="...")] = 1):
        '''Add two numbers.'''
        return a + b

The first parameter, if annotated `ToolContext`, receives the context; the others are the
arguments, described to the model by a JSON schema built with pydantic (a single parameter
whose type is a pydantic model uses that model's schema instead). `Tool.run` validates the
model's arguments and turns every outcome into a `ToolResult` the model reads: wrong
arguments and exceptions raised by the tool become error results (the runtime does not
retry them; the agent decides what to do). Only `NotPerformed` passes through, to tell the
runtime that nothing reached the outside world.

The default policy is `unsafe`: an effect nobody described is never repeated blindly.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, get_type_hints
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from bot.llm.types import ToolSpec
from bot.runtime.definitions import NotPerformed, Policy
from bot.tools.permissions import Recipients
from store import Store, Writes

__all__ = [
    "MAX_RESULT_CHARS", "Tool", "ToolBox", "ToolContext", "ToolModuleError", "ToolResult",
    "known_timezone", "tool",
]

MAX_RESULT_CHARS = 50_000
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI and Anthropic both accept


async def _no_partial(value: Any) -> None:
    return None


_ZONE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}$")
_NOT_ZONES = {"localtime", "posixrules", "Factory"}  # files in the zone dir, not places


def known_timezone(name: Any) -> str | None:
    """`name` if it is an IANA timezone name this system knows ("Europe/Vienna", "UTC"),
    else None: what a channel says about a person (Slack's `user.tz`) may be missing,
    empty, stale or anything at all, and a stored one may be gone from a newer tzdata."""
    if not isinstance(name, str) or len(name) > 64 or not _ZONE_NAME.match(name) \
            or name in _NOT_ZONES or name.startswith(("posix/", "right/")):
        return None
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None
    return name


class ToolContext:
    """What a tool sees while it runs, built by the runtime for one tool-call task.

    - `writes`: store writes that land atomically with the tool's result, so a tool whose
      only effect is a store write is crash-safe (and can be declared `safe`);
    - `save_partial(value)`: commit partial output now (long unsafe tools: after a crash
      the agent is told what had been done);
    - `idem_key`: the idempotency key reserved for `keyed` tools;
    - `http`: the shared HTTP client; `timezone`: the IANA timezone of the person the turn
      answers (their Slack profile's, stored with their message), else the configured one;
    - `origin`: the channel and reply routing of the turn that called the tool;
    - `recipients`: whom a tool may send to (`bot.tools.permissions`); nobody by default;
      `approved`: the person approved this call (an approval's wait ended with yes);
    - `netguard`: which addresses web tools may reach (None: public ones only);
    - `channels`: the delivery channels by name, which know their own addresses;
    - `outside`: why the turn's request held outside text (`bot.provenance`), or None:
      what the tool stores for later (a fact, a to-do, a schedule) keeps that mark;
    - `asked_at`: when the turn that called the tool began (its question came), or None.
    """

    def __init__(self, *, store: Store, task_id: str, conversation_id: int | None = None,
                 conversation_key: str | None = None, idem_key: str | None = None,
                 writes: Writes | None = None, http: httpx.AsyncClient,
                 timezone: str = "UTC",
                 save_partial: Callable[[Any], Awaitable[None]] = _no_partial,
                 origin: dict[str, Any] | None = None,
                 recipients: Recipients | None = None, approved: bool = False,
                 netguard: Any = None, channels: dict[str, Any] | None = None,
                 outside: str | None = None, asked_at: float | None = None):
        self.store = store
        self.task_id = task_id
        self.conversation_id = conversation_id
        self.conversation_key = conversation_key
        self.idem_key = idem_key
        self.writes = writes if writes is not None else Writes()
        self.http = http
        self.timezone = timezone
        self.save_partial = save_partial
        # Where the request came from: {"channel": ..., "reply_to": {...}} of the turn,
        # so a tool can route something back there later (a reminder, say).
        self.origin = origin or {}
        self.recipients = recipients or Recipients()
        self.approved = approved  # the person said yes to this very call
        self.netguard = netguard  # what web tools may reach (`netguard.NetGuard`)
        # The channels this process delivers through (bot.channels.Channel), by name: they
        # say how to address someone new on them.
        self.channels = channels or {}
        self.outside = outside
        self.asked_at = asked_at

    def __repr__(self) -> str:
        return (f"ToolContext(task_id={self.task_id!r}, "
                f"conversation_key={self.conversation_key!r})")


@dataclass
class ToolResult:
    """What goes back to the model for one tool call."""

    content: str
    is_error: bool = False
    outside: str | None = None  # it shows stored outside text (bot.provenance): why

    def to_json(self) -> dict:
        shown = {"content": self.content, "is_error": self.is_error}
        return {**shown, "outside": self.outside} if self.outside else shown

    @classmethod
    def from_json(cls, data: dict) -> ToolResult:
        return cls(str(data.get("content", "")), bool(data.get("is_error", False)),
                   data.get("outside") or None)


class ToolModuleError(Exception):
    """A tool module named in the config cannot be imported or registered."""


# -- signatures ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Binder:
    """How to turn the model's arguments into a call of the tool function."""

    model: type[BaseModel]
    takes_ctx: bool
    whole_model: str | None  # the one parameter that receives the whole validated model
    names: dict[str, str]  # parameter name -> pydantic field name

    def validate(self, arguments: dict) -> BaseModel:
        return self.model.model_validate(arguments)

    def call(self, fn: Callable, ctx: ToolContext, values: BaseModel) -> Any:
        args = (ctx,) if self.takes_ctx else ()
        if self.whole_model is not None:
            return fn(*args, **{self.whole_model: values})
        return fn(*args, **{p: getattr(values, f) for p, f in self.names.items()})


def _is_context(annotation: Any) -> bool:
    return inspect.isclass(annotation) and issubclass(annotation, ToolContext)


def _hints(fn: Callable) -> dict[str, Any]:
    try:
        return get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise TypeError(f"cannot resolve the annotations of {fn.__qualname__}: {exc}") from None


def _binder(fn: Callable, model_name: str) -> _Binder:
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"tool function {fn.__qualname__} must be async (a blocking tool "
                        "would stall the event loop; use asyncio.to_thread inside it)")
    hints = _hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    takes_ctx = bool(params) and _is_context(hints.get(params[0].name))
    if takes_ctx:
        params = params[1:]
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"tool function {fn.__qualname__}: parameter {p.name!r} must be "
                            "an ordinary or keyword-only parameter")
        if _is_context(hints.get(p.name)):
            raise TypeError(f"tool function {fn.__qualname__}: the ToolContext must be the "
                            "first parameter")
    if len(params) == 1:
        only = hints.get(params[0].name)
        if inspect.isclass(only) and issubclass(only, BaseModel):
            return _Binder(only, takes_ctx, params[0].name, {})
    fields: dict[str, Any] = {}
    names: dict[str, str] = {}
    for p in params:
        annotation = hints.get(p.name, Any)
        default = ... if p.default is p.empty else p.default
        field_name = p.name
        if p.name.startswith("_") or hasattr(BaseModel, p.name):
            # pydantic reserves these names: keep the parameter's name as the alias
            field_name = f"arg_{p.name.lstrip('_')}_{len(fields)}"
            default = Field(default, alias=p.name)
        fields[field_name] = (annotation, default)
        names[p.name] = field_name
    model = create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)
    return _Binder(model, takes_ctx, None, names)


def _clean_schema(node: Any) -> Any:
    """Drop pydantic's generated `title`s from every schema node (not from `properties`,
    whose keys are argument names)."""
    if isinstance(node, list):
        return [_clean_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(
                value, dict):
            out[key] = {name: _clean_schema(sub) for name, sub in value.items()}
        elif key in ("default", "const", "enum", "examples", "required"):
            out[key] = value
        else:
            out[key] = _clean_schema(value)
    return out


def _schema(model: type[BaseModel]) -> dict:
    schema = _clean_schema(model.model_json_schema())
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return schema


def _first_paragraph(fn: Callable) -> str:
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


# -- results ------------------------------------------------------------------------------


def _truncate(content: str) -> str:
    if len(content) <= MAX_RESULT_CHARS:
        return content
    more = len(content) - MAX_RESULT_CHARS
    return f"{content[:MAX_RESULT_CHARS]}\n[truncated: {more:,} more characters]"


def _render(value: Any) -> ToolResult:
    if isinstance(value, ToolResult):
        return ToolResult(_truncate(value.content), value.is_error)
    if isinstance(value, str):
        return ToolResult(_truncate(value))
    text = json.dumps(value, ensure_ascii=False, default=pydantic_core.to_jsonable_python)
    return ToolResult(_truncate(text))


def _error(text: str) -> ToolResult:
    return ToolResult(_truncate(f"error: {text}"), is_error=True)


def _exception(exc: BaseException) -> ToolResult:
    message = str(exc)
    return _error(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)


def _describe_validation(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(part) for part in err["loc"]) or "(arguments)"
        message = err["msg"]
        if err["type"] not in ("missing", "extra_forbidden"):
            shown = repr(err.get("input"))
            message += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
        problems.append(f"{where}: {message}")
    return "; ".join(problems)


# -- tools --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    """One tool. Usually made with `@tool`; constructing it directly works too (the
    arguments are then validated against the function's signature all the same).

    `reconcile_fn(ctx, **arguments) -> (happened, result)` is for unsafe tools that can
    look at the outside world after a crash: (True, result) if the effect is found to have
    happened, (False, None) if it certainly did not."""

    name: str
    description: str
    parameters: dict
    policy: Policy
    fn: Callable[..., Awaitable[Any]]
    reconcile_fn: Callable[..., Awaitable[tuple[bool, Any]]] | None = None
    _binder: _Binder | None = field(default=None, repr=False, compare=False)
    # What it reaches (`bot.tools.permissions`: SENDS, SCHEDULES, READS_OUTSIDE, ...).
    touches: frozenset[str] = frozenset()
    # `approval_fn(asking, **arguments) -> str | None`: what the person must approve before
    # this call runs (a summary), or None; `asking` is a `permissions.Asking`.
    approval_fn: Callable[..., Awaitable[str | None]] | None = None
    # `policy_fn(arguments) -> Policy`: for a tool whose policy depends on what it is asked
    # to do (an MCP server's tools through one `mcp_call`); else `policy` holds for all.
    policy_fn: Callable[[dict], Policy] | None = None

    def policy_for(self, arguments: Any) -> Policy:
        if self.policy_fn is None or not isinstance(arguments, dict):
            return self.policy
        return Policy(self.policy_fn(arguments))

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"tool name {self.name!r} must match {_NAME.pattern}")
        object.__setattr__(self, "policy", Policy(self.policy))
        if self._binder is None:
            object.__setattr__(self, "_binder", _binder(self.fn, _model_name(self.name)))
        if self.reconcile_fn is not None and not inspect.iscoroutinefunction(self.reconcile_fn):
            raise TypeError(f"tool {self.name!r}: reconcile must be an async function")

    async def approval(self, asking: Any, arguments: dict) -> str | None:
        """The tool's own reason to ask first (see `approval_fn`); arguments that do not
        validate need none: the call will only return an error."""
        if self.approval_fn is None:
            return None
        values = self._validate(arguments)
        if isinstance(values, ToolResult):
            return None
        return await self.approval_fn(asking, **{p: getattr(values, f)
                                                 for p, f in self._binder.names.items()})

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description,
                        parameters=self.parameters)

    def problem(self, arguments: Any) -> str | None:
        """What is wrong with `arguments` for this tool, as the model is told, or None:
        checked before a call is run at all (`bot.agent.call_check`)."""
        values = self._validate(arguments)
        return values.content if isinstance(values, ToolResult) else None

    def _validate(self, arguments: Any) -> BaseModel | ToolResult:
        if not isinstance(arguments, dict):
            return _error("invalid arguments: expected a JSON object, got "
                          f"{type(arguments).__name__}")
        if "_raw" in arguments and len(arguments) == 1:
            raw = str(arguments["_raw"])
            shown = raw if len(raw) <= 200 else raw[:197] + "..."
            return _error(f"invalid arguments: not a JSON object: {shown!r}. Call {self.name} "
                          "again with the arguments as one JSON object.")
        try:
            return self._binder.validate(arguments)
        except ValidationError as exc:
            return _error(f"invalid arguments: {_describe_validation(exc)}")

    async def run(self, ctx: ToolContext, arguments: dict) -> ToolResult:
        """Call the tool. Never raises for the tool's own failures: they become error
        results for the model. `NotPerformed` (and cancellation) propagate."""
        values = self._validate(arguments)
        if isinstance(values, ToolResult):
            return values
        try:
            result = await self._binder.call(self.fn, ctx, values)
        except NotPerformed:
            raise
        except Exception as exc:
            return _exception(exc)
        return _render(result)

    async def reconcile(self, ctx: ToolContext, arguments: dict) -> tuple[bool, ToolResult | None]:
        """After a crash mid-call: did the effect happen? Raises NotImplementedError when
        the tool has no way to tell (the runtime then reports it as interrupted)."""
        if self.reconcile_fn is None:
            raise NotImplementedError(f"tool {self.name!r} cannot reconcile")
        values = self._validate(arguments)
        if isinstance(values, ToolResult):
            return False, None  # arguments that never validated never ran
        happened, result = await self._binder.call(self.reconcile_fn, ctx, values)
        return (True, _render(result)) if happened else (False, None)


def _model_name(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[_-]", name)) + "Arguments"


def tool(fn: Callable | None = None, *, name: str | None = None,
         description: str | None = None, policy: Policy | str = Policy.UNSAFE,
         reconcile: Callable | None = None, touches: frozenset[str] = frozenset(),
         approval: Callable | None = None) -> Any:
    """Make a `Tool` of a typed async function; usable bare (`@tool`) or with options.

    The name defaults to the function's, the description to the first paragraph of its
    docstring, the policy to `unsafe`. `reconcile` is called like the function itself;
    `touches` and `approval` feed the permission rules (`bot.tools.permissions`)."""

    def make(f: Callable) -> Tool:
        tool_name = name or f.__name__
        text = description if description is not None else _first_paragraph(f)
        if not text:
            raise ValueError(f"tool {tool_name!r} needs a description (a docstring or "
                             "description=...)")
        binder = _binder(f, _model_name(tool_name))
        return Tool(tool_name, text, _schema(binder.model), Policy(policy), f, reconcile,
                    binder, frozenset(touches), approval)

    return make(fn) if fn is not None else make


# -- the box ------------------------------------------------------------------------------


class ToolBox:
    """The tools one agent may call, by name."""

    def __init__(self, *tools: Tool):
        self._tools: dict[str, Tool] = {}
        self.custom: set[str] = set()  # loaded from `[agent] tool_modules`
        for t in tools:
            self.register(t)

    def register(self, t: Tool) -> None:
        if not isinstance(t, Tool):
            raise TypeError(f"not a Tool: {t!r}")
        existing = self._tools.get(t.name)
        if existing is t:
            return  # the same tool seen twice (say, re-exported by a module): harmless
        if existing is not None:
            raise ValueError(f"tool {t.name!r} registered twice")
        self._tools[t.name] = t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def specs(self) -> list[ToolSpec]:
        return [self._tools[n].spec() for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def load_module(self, dotted_name: str) -> list[str]:
        """Import `dotted_name` and register every module-level `Tool` in it; returns their
        names. A plain (blocking) import: call it at start-up, before serving, as the
        config's `agent.tool_modules` are loaded."""
        try:
            module = importlib.import_module(dotted_name)
        except Exception as exc:
            raise ToolModuleError(f"cannot import tool module {dotted_name!r}: "
                                  f"{type(exc).__name__}: {exc}") from exc
        found = [v for v in vars(module).values() if isinstance(v, Tool)]
        if not found:
            raise ToolModuleError(f"tool module {dotted_name!r} defines no tools")
        for t in found:
            try:
                self.register(t)
            except ValueError as exc:
                raise ToolModuleError(f"tool module {dotted_name!r}: {exc}") from None
            self.custom.add(t.name)
        return sorted({t.name for t in found})
