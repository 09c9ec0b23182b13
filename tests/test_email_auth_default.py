"""Sender authentication by default (issue 32, items 5 and 11a).

Mail from an allowed sender whose receiving server recorded a DMARC failure (or an SPF
failure with no aligned DKIM pass) is refused without any configuration, the receiving
server found from the message itself: its Authentication-Results headers are the topmost
ones, above everything a sender wrote, and a sender's own headers claiming "pass" further
down never count. A From naming two addresses is refused as ambiguous.

The header blocks below are laid out as Gmail, Fastmail, iCloud and Outlook.com leave them
in the mailbox (their authserv-ids and result syntax as those servers write them: Gmail one
header, Fastmail several under one id, iCloud one id per check, Microsoft no id at all).
"""

import json

import pytest

from bot.app.config import ConfigError, build_config
from connectors.email import headers
from connectors.email.config import EmailConfig
from connectors.email.parse import parse_mail
from connectors.email.policy import refusal
from tests.fakes.mail_rig import ADDRESS, ALLOWED, Rig
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
    sink_fixture,
)

GMAIL_FAIL = """\
Delivered-To: steward@example.com
Received: by 2002:a05:7300:478f:b0:e1:cb1c:5f4a with SMTP id r15csp1203451dyk;
        Tue, 5 Mar 2024 09:12:01 -0800 (PST)
X-Received: by 2002:a17:906:3b4e:b0:a45:9e60:2f3 with SMTP id h14mr1226317ejf.12;
        Tue, 05 Mar 2024 09:12:01 -0800 (PST)
ARC-Seal: i=1; a=rsa-sha256; t=1709658721; cv=none; d=google.com; s=arc-20160816;
        b=Zm9yZ2VkIG5vdCByZWFsbHkgYSBzZWFs
ARC-Authentication-Results: i=1; mx.google.com;
       spf=fail (google.com: domain of ann@example.com does not designate 203.0.113.9 as
        permitted sender) smtp.mailfrom=ann@example.com;
       dmarc=fail (p=QUARANTINE sp=QUARANTINE dis=QUARANTINE) header.from=example.com
Return-Path: <ann@example.com>
Received: from mail.evil.example (mail.evil.example. [203.0.113.9])
        by mx.google.com with ESMTPS id h14si1234567ejf.12.2024.03.05.09.12.01
        for <steward@example.com>
        (version=TLS1_3 cipher=TLS_AES_256_GCM_SHA384 bits=256/256);
        Tue, 05 Mar 2024 09:12:01 -0800 (PST)
Received-SPF: fail (google.com: domain of ann@example.com does not designate 203.0.113.9 as
        permitted sender) client-ip=203.0.113.9;
Authentication-Results: mx.google.com;
       spf=fail (google.com: domain of ann@example.com does not designate 203.0.113.9 as
        permitted sender) smtp.mailfrom=ann@example.com;
       dmarc=fail (p=QUARANTINE sp=QUARANTINE dis=QUARANTINE) header.from=example.com
"""

GMAIL_PASS = """\
Delivered-To: steward@example.com
Received: by 2002:a05:7300:478f:b0:e1:cb1c:5f4a with SMTP id r15csp1203452dyk;
        Tue, 5 Mar 2024 09:14:01 -0800 (PST)
ARC-Authentication-Results: i=1; mx.google.com;
       dkim=pass header.i=@example.com header.s=s1 header.b=UpITNcvK;
       spf=pass (google.com: domain of ann@example.com designates 198.51.100.25 as permitted
        sender) smtp.mailfrom=ann@example.com;
       dmarc=pass (p=QUARANTINE sp=QUARANTINE dis=NONE) header.from=example.com
Return-Path: <ann@example.com>
Received: from mail.example.com (mail.example.com. [198.51.100.25])
        by mx.google.com with ESMTPS id h14si1234568ejf.12.2024.03.05.09.14.01
        for <steward@example.com>
        (version=TLS1_3 cipher=TLS_AES_256_GCM_SHA384 bits=256/256);
        Tue, 05 Mar 2024 09:14:01 -0800 (PST)
Received-SPF: pass (google.com: domain of ann@example.com designates 198.51.100.25 as permitted
        sender) client-ip=198.51.100.25;
Authentication-Results: mx.google.com;
       dkim=pass header.i=@example.com header.s=s1 header.b=UpITNcvK;
       spf=pass (google.com: domain of ann@example.com designates 198.51.100.25 as permitted
        sender) smtp.mailfrom=ann@example.com;
       dmarc=pass (p=QUARANTINE sp=QUARANTINE dis=NONE) header.from=example.com
"""

