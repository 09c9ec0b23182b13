"""The stylesheet, served as /style.css (the CSP allows no inline style)."""

CSS = """
:root { --ink: #1d2330; --muted: #5b6475; --line: #d9dde5; --paper: #ffffff;
  --band: #f3f5f9; --accent: #2456c7; --warn: #b3261e; --ok: #1b7f3b; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, "DejaVu Sans", sans-serif; color: var(--ink);
  background: var(--band); }
header { background: #1d2b4f; color: #fff; padding: 10px 24px; display: flex;
  align-items: baseline; gap: 24px; flex-wrap: wrap; }
header .brand { font-weight: 700; font-size: 18px; letter-spacing: .02em; }
header nav a { color: #cfd8f3; text-decoration: none; margin-right: 16px; }
header nav a.here { color: #fff; border-bottom: 2px solid #ffd35c; }
main { max-width: 1180px; margin: 18px auto; padding: 0 24px; }
h1 { font-size: 22px; margin: 6px 0 12px; word-break: break-all; }
h2 { font-size: 17px; margin: 22px 0 8px; }
a { color: var(--accent); }
table { border-collapse: collapse; width: 100%; background: var(--paper);
  border: 1px solid var(--line); }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line);
  vertical-align: top; font-size: 14px; }
th { background: #e8ecf4; font-weight: 600; }
td { overflow-wrap: break-word; }
.empty { color: var(--muted); font-style: italic; }
.meta { color: var(--muted); font-size: 13px; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 8px 0 16px; }
.card { background: var(--paper); border: 1px solid var(--line); border-radius: 6px;
  padding: 10px 16px; min-width: 140px; }
.card b { display: block; font-size: 22px; }
.cards > a { text-decoration: none; color: inherit; }
.tabs a { display: inline-block; padding: 4px 10px; margin: 0 6px 6px 0;
  border: 1px solid var(--line); border-radius: 14px; background: var(--paper);
  text-decoration: none; }
.tabs a.here { background: var(--accent); color: #fff; border-color: var(--accent); }
.entry, .message { background: var(--paper); border: 1px solid var(--line);
  border-left: 5px solid #9aa5b8; border-radius: 4px; margin: 10px 0; padding: 8px 12px; }
.kind-user, .role-user { border-left-color: #2456c7; }
.kind-assistant, .role-assistant { border-left-color: #1b7f3b; }
.kind-tool_result, .role-tool { border-left-color: #a05a00; }
.kind-compaction, .role-system { border-left-color: #6b3fa0; }
.kind-aborted, .kind-reset { border-left-color: var(--warn); }
.entry .head, .message .head { font-size: 13px; color: var(--muted); }
.entry .head b, .message .head b { color: var(--ink); }
pre { white-space: pre-wrap; word-break: break-word; margin: 6px 0 0;
  font: 13px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; }
.call { color: #a05a00; }
.state-failed, .state-interrupted, .state-blocked, .error { color: var(--warn); }
.state-done { color: var(--ok); }
.pager { margin: 12px 0; display: flex; gap: 18px; }
form.inline { display: flex; gap: 8px; align-items: center; margin: 8px 0 14px;
  flex-wrap: wrap; }
form.inline input { padding: 4px 8px; font: inherit; }
details summary { cursor: pointer; color: var(--muted); font-size: 13px; }
svg.chart { background: var(--paper); border: 1px solid var(--line); }
svg.chart text { font: 12px system-ui, "DejaVu Sans", sans-serif; fill: #3a4252; }
svg.chart + svg.chart { margin-top: 12px; }
header form.search { margin-left: auto; display: flex; gap: 6px; }
header form.search input { padding: 4px 8px; font: inherit; border: 1px solid #51608a;
  border-radius: 4px; background: #f7f8fc; }
header form.search button { font: inherit; padding: 3px 10px; border-radius: 4px;
  border: 1px solid #ffd35c; background: #ffd35c; color: #1d2b4f; cursor: pointer; }
mark { background: #ffe58a; color: inherit; padding: 0 1px; }
.entry.hit { border-color: #e0b400; box-shadow: 0 0 0 2px #ffe58a; }
.hit .head a.conversation { font-weight: 600; }
.hit .near { color: var(--muted); font-size: 13px; margin: 2px 0; }
.hit .said { margin: 4px 0; }
.hit .head a.open { margin-left: 8px; }
.state-resumes { color: #a05a00; font-weight: 600; }
.status-ok { color: var(--ok); }
.status-warn { color: #a05a00; }
.status-fail { color: var(--warn); }
.box { background: var(--paper); border: 1px solid var(--line); border-radius: 6px;
  padding: 10px 16px; margin: 8px 0 14px; }
code.raw { color: var(--muted); font-size: 12px; }
time, .nowrap { white-space: nowrap; }
"""
