"""The `[email]` section of the config file (DESIGN.md lists every key)."""

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from bot.config import Section
from connectors.email import authres


class EmailConfig(Section):
    enabled: bool = False  # declared first: the validators below read it
    address: str = Field("", validate_default=True)
    imap_host: str = Field("", validate_default=True)
    imap_port: int = Field(993, ge=1, le=65535)
    imap_security: Literal["ssl", "starttls", "none"] = "ssl"
    imap_user: str = ""
    imap_password_env: str = "STEWARD_IMAP_PASSWORD"
    mailbox: str = "INBOX"
    sent_mailbox: str = "Sent"
    smtp_host: str = Field("", validate_default=True)
    smtp_port: int = Field(465, ge=1, le=65535)
    smtp_security: Literal["ssl", "starttls", "none"] = "ssl"
    smtp_user: str = ""
    smtp_password_env: str = "STEWARD_SMTP_PASSWORD"
    allowed_senders: list[str] = Field(default_factory=list)
    allow_everyone: bool = False  # explicitly open; otherwise an empty list = nobody
    # Refuse mail whose receiving server recorded a failed sender authentication in its
    # Authentication-Results (dmarc=fail, or spf=fail without a DKIM pass for the From).
    refuse_failed_auth: bool = True
    require_auth_results: bool = False  # also require a passing Authentication-Results
    # ... written by the receiving server: its authserv-id(s), the first word of the
    # headers it adds (RFC 8601), e.g. "mx.example.com"; several separated by commas or
    # spaces. Empty: the IMAP host's provider (Gmail, Fastmail, iCloud, Outlook.com), else
    # the server that wrote the topmost header (authres.py). Other headers are ignored.
    authserv_id: str = Field("", validate_default=True)
    max_attachment_bytes: int = Field(10_000_000, ge=0)  # stored per attachment
    poll_seconds: float = Field(60.0, gt=0)  # when the server has no IDLE
    idle_seconds: float = Field(1500.0, gt=0, le=1740)  # re-issue IDLE before 29 minutes

    @field_validator("address", "imap_host", "smtp_host")
    @classmethod
    def _required_when_enabled(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("enabled") and not value.strip():
            raise ValueError("must be set when enabled = true")
        return value

    @field_validator("authserv_id")
    @classmethod
    def _needed_to_require_auth(cls, value: str, info: ValidationInfo) -> str:
        known = authres.receiver("", info.data.get("imap_host") or "") is not None
        if info.data.get("require_auth_results") and not value.strip() and not known:
            raise ValueError("must be set when require_auth_results = true (unless imap_host "
                             "is Gmail's, Fastmail's, iCloud's or Outlook.com's): the id your "
                             "receiving mail server writes first in Authentication-Results "
                             "(e.g. \"mx.example.com\"); a header without it proves nothing")
        return value

    def secrets(self) -> list[str]:
        if not self.enabled:
            return []
        return ["imap_password_env", *(["smtp_password_env"] if self.smtp_user else [])]
