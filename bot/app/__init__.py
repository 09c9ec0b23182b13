"""The composition root: the command line, the wiring of one running Steward (config ->
store -> model, tools, connectors -> task definitions -> runner), the terminal chat and the
importers' front door. The only code in `bot/` that knows the connectors; nothing below
imports it. Kept empty so `steward --help` loads only the parser."""
