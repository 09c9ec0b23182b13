"""`steward web`: a read-only inspector of the store, in a browser.

    server.py   the aiohttp application: routes, the token guard, security headers; `serve`
    source.py   what the pages read from: the store, the config, the model's tools and name
                (the exact context is `bot.agent.context.assemble`, as a turn builds it)
    pages/      one module per area, each handler returning escaped HTML
    html.py     the only way markup is made: every value is escaped unless it is `Html`
    chart.py    the usage chart, an inline SVG drawn on the server

Server-rendered HTML with no script at all (the CSP forbids it), so hostile text in a
transcript (mail bodies, web pages) is shown, never run. Nothing here changes state: no
endpoint but GET, and the inspector never resumes or claims tasks.

`serve` is in `server.py`; this package imports nothing by itself, so that `steward
context` (which needs only `source.py`) does not load aiohttp's web stack.
"""