# Gmail writes no dkim= for unsigned mail and no dmarc= for a domain without a DMARC record:
# only SPF's verdict, a hard fail here.
GMAIL_SPF_FAIL = """\
Delivered-To: steward@example.com
Return-Path: <ann@example.com>
Received: from mail.evil.example (mail.evil.example. [203.0.113.9])
        by mx.google.com with ESMTPS id h14si1234569ejf.12.2024.03.05.09.15.01
        for <steward@example.com>;
        Tue, 05 Mar 2024 09:15:01 -0800 (PST)
Received-SPF: fail (google.com: domain of ann@example.com does not designate 203.0.113.9 as
        permitted sender) client-ip=203.0.113.9;
Authentication-Results: mx.google.com;
       spf=fail (google.com: domain of ann@example.com does not designate 203.0.113.9 as
        permitted sender) smtp.mailfrom=ann@example.com
"""

FASTMAIL_FAIL = """\
Return-Path: <ann@example.com>
Received: from compute1.internal (compute1.nyi.internal [10.202.2.41])
\t by sloti1d3t01 (Cyrus 3.9.0-alpha0) with LMTPA;
\t Tue, 05 Mar 2024 12:12:02 -0500
X-Spam-score: 5.1
Received-SPF: fail (example.com: 203.0.113.9 is not permitted to send)
 receiver=mx3.messagingengine.com; client-ip=203.0.113.9;
 envelope-from=<ann@example.com>; helo=mail.evil.example
Received: from mx3.messagingengine.com (mx3.nyi.internal [10.202.2.202])
\tby sloti1d3t01 (Cyrus 3.9.0-alpha0) with LMTPA;
\tTue, 05 Mar 2024 12:12:02 -0500
ARC-Authentication-Results: i=1; mx3.messagingengine.com;
    dkim=none (no signatures found);
    dmarc=fail policy.published-domain-policy=quarantine header.from=example.com;
    spf=fail smtp.mailfrom=ann@example.com smtp.helo=mail.evil.example
Authentication-Results: mx3.messagingengine.com;
    x-csa=none;
    x-me-sender=none;
    x-ptr=fail smtp.helo=mail.evil.example policy.ptr=mail.evil.example
Authentication-Results: mx3.messagingengine.com;
    bimi=skipped (DMARC did not pass)
Authentication-Results: mx3.messagingengine.com;
    arc=none (no signatures found)
Authentication-Results: mx3.messagingengine.com;
    dkim=none (no signatures found);
    dmarc=fail policy.published-domain-policy=quarantine
      policy.applied-disposition=quarantine policy.evaluated-disposition=quarantine
      (p=quarantine,d=quarantine,d.eval=quarantine) policy.policy-from=p
      header.from=example.com;
    iprev=pass smtp.remote-ip=203.0.113.9 (mail.evil.example);
    spf=fail smtp.mailfrom=ann@example.com
      smtp.helo=mail.evil.example
Received: from mail.evil.example (mail.evil.example [203.0.113.9])
\t(using TLSv1.3 with cipher TLS_AES_256_GCM_SHA384 (256/256 bits))
\tby mx3.messagingengine.com (Postfix) with ESMTPS
\tfor <steward@example.com>; Tue,  5 Mar 2024 12:12:01 -0500 (EST)
"""

FASTMAIL_PASS = """\
Return-Path: <ann@example.com>
Received: from mx6.messagingengine.com (mx6.nyi.internal [10.202.2.205])
\tby sloti1d3t01 (Cyrus 3.9.0-alpha0) with LMTPA;
\tTue, 05 Mar 2024 12:13:02 -0500
Authentication-Results: mx6.messagingengine.com;
    x-csa=none;
    x-me-sender=none;
    x-ptr=pass smtp.helo=mail.example.com policy.ptr=mail.example.com
Authentication-Results: mx6.messagingengine.com;
    bimi=skipped (DMARC Policy is not at enforcement)
Authentication-Results: mx6.messagingengine.com;
    dkim=pass (2048-bit rsa key sha256) header.d=example.com
      header.i=@example.com header.b=hr44hXYS header.a=rsa-sha256
      header.s=s1 x-bits=2048;
    dmarc=pass policy.published-domain-policy=none
      (p=none,d=none,d.eval=none) policy.policy-from=p
      header.from=example.com;
    iprev=pass smtp.remote-ip=198.51.100.25 (mail.example.com);
    spf=pass smtp.mailfrom=ann@example.com
      smtp.helo=mail.example.com
Received: from mail.example.com (mail.example.com [198.51.100.25])
\tby mx6.messagingengine.com (Postfix) with ESMTPS
\tfor <steward@example.com>; Tue,  5 Mar 2024 12:13:01 -0500 (EST)
"""

