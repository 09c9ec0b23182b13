"""`require_auth_results`: only the receiving server's own Authentication-Results header
counts (its authserv-id, `[email] authserv_id`), read as RFC 8601 writes it."""

import pytest

from bot.app.config import ConfigError, build_config
from connectors.email.authres import parse
from connectors.email.parse import parse_mail
from connectors.email.policy import unauthenticated
from tests.fakes.mail_rig import mail

SERVER = "mx.example.com"


def check(*results: str) -> str | None:
    raw = mail()
    head = "".join(f"Authentication-Results: {r}\r\n" for r in results).encode()
    return unauthenticated(parse_mail(head + raw, max_attachment_bytes=0), SERVER)


def test_a_header_without_the_servers_id_proves_nothing():
    # As found: accepted because nobody asked who wrote it.
    assert check("evil.test; dmarc=pass") == f"no Authentication-Results header from {SERVER}"
    assert check("dmarc=pass") is not None  # no authserv-id at all
    assert check("dmarc=pass header.from=example.com; dkim=pass") is not None


def test_a_quoted_semicolon_is_not_a_new_result():
    # As found: the split on ';' ignored quotes, so this read as "dmarc=pass".
    forged = f'{SERVER}; spf=fail smtp.mailfrom="x;dmarc=pass"@evil.test'
    assert check(forged) == "Authentication-Results shows no DMARC pass or aligned DKIM pass"
    assert parse(forged)[1][0].props == {"smtp.mailfrom": '"x;dmarc=pass"@evil.test'}


def test_comments_are_skipped_even_when_they_hold_results():
    assert check(f"{SERVER} (dmarc=pass; fake); spf=none") is not None
    assert check(f"{SERVER}; dkim=pass (signature (nested) ok) header.d=example.com") is None


def test_the_receiving_servers_header_counts_even_below_a_forged_one():
    assert check("evil.test; dmarc=fail", f"{SERVER} 1; dmarc=pass header.from=example.com") \
        is None
    assert check(f"{SERVER.upper()}; DKIM=Pass header.i=@example.com") is None
    assert check(f"{SERVER}; dkim=pass header.d=evil.example") is not None  # not aligned
    assert check(f"{SERVER}; dkim=pass header.d=example.com; dmarc=fail") == \
        "Authentication-Results: dmarc=fail"
    assert check(f"{SERVER}; none") is not None


def test_requiring_auth_results_needs_the_authserv_id(tmp_path):
    section = {"enabled": True, "address": "s@example.com", "imap_host": "h",
               "smtp_host": "h", "require_auth_results": True}
    with pytest.raises(ConfigError, match="authserv_id"):
        build_config({"email": section}, home=tmp_path, env={})
    config = build_config({"email": {**section, "authserv_id": SERVER}}, home=tmp_path,
                          env={"STEWARD_IMAP_PASSWORD": "x"})
    assert config.email.authserv_id == SERVER
