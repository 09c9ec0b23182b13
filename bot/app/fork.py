"""`steward fork KEY [--at N] [--as NEWKEY]`: a new conversation that sees KEY's entries up
to N. A fork point inside an exchange (a tool call before its result, a question before
its answer) moves to the nearest one outside it, and a line on stderr says where and why
(bot/memory/forkpoint.py); the new key is the only thing on stdout."""

import sys

from bot.app.errors import UsageError


async def fork_command(config, args) -> int:
    from sqlalchemy.exc import IntegrityError

    from bot.app.opened import opened_store
    from bot.memory.forkpoint import safe_fork_point
    from store import NotFound

    async with opened_store(config) as store:
        parent = await store.get_conversation(args.key)
        asked = parent.last_seq if args.at is None else args.at
        if asked > parent.last_seq:
            raise UsageError(f"{args.key} has {parent.last_seq} entries; --at {asked} is past "
                             "its end")
        point = await safe_fork_point(store, parent.id, asked, parent.last_seq)
        new_key = args.new_key or f"{args.key}@{point.at}"
        taken = f"a conversation {new_key!r} already exists; name the fork with --as KEY"
        try:
            await store.get_conversation(new_key)
            raise UsageError(taken)
        except NotFound:
            pass
        try:
            child = await store.fork(args.key, new_key, at_seq=point.at)
        except IntegrityError:  # made meanwhile by someone else
            raise UsageError(taken) from None
    if point.moved:
        print(f"steward: entry {asked} is inside an exchange ({point.why}): forked at "
              f"{point.at} instead, " + ("before it began" if point.at < asked else
                                         "where it is over"), file=sys.stderr)
    print(child.key)
    return 0