ICLOUD_FAIL = """\
Return-Path: <ann@example.com>
Original-recipient: rfc822;steward@example.com
Received: from p00-icloudmta-asmtp-us-west-2a-100-percent-1 (ms-asmtp-me-k8s.p00.prod.me.com
        [17.57.156.36])
\tby p123-mailgateway-smtp-7d9f8c-abcde (mailgateway 2405B23) with SMTP id 9f2a
\tfor <steward@example.com>; Tue, 5 Mar 2024 17:12:03 GMT
X-ICL-SCORE: 3.33333333333
Authentication-Results: bimi.icloud.com; bimi=skipped reason="insufficient dmarc"
Authentication-Results: arc.icloud.com; arc=none
Authentication-Results: dmarc.icloud.com; dmarc=fail header.from=example.com
X-DMARC-Info: pass=fail; dmarc-policy=quarantine; s=r1; d=r1; pdomain=example.com
X-DMARC-Policy: v=DMARC1; p=quarantine
Authentication-Results: dkim-verifier.icloud.com; dkim=none
Authentication-Results: spf.icloud.com; spf=fail (spf.icloud.com: domain of ann@example.com does
        not designate 203.0.113.9 as permitted sender) smtp.mailfrom=ann@example.com
Received-SPF: fail (spf.icloud.com: domain of ann@example.com does not designate 203.0.113.9 as
        permitted sender) receiver=spf.icloud.com; client-ip=203.0.113.9;
        helo=mail.evil.example; envelope-from=ann@example.com
Received: from mail.evil.example (mail.evil.example [203.0.113.9])
\tby p123-mailgateway-smtp-7d9f8c-abcde (mailgateway 2405B23) with ESMTPS id 9f2a
\tfor <steward@example.com> (version=TLS1_3 cipher=TLS_AES_256_GCM_SHA384);
\tTue, 5 Mar 2024 17:12:02 GMT
"""

ICLOUD_PASS = """\
Return-Path: <ann@example.com>
Received: from mail.example.com (mail.example.com [198.51.100.25])
\tby p123-mailgateway-smtp-7d9f8c-abcde (mailgateway 2405B23) with ESMTPS id 9f2b
\tfor <steward@example.com>; Tue, 5 Mar 2024 17:13:02 GMT
Authentication-Results: bimi.icloud.com; bimi=skipped reason="insufficient dmarc"
Authentication-Results: dmarc.icloud.com; dmarc=pass header.from=example.com
Authentication-Results: dkim-verifier.icloud.com;
\tdkim=pass (2048-bit key) header.d=example.com header.i=@example.com header.b=HYnahEVt
Authentication-Results: spf.icloud.com; spf=pass (spf.icloud.com: domain of ann@example.com
        designates 198.51.100.25 as permitted sender) smtp.mailfrom=ann@example.com
"""

