"""The `[slack]` section of the config file (DESIGN.md lists every key)."""

from typing import Literal

from pydantic import Field

from bot.config import Section


class SlackConfig(Section):
    enabled: bool = False
    mode: Literal["socket", "http"] = "socket"
    bot_token_env: str = "SLACK_BOT_TOKEN"
    app_token_env: str = "SLACK_APP_TOKEN"
    signing_secret_env: str = "SLACK_SIGNING_SECRET"
    http_host: str = "127.0.0.1"
    http_port: int = Field(3000, ge=1, le=65535)
    api_base_url: str = "https://slack.com/api/"
    allowed_users: list[str] = Field(default_factory=list)
    allowed_channels: list[str] = Field(default_factory=list)  # empty = any channel
    allow_everyone: bool = False  # explicitly open; otherwise an empty allowed_users = nobody
    unlisted: Literal["refuse", "ignore"] = "refuse"  # refuse politely once, or stay silent
    answer_bots: bool = False  # other bots' messages (never its own)
    max_file_bytes: int = Field(10_000_000, ge=0)  # per file shared (room for a phone photo)
    stream_update_seconds: float = Field(1.0, gt=0)  # between edits of a streaming answer
    # Let answers ping @channel, @here, @everyone and user groups. Off: such mentions in
    # what Steward posts are shown as plain words (the model's text is data, not authority
    # to notify a whole channel).
    allow_broadcast_mentions: bool = False
    # Several workers on one PostgreSQL: an acknowledged event that its worker has not taken
    # in after this many seconds (it died) is taken in by another.
    takeover_seconds: float = Field(20.0, gt=0)
    # Messages sent to Steward while it was down (longer than Slack retries an event) are
    # read from Slack's history when it starts or reconnects, up to this many hours back;
    # 0 turns the catch-up off (catchup.py).
    catchup_hours: float = Field(24.0, ge=0)

    def secrets(self) -> list[str]:
        if not self.enabled:
            return []
        return ["bot_token_env", "app_token_env" if self.mode == "socket" else "signing_secret_env"]
