# ruff: noqa
"""Names vulture (tests/test_dead_code.py) cannot see used, each called by something outside
Steward's code: a library's callback, a module-level `__getattr__`, a test's reading.
Vulture reads this file as if it were code that uses them; nothing imports it."""

# module __getattr__: lazy re-exports (Python calls it)
__getattr__
# expat's parser callbacks (bot/attachments/xmltext.py), set as attributes
_.StartDoctypeDeclHandler
_.EntityDeclHandler
_.StartElementHandler
_.EndElementHandler
_.CharacterDataHandler
# html.parser.HTMLParser's callbacks (bot/tools/builtin.py)
_.handle_starttag
_.handle_endtag
_.handle_data
# httpcore's network backend interface (bot/tools/guarded_http.py)
_.connect_unix_socket
# SQLAlchemy: TypeDecorator's hooks and class attributes, event listeners (store/)
_.process_bind_param
impl
cache_ok
_on_connect
_on_begin
_.isolation_level
# slack_sdk's retry Jitter interface (connectors/slack/web.py)
_.recalculate
# aioimaplib's client factory hook, aiosmtplib's protocol state (connectors/email/)
_.create_client
_._response_pending
# a table of the schema's metadata that only migrations and raw SQL name (store/schema.py)
forgotten
# a checkpoint's field the effect reads and writes by its key (bot/agent/llm_call.py)
_.server_wait_since
# pydantic's configuration
model_config
# the connectors, loaded by name (bot/app/wiring.py CONNECTORS)
SlackConnector
EmailConnector
# the scripted model's queue, read by tests (tests/test_llm_clients.py)
_.remaining