OUTLOOK_FAIL = """\
Received: from DM6PR11MB4657.namprd11.prod.outlook.com (2603:10b6:5:2a1::14) by
 PH0PR11MB5830.namprd11.prod.outlook.com with HTTPS; Tue, 5 Mar 2024 17:12:03 +0000
ARC-Authentication-Results: i=1; mx.microsoft.com 1; spf=fail (sender ip is
 203.0.113.9) smtp.rcpttodomain=outlook.com smtp.mailfrom=example.com;
 dmarc=fail (p=quarantine sp=quarantine pct=100) action=quarantine
 header.from=example.com; dkim=none (message not signed); arc=none (0)
Received: from BN2PEPF000044A5.namprd04.prod.outlook.com (2603:10b6:408:108:cafe::1a) by
 DM6PR11MB4657.outlook.office365.com (2603:10b6:5:2a1::14) with Microsoft SMTP Server
 (version=TLS1_2, cipher=TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384) id 15.20.7362.24;
 Tue, 5 Mar 2024 17:12:03 +0000
Authentication-Results: spf=fail (sender IP is 203.0.113.9)
 smtp.mailfrom=example.com; dkim=none (message not signed)
 header.d=none;dmarc=fail action=quarantine header.from=example.com;compauth=fail
 reason=000
Received-SPF: Fail (protection.outlook.com: domain of example.com does not
 designate 203.0.113.9 as permitted sender) receiver=protection.outlook.com;
 client-ip=203.0.113.9; helo=mail.evil.example;
Received: from mail.evil.example (203.0.113.9) by
 BN2PEPF000044A5.mail.protection.outlook.com (10.167.243.156) with Microsoft SMTP
 Server (version=TLS1_3, cipher=TLS_AES_256_GCM_SHA384) id 15.20.7362.11 via Frontend
 Transport; Tue, 5 Mar 2024 17:12:02 +0000
"""

OUTLOOK_PASS = """\
Received: from DM6PR11MB4657.namprd11.prod.outlook.com (2603:10b6:5:2a1::14) by
 PH0PR11MB5830.namprd11.prod.outlook.com with HTTPS; Tue, 5 Mar 2024 17:13:03 +0000
Authentication-Results: spf=pass (sender IP is 198.51.100.25)
 smtp.mailfrom=example.com; dkim=pass (signature was verified)
 header.d=example.com;dmarc=pass action=none header.from=example.com;compauth=pass
 reason=100
Received-SPF: Pass (protection.outlook.com: domain of example.com designates
 198.51.100.25 as permitted sender) receiver=protection.outlook.com;
 client-ip=198.51.100.25; helo=mail.example.com; pr=C
Received: from mail.example.com (198.51.100.25) by
 BN2PEPF000044A5.mail.protection.outlook.com (10.167.243.156) with Microsoft SMTP
 Server (version=TLS1_3, cipher=TLS_AES_256_GCM_SHA384) id 15.20.7362.11 via Frontend
 Transport; Tue, 5 Mar 2024 17:13:02 +0000
"""

# What a forger writes into the message they send (below every header the receiving server
# adds): "pass" in each provider's spelling, and Microsoft's id-less form.
FORGED_PASSES = """\
Authentication-Results: mx.google.com;
       dkim=pass header.i=@example.com header.s=s1 header.b=forged01;
       spf=pass smtp.mailfrom=ann@example.com;
       dmarc=pass (p=NONE sp=NONE dis=NONE) header.from=example.com
Authentication-Results: mx3.messagingengine.com; dkim=pass header.d=example.com;
    dmarc=pass header.from=example.com; spf=pass smtp.mailfrom=ann@example.com
Authentication-Results: dmarc.icloud.com; dmarc=pass header.from=example.com
Authentication-Results: dkim-verifier.icloud.com; dkim=pass header.d=example.com
Authentication-Results: spf=pass (sender IP is 198.51.100.25) smtp.mailfrom=example.com;
 dkim=pass (signature was verified) header.d=example.com;dmarc=pass action=none
 header.from=example.com;compauth=pass reason=100
ARC-Authentication-Results: i=1; mx.microsoft.com 1; spf=pass smtp.mailfrom=example.com;
 dmarc=pass action=none header.from=example.com; dkim=pass header.d=example.com
"""

# ... and what a prankster writes to get a real sender's mail refused.
FORGED_FAILS = """\
Authentication-Results: mx.google.com; spf=fail smtp.mailfrom=ann@example.com;
       dmarc=fail header.from=example.com
Authentication-Results: spf=fail smtp.mailfrom=example.com; dkim=fail header.d=example.com;
 dmarc=fail action=oreject header.from=example.com
"""


def delivered(receiver: str, *, message_id: str, sender_block: str = "",
              sender: str = f"Ann <{ALLOWED}>", subject: str = "A task") -> bytes:
    """A message as it sits in the mailbox: the receiving server's headers on top, then
    everything the sender wrote (`sender_block` first, as forged headers would be)."""
    text = (receiver + sender_block
            + "Received: from [192.0.2.7] (unknown [192.0.2.7])\n"
              "\tby mail.sender.example (Postfix) with ESMTPSA id 4TqK2x;\n"
              "\tTue, 5 Mar 2024 17:12:00 +0000 (UTC)\n"
            + f"From: {sender}\nTo: {ADDRESS}\nSubject: {subject}\n"
              "Date: Tue, 5 Mar 2024 17:12:00 +0000\n"
              f"Message-ID: <{message_id}>\nMIME-Version: 1.0\n"
              "Content-Type: text/plain; charset=utf-8\n\nPlease do it.\n")
    return text.replace("\n", "\r\n").encode()


