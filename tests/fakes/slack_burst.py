"""Slack's side of a burst, in a process of its own (Slack is another machine, so its
requests must not share the connector's interpreter): reads {"url", "conversations": [[body,
...], ...]} as JSON on stdin, delivers each conversation's events one after another, all
conversations at once, and prints the [status, seconds] of every delivery as JSON.

    python -m tests.fakes.slack_burst < burst.json
"""

import asyncio
import json
import sys

import httpx

from tests.fakes.slack_events import deliver


async def burst(url: str, conversations: list[list[dict]]) -> list[tuple[int, float]]:
    async with httpx.AsyncClient(timeout=30) as http:
        async def one(bodies: list[dict]) -> list[tuple[int, float]]:
            return [await deliver(http, url, body) for body in bodies]
        per = await asyncio.gather(*(one(bodies) for bodies in conversations))
    return [ack for acks in per for ack in acks]


def main() -> None:
    job = json.load(sys.stdin)
    json.dump(asyncio.run(burst(job["url"], job["conversations"])), sys.stdout)


if __name__ == "__main__":
    main()
