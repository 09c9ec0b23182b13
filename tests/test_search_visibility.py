"""Who may find what with `search_history`: a person's private conversations also see the
channels that person talked in; a channel never sees anyone's private conversations."""

import httpx

from bot.memory.search import search_history
from bot.tools import ToolContext
from store import Writes, new_id


async def said(store, key, owner, scope, text, author):
    conv = await store.ensure_conversation(key, owner=owner, scope=scope)
    w = Writes()
    w.append(conv.id, "user", text, author=author)
    await store.commit(w)
    return conv


async def search(store, conv, query):
    async with httpx.AsyncClient() as http:
        ctx = ToolContext(store=store, task_id=new_id(), conversation_id=conv.id, http=http,
                          timezone="UTC")
        return (await search_history.run(ctx, {"query": query})).content


async def test_a_dm_finds_its_persons_channel_threads_and_not_the_reverse(store):
    ana, bob = "slack:T:UANA", "slack:T:UBOB"
    ana_dm = await said(store, "slack:T:DANA", ana, "private:slack:T:UANA",
                        "my locker code is quokka", "ana")
    bob_dm = await said(store, "slack:T:DBOB", bob, "private:slack:T:UBOB",
                        "hello there", "bob")
    thread = await said(store, "slack:T:C1:1.0", ana, "channel:C1",
                        "the release train leaves on wombat day", "ana")
    await said(store, "slack:T:C2:2.0", bob, "channel:C2",
               "the wombat budget is secret to C2", "bob")

    found = await search(store, ana_dm, "wombat")
    assert "release train" in found  # Ana talked in C1
    assert "budget" not in found  # she never did in C2
    assert "locker" not in await search(store, thread, "quokka")  # a channel: no DMs
    assert "release train" not in await search(store, bob_dm, "wombat")
    assert "budget" in await search(store, bob_dm, "wombat")