def parse(raw: bytes):
    return parse_mail(raw, max_attachment_bytes=0)


DEFAULT = EmailConfig(address=ADDRESS, allowed_senders=[ALLOWED])

FAILED = {"gmail": GMAIL_FAIL, "fastmail": FASTMAIL_FAIL, "icloud": ICLOUD_FAIL,
          "outlook": OUTLOOK_FAIL}
PASSED = {"gmail": GMAIL_PASS, "fastmail": FASTMAIL_PASS, "icloud": ICLOUD_PASS,
          "outlook": OUTLOOK_PASS}
IMAP_HOSTS = {"gmail": "imap.gmail.com", "fastmail": "imap.fastmail.com",
              "icloud": "imap.mail.me.com", "outlook": "outlook.office365.com"}


# ------------------------------------------------------------------ through the real path


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_forged_mail_from_an_allowed_sender_is_refused_by_default(store, account, sink,
                                                                      tmp_path):
    # As found: every one of these was answered (require_auth_results defaulted to false,
    # and a From with two addresses was taken as its first).
    refused = {
        "gmail-forged@x": delivered(GMAIL_FAIL, message_id="gmail-forged@x",
                                    sender_block=FORGED_PASSES),
        "fastmail-forged@x": delivered(FASTMAIL_FAIL, message_id="fastmail-forged@x",
                                       sender_block=FORGED_PASSES),
        "icloud-forged@x": delivered(ICLOUD_FAIL, message_id="icloud-forged@x",
                                     sender_block=FORGED_PASSES),
        "outlook-forged@x": delivered(OUTLOOK_FAIL, message_id="outlook-forged@x",
                                      sender_block=FORGED_PASSES),
        "spf-forged@x": delivered(GMAIL_SPF_FAIL, message_id="spf-forged@x",
                                  sender_block=FORGED_PASSES),
        "two-from@x": delivered(GMAIL_PASS.replace("from=example.com", "from=evil.example"),
                                message_id="two-from@x",
                                sender=f"{ALLOWED}, mallory@evil.example"),
    }
    answered = {
        "gmail-ok@x": delivered(GMAIL_PASS, message_id="gmail-ok@x", subject="gmail"),
        "outlook-ok@x": delivered(OUTLOOK_PASS, message_id="outlook-ok@x", subject="outlook"),
        # A server that checks nothing writes no header: not refused by default.
        "unchecked@x": delivered("Return-Path: <ann@example.com>\n",
                                 message_id="unchecked@x", subject="unchecked"),
        # A "fail" a sender wrote below the receiving server's pass proves nothing either.
        "pranked@x": delivered(ICLOUD_PASS, message_id="pranked@x", subject="pranked",
                               sender_block=FORGED_FAILS),
    }
    for raw in [*refused.values(), *answered.values()]:
        await account.append(raw)
    rig = await Rig(store, account, sink, tmp_path).start()
    try:
        await sink.wait_for(len(answered))
        await rig.settle()
    finally:
        await rig.stop()
    assert sorted(m.message["In-Reply-To"] for m in sink.messages) == sorted(
        f"<{key}>" for key in answered)
    reasons = {}
    for key in refused:
        row = await store.submission_state("email", f"msgid:{key}")
        assert row is not None and row["task_id"] is None, key
        reasons[key] = json.loads(row["payload"])["skipped"]
    assert "mx.google.com recorded dmarc=fail" in reasons["gmail-forged@x"]
    assert "mx3.messagingengine.com recorded dmarc=fail" in reasons["fastmail-forged@x"]
    assert "dmarc.icloud.com recorded dmarc=fail" in reasons["icloud-forged@x"]
    assert "recorded dmarc=fail" in reasons["outlook-forged@x"]
    assert "spf=fail" in reasons["spf-forged@x"]
    assert reasons["two-from@x"] == ("ambiguous sender: From names 2 addresses "
                                     "(ann@example.com, mallory@evil.example)")


# ------------------------------------------------------------------ the policy, per provider


