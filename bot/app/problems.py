"""An exception that ended a command, or a check of `steward doctor`, as the one line a
person reads: a database that cannot be reached says where it looked and where that address
came from; what a user typed wrong exits 2; anything else says it was unexpected."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from bot.app.errors import UsageError
from bot.config_source import ConfigError
from bot.home import HomeError

if TYPE_CHECKING:
    from bot.app.config import StewardConfig as Config

_DATABASE_MODULES = ("asyncpg", "aiosqlite", "sqlalchemy", "store")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _raised_in(exc: BaseException, modules: tuple[str, ...]) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__name__", "")
        if name.split(".")[0] in modules:
            return True
        tb = tb.tb_next
    return False


class _NeverRaised(Exception):
    pass


def _loaded_class(module: str, name: str) -> type[BaseException]:
    """The exception class `module.name` if that module was imported, else one nothing
    raises: an exception can only be an instance of a class that was loaded, and loading
    the agent's tools or SQLAlchemy just to ask cost a reading command's error 1.4 s."""
    loaded = sys.modules.get(module)
    return getattr(loaded, name) if loaded is not None else _NeverRaised


def database_problem(exc: BaseException, config: Config | None) -> str | None:
    """The line for a database that cannot be reached or opened, or None if `exc` is not
    that. asyncpg lets socket errors through as they are (refused, unknown host, timeout);
    SQLAlchemy wraps what the drivers call errors."""
    DBAPIError = _loaded_class("sqlalchemy.exc", "DBAPIError")
    from_driver = type(exc).__module__.split(".")[0] in ("asyncpg", "aiosqlite", "sqlite3")
    if not (isinstance(exc, DBAPIError) or from_driver
            or isinstance(exc, OSError) and _raised_in(exc, _DATABASE_MODULES)):
        return None
    detail = _first_line(exc.orig if isinstance(exc, DBAPIError) and exc.orig else exc)
    if config is None:
        return f"the database: {detail}"
    from sqlalchemy.engine import make_url

    origin = "[store] url" + (f" in {config.path}" if config.path and config.store.url
                              else "" if config.store.url else " (empty: SQLite in the home)")
    url = make_url(config.store_url)
    if url.get_backend_name() == "postgresql":
        where = f"{url.host or 'localhost'}:{url.port or 5432}"
        if isinstance(exc, OSError):
            return (f"cannot reach PostgreSQL at {where} (database {url.database!r}, from "
                    f"{origin}): {detail}; is the server running and the address right?")
        return f"PostgreSQL at {where} (database {url.database!r}, from {origin}): {detail}"
    return f"cannot use the SQLite database {url.database} (from {origin}): {detail}"


def describe(exc: BaseException, config: Config | None) -> tuple[int, str]:
    """(exit code, the line to print) for an exception that ended a command."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return describe(exc.exceptions[0], config)
    from store.errors import StoreError

    # a tool module the config named: say which file
    if isinstance(exc, _loaded_class("bot.tools.base", "ToolModuleError")):
        exc = ConfigError(config.path if config else None, [("[agent] tool_modules", str(exc))])
    if isinstance(exc, ConfigError | UsageError | HomeError):
        return 2, str(exc)
    database = database_problem(exc, config)
    if database is not None:
        return 1, database
    if isinstance(exc, _loaded_class("store.errors", "NoSchema")):
        from bot.app.opened import MADE_BY, NOTHING_YET

        return 1, f"{exc}: {NOTHING_YET} {MADE_BY}"
    if isinstance(exc, StoreError | ValueError):
        return 1, _first_line(exc)
    return 1, (f"unexpected error: {type(exc).__name__}: {_first_line(exc)} "
               "(STEWARD_DEBUG=1 shows where)")
