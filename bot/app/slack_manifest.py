"""The Slack app manifest (`docs/slack-manifest.yaml`): printed by `steward init` for
Socket Mode or HTTP mode, and the bot scopes `steward doctor` expects a token to have.

The file is written for Socket Mode; HTTP mode is the same app with Socket Mode off and
Slack's two request URLs pointed at Steward. It is edited as text (its layout is ours),
so no YAML library is needed to print it."""

from pathlib import Path

MANIFEST = Path(__file__).resolve().parents[2] / "docs" / "slack-manifest.yaml"
URL_PLACEHOLDER = "https://YOUR-HOST/slack/events"


def manifest(mode: str = "socket", url: str = "") -> str:
    """The manifest for `mode` ("socket" or "http"; `url`: the public /slack/events)."""
    text = MANIFEST.read_text(encoding="utf-8")
    if mode != "http":
        return text
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "socket_mode_enabled: true":
            line = line.replace("true", "false")
        elif stripped.startswith("# request_url:"):
            indent = line[:len(line) - len(line.lstrip())]
            line = f"{indent}request_url: {url or URL_PLACEHOLDER}"
        out.append(line)
    return "\n".join(out) + "\n"


def bot_scopes() -> list[str]:
    """The bot scopes the manifest asks for (oauth_config: scopes: bot: - ...)."""
    scopes, inside = [], False
    for line in MANIFEST.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped == "bot:":
            inside = True
        elif inside and stripped.startswith("- "):
            scopes.append(stripped[2:].split("#")[0].strip())
        elif inside and stripped:
            break
    return scopes