@pytest.mark.parametrize("provider", FAILED)
def test_a_recorded_failure_refuses_and_forged_passes_below_never_count(provider):
    mail = parse(delivered(FAILED[provider], message_id="f@x", sender_block=FORGED_PASSES))
    reason = refusal(mail, DEFAULT)
    assert reason is not None and "dmarc=fail" in reason and "refuse_failed_auth" in reason
    # The same with the receiving server named, or its IMAP host known.
    named = DEFAULT.model_copy(update={"imap_host": IMAP_HOSTS[provider]})
    assert refusal(mail, named) == reason
    # An owner who turns it off gets the old behaviour back.
    off = DEFAULT.model_copy(update={"refuse_failed_auth": False})
    assert refusal(mail, off) is None


@pytest.mark.parametrize("provider", PASSED)
def test_a_recorded_pass_is_answered_and_forged_failures_below_never_count(provider):
    for block in ("", FORGED_FAILS):
        mail = parse(delivered(PASSED[provider], message_id="p@x", sender_block=block))
        assert refusal(mail, DEFAULT) is None, block
        required = DEFAULT.model_copy(update={"imap_host": IMAP_HOSTS[provider],
                                              "require_auth_results": True})
        assert refusal(mail, required) is None, block


def test_an_spf_failure_without_an_aligned_dkim_pass_refuses():
    forged = parse(delivered(GMAIL_SPF_FAIL, message_id="s@x", sender_block=FORGED_PASSES))
    assert "spf=fail" in refusal(forged, DEFAULT)
    # Gmail writes one header: a sender's "mx.google.com; dkim=pass" below it fills nothing.
    gmail = DEFAULT.model_copy(update={"imap_host": "imap.gmail.com",
                                       "require_auth_results": True})
    assert "spf=fail" in refusal(forged, gmail)
    # A DKIM pass for the sender's own domain rescues a broken SPF (mail forwarded on), one
    # for someone else's domain does not.
    for signer, refused in (("example.com", False), ("mail.example.com", False),
                            ("evil.example", True)):
        header = GMAIL_SPF_FAIL.rstrip("\n") + f";\n       dkim=pass header.d={signer}\n"
        reason = refusal(parse(delivered(header, message_id="d@x")), DEFAULT)
        assert (reason is not None) == refused, signer
    # SPF softfail or neutral alone is no failure.
    soft = GMAIL_SPF_FAIL.replace("spf=fail", "spf=softfail")
    assert refusal(parse(delivered(soft, message_id="soft@x")), DEFAULT) is None


def test_no_header_from_the_receiving_server_refuses_only_when_required():
    unchecked = parse(delivered("Return-Path: <ann@example.com>\n", message_id="u@x"))
    assert refusal(unchecked, DEFAULT) is None
    # A sender's own pass proves nothing when the server wrote nothing of its own: the
    # topmost header, learned as the receiving server's, is trusted for failures only.
    forged = parse(delivered("", message_id="u2@x", sender_block=FORGED_PASSES))
    assert refusal(forged, DEFAULT) is None
    unvalidated = DEFAULT.model_copy(update={"require_auth_results": True})  # no server known
    assert refusal(forged, unvalidated) == ("no Authentication-Results header from the "
                                            "receiving server")
    for host in IMAP_HOSTS.values():
        required = DEFAULT.model_copy(update={"imap_host": host, "require_auth_results": True})
        assert refusal(unchecked, required).startswith("no Authentication-Results header"), host
    # On a provider's IMAP server, only that provider's headers count: a topmost header
    # from anyone else (here a relay's) is not the receiving server's.
    relayed = parse(delivered("Authentication-Results: relay.example.org; dmarc=pass "
                              "header.from=example.com\n", message_id="r@x"))
    gmail = DEFAULT.model_copy(update={"imap_host": "imap.gmail.com",
                                       "require_auth_results": True})
    assert refusal(relayed, gmail) == "no Authentication-Results header from mx.google.com"


