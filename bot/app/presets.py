"""What `steward init` offers: model providers and the common mail providers' settings.

The email table is the one place these values live (the README points at `steward init`).
"""

from dataclasses import dataclass

# (provider written to [llm], default model, key variable, base_url): each name is one
# `[llm] provider` accepts (bot/config.py PROVIDERS) and means the same there. "auto"
# writes no provider (detected at every start), "demo" the offline scripted model.
PROVIDERS = {
    "auto": (None, "", "", ""),
    "openai": ("openai", "gpt-4o-mini", "OPENAI_API_KEY", ""),
    "anthropic": ("anthropic", "claude-sonnet-4-5", "ANTHROPIC_API_KEY", ""),
    "ollama": ("ollama", "", "", ""),  # base_url and model from the Ollama found
    "llamacpp": ("llamacpp", "", "", ""),  # base_url and model from the llama-server found
    "compatible": ("compatible", "", "", ""),  # vLLM, LM Studio, OpenRouter...: --base-url
    "demo": ("demo", "", "", ""),
}


@dataclass(frozen=True)
class MailPreset:
    label: str
    imap: tuple[str, int, str]  # host, port, security
    smtp: tuple[str, int, str]
    sent_mailbox: str
    note: str = ""


EMAIL_PRESETS = {
    "gmail": MailPreset("Gmail", ("imap.gmail.com", 993, "ssl"), ("smtp.gmail.com", 465, "ssl"),
                        "[Gmail]/Sent Mail",
                        "an app password (Google Account, Security, App passwords)"),
    "fastmail": MailPreset("Fastmail", ("imap.fastmail.com", 993, "ssl"),
                           ("smtp.fastmail.com", 465, "ssl"), "Sent",
                           "an app password (Settings, Privacy & Security)"),
    "icloud": MailPreset("iCloud", ("imap.mail.me.com", 993, "ssl"),
                         ("smtp.mail.me.com", 587, "starttls"), "Sent Messages",
                         "an app-specific password (appleid.apple.com)"),
    "outlook": MailPreset("Outlook.com", ("outlook.office365.com", 993, "ssl"),
                          ("smtp-mail.outlook.com", 587, "starttls"), "Sent"),
    "custom": MailPreset("your own server (Dovecot/Postfix...)", ("", 993, "ssl"),
                         ("", 587, "starttls"), "Sent"),
}

