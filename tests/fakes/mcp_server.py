"""An MCP server for the tests, written with the SDK: `python -m tests.fakes.mcp_server`
serves stdio; `--http PORT` serves streamable HTTP on 127.0.0.1 (0: any free port, printed
as `listening on PORT` on stderr's first line).

Tools: `add`, `record` (appends to $MCP_LEDGER, so a test counts effects), `slow_record`
(records `start`, sleeps, records `done`), `fetch` (GETs a URL itself), `charge` (records
the request's idempotency key), `whoami` (the Authorization header it got), `die` (exits
mid-call); $MCP_EXTRA_TOOLS more trivial ones (`noop_0`, ...), to show that many tools
cost the prompt nothing.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from mcp.server.mcpserver import Context, MCPServer

app = MCPServer("steward-test", instructions="a server for Steward's tests")


def _ledger(line: str) -> None:
    with open(os.environ["MCP_LEDGER"], "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@app.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@app.tool()
def record(text: str) -> str:
    """Write a line to the ledger (an effect a test can count)."""
    _ledger(f"record {text}")
    return f"recorded {text}"


@app.tool()
def slow_record(text: str, seconds: float) -> str:
    """Record `start`, wait, record `done`."""
    _ledger(f"start {text}")
    time.sleep(seconds)
    _ledger(f"done {text}")
    return f"slowly recorded {text}"


@app.tool()
def charge(amount: int, ctx: Context) -> str:
    """Record a charge with the idempotency key the client sent."""
    meta = ctx.request_context.meta or {}
    key = meta.get("idempotency_key") if isinstance(meta, dict) else getattr(
        meta, "idempotency_key", None)
    _ledger(f"charge {amount} {key}")
    return f"charged {amount}"


@app.tool()
def whoami(ctx: Context) -> str:
    """The Authorization header of the request (HTTP only)."""
    return (ctx.headers or {}).get("authorization", "none")


@app.tool()
def fetch(url: str) -> str:
    """GET an address and return what it says (reaches the network on its own)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - a test server
        return response.read().decode("utf-8", "replace")


@app.tool()
def die() -> str:
    """Exit the server in the middle of the call."""
    os._exit(3)


def _extra(n: int) -> None:
    for i in range(n):
        def noop(i: int = i) -> str:
            return f"noop {i}"
        app.add_tool(noop, name=f"noop_{i}", description=f"Do nothing, number {i}.")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None)
    args = parser.parse_args()
    _extra(int(os.environ.get("MCP_EXTRA_TOOLS", "0")))
    if args.http is None:
        app.run()
        return
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", args.http))
    print(f"listening on {sock.getsockname()[1]}", file=sys.stderr, flush=True)
    config = uvicorn.Config(app.streamable_http_app(), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