def test_an_unknown_server_is_learned_from_its_topmost_header():
    own = ("Authentication-Results: mail.example.org;\n\tdmarc=fail (p=reject dis=none) "
           "header.from=example.com\n"
           "Authentication-Results: mail.example.org; spf=fail smtp.mailfrom=example.com\n"
           "Authentication-Results: mail.example.org;\n\tdkim=none\n")
    reason = refusal(parse(delivered(own, message_id="o@x", sender_block=FORGED_PASSES)),
                     DEFAULT)
    assert reason is not None and "mail.example.org recorded dmarc=fail" in reason
    # Headers of another id (the sender's own submission server, say) are not its verdict.
    submitted = ("Authentication-Results: mail.example.org; dmarc=pass header.from="
                 "example.com\n")
    lower = "Authentication-Results: smtp.sender.example; spf=fail smtp.mailfrom=x\n"
    assert refusal(parse(delivered(submitted, message_id="o2@x", sender_block=lower)),
                   DEFAULT) is None


def test_a_configured_authserv_id_still_decides():
    mail = parse(delivered(ICLOUD_FAIL, message_id="c@x"))
    # Named ids: only those count (here the iCloud DMARC one is not named).
    named = DEFAULT.model_copy(update={"authserv_id": "spf.icloud.com, dkim-verifier.icloud.com"})
    assert "spf.icloud.com recorded spf=fail" in refusal(mail, named)
    assert "dmarc" not in refusal(mail, named)
    other = DEFAULT.model_copy(update={"authserv_id": "mx.example.org"})
    assert refusal(mail, other) is None


# ------------------------------------------------------------------ config


def test_the_config_defaults_and_keeps_the_old_keys(tmp_path):
    assert EmailConfig().refuse_failed_auth is True
    section = {"enabled": True, "address": ADDRESS, "imap_host": "imap.fastmail.com",
               "smtp_host": "h", "require_auth_results": True}
    env = {"STEWARD_IMAP_PASSWORD": "x"}
    # A provider's IMAP host names its receiving servers: no authserv_id needed.
    assert build_config({"email": section}, home=tmp_path, env=env).email.require_auth_results
    with pytest.raises(ConfigError, match="authserv_id"):
        build_config({"email": {**section, "imap_host": "imap.example.org"}}, home=tmp_path,
                     env=env)
    config = build_config({"email": {**section, "refuse_failed_auth": False,
                                     "authserv_id": "mx.example.org"}},
                          home=tmp_path, env=env)
    assert not config.email.refuse_failed_auth and config.email.authserv_id == "mx.example.org"


# ------------------------------------------------------------------ an ambiguous From


@pytest.mark.parametrize(("value", "addresses"), [
    (f"{ALLOWED}, mallory@evil.example", [ALLOWED, "mallory@evil.example"]),
    (f"<{ALLOWED}>, <mallory@evil.example>", [ALLOWED, "mallory@evil.example"]),
    (f"Ann <{ALLOWED}> <mallory@evil.example>", [ALLOWED, "mallory@evil.example"]),
    (f"Team: {ALLOWED}, mallory@evil.example;", [ALLOWED, "mallory@evil.example"]),
    (f"{ALLOWED} <mallory@evil.example>", [ALLOWED, "mallory@evil.example"]),
    # One address, however it is dressed:
    (f'"Doe, Ann" <{ALLOWED}>', [ALLOWED]),
    (f'"mallory@evil.example" <{ALLOWED}>', [ALLOWED]),
    (f"{ALLOWED} (Ann, mallory@evil.example)", [ALLOWED]),
    (f"=?utf-8?q?mallory=40evil.example?= <{ALLOWED}>", [ALLOWED]),
    (f"Ann <{ALLOWED.upper()}>, {ALLOWED}", [ALLOWED]),
])
def test_every_address_of_a_from_is_read(value, addresses):
    mail = parse(f"From: {value}\nSubject: x\n\nbody\n".encode())
    assert mail.from_addresses == addresses
    reason = refusal(mail, DEFAULT)
    assert (reason is not None and reason.startswith("ambiguous sender")) == (
        len(addresses) > 1), value


def test_two_from_headers_are_ambiguous():
    mail = parse(f"From: {ALLOWED}\nFrom: mallory@evil.example\nSubject: x\n\nbody\n".encode())
    assert headers.addresses(mail.msg, "From") == [ALLOWED, "mallory@evil.example"]
    assert refusal(mail, DEFAULT) == ("ambiguous sender: From names 2 addresses "
                                      "(ann@example.com, mallory@evil.example)")
    same = parse(f"From: {ALLOWED}\nFrom: Ann <{ALLOWED}>\nSubject: x\n\nbody\n".encode())
    assert refusal(same, DEFAULT) is None
