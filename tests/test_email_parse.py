"""Reading real mail without a server: charsets, headers, HTML, trimming, attachments,
threading keys, reply and new-thread headers, and each RFC 3834 rule on its own."""

import email

import pytest

from bot.channels import Outbound
from connectors.email import headers
from connectors.email.charsets import decode
from connectors.email.config import EmailConfig
from connectors.email.parse import Unparsable, html_to_text, parse_mail
from connectors.email.policy import refusal
from connectors.email.reply import build_reply, sent_search
from connectors.email.threads import normalised_subject, reply_subject, thread_tag
from connectors.email.trim import trim


def parse(text: str | bytes, cap: int = 1000):
    raw = text.encode() if isinstance(text, str) else text
    return parse_mail(raw, max_attachment_bytes=cap)


def test_charsets_fall_back_instead_of_failing():
    assert decode("Grüße".encode(), "iso-8859-1") == "Grüße"  # mislabelled UTF-8
    assert decode("Grüße".encode("latin-1"), "utf-8") == "Grüße"  # mislabelled Latin-1
    assert decode(b"plain", "x-unknown") == "plain"
    assert decode(b"plain", "base64") == "plain"  # a codec, not a charset
    assert decode(b"plain", '"UTF8"') == "plain"
    russian = "Привет, это длинное письмо о том, что нужно сделать завтра."
    assert decode(russian.encode("koi8-r"), "unknown-8bit") == russian
    assert decode(b"\x81\x8d\x8f", None)  # undecodable anywhere: replaced, not raised


def test_headers_decode_encoded_words_and_raw_bytes():
    msg = email.message_from_bytes(
        "From: =?utf-8?q?Doe,_Jane?= <Jane@Example.com>\nSubject: =?iso-8859-1?q?caf=E9?= "
        "=?x-bogus?q?ok?=\nTo: Jürgen <j@x.de>\nReferences: <a@b>\n <c@d> <a@b>\n\n".encode())
    assert headers.address(msg) == ("Doe, Jane", "jane@example.com")
    assert headers.address(msg, "To") == ("Jürgen", "j@x.de")
    assert headers.header(msg, "Subject") == "caféok"  # RFC 2047: joined
    assert headers.message_ids(headers.raw(msg, "References")) == ["a@b", "c@d"]
    assert headers.message_ids("<" + "x" * 500 + "@y>")[0].startswith("sha256:")


def test_plain_text_is_preferred_and_html_is_read():
    both = parse("From: a@b.c\nContent-Type: multipart/alternative; boundary=b\n\n--b\n"
                 "Content-Type: text/plain\n\nplain words\n--b\nContent-Type: text/html\n\n"
                 "<p>html words</p>\n--b--\n")
    assert both.body == "plain words" and both.body_format == "plain"
    empty_plain = parse("From: a@b.c\nContent-Type: multipart/alternative; boundary=b\n\n"
                        "--b\nContent-Type: text/plain\n\n \n--b\nContent-Type: text/html\n\n"
                        "<p>only <i>html</i></p>\n--b--\n")
    assert empty_plain.body == "only html" and empty_plain.body_format == "html"
    listed = html_to_text("<ul><li>first</li><li>second</li></ul><script>x()</script>")
    assert [line.strip(" *") for line in listed.splitlines()] == ["first", "second"]
    assert html_to_text("<?xml version='1.0' encoding='utf-8'?><p>x</p>") == "x"
    assert html_to_text("") == ""


def test_unreadable_mail_is_unparsable_with_a_reason():
    for raw, reason in [(b"", "empty"), (b"\x00\x01 junk", "no header section"),
                        (b"Subject: x\n\nbody", "no usable From"),
                        (b"From: nobody\n\nbody", "no usable From")]:
        try:
            parse(raw)
        except Unparsable as exc:
            assert reason in str(exc)
        else:
            raise AssertionError(f"{raw!r} parsed")


def test_attachments_are_capped_and_text_ones_readable():
    mail = parse("From: a@b.c\nContent-Type: multipart/mixed; boundary=b\n\n--b\n\nbody\n--b\n"
                 "Content-Disposition: attachment; filename=\"../../etc/notes.txt\"\n\n"
                 "note text\n--b\nContent-Type: application/octet-stream\n"
                 "Content-Transfer-Encoding: base64\n\n" + "QUFB" * 400 + "\n--b--\n", cap=100)
    small, big = mail.attachments
    assert small.filename == "notes.txt" and small.text.strip() == "note text"
    assert big.filename == "attachment-2.bin" and big.data is None and big.size == 1200


def test_quoted_history_and_signatures_are_trimmed():
    assert trim("Yes.\n\nOn Mon, 1 Jan 2024, Bob <b@x> wrote:\n> old\n") == "Yes."
    assert trim("Yes.\n-- \nAnn\n") == "Yes."
    assert trim("Do it\n\nSent from my iPhone") == "Do it"
    assert trim("Top\n\n-----Original Message-----\nFrom: x\n\nold") == "Top"
    inline = "On Mon, Bob wrote:\n> q1\nanswer 1\n> q2\nanswer 2"
    assert trim(inline) == inline  # inline answers keep their quotes
    assert trim("> all quoted") == "> all quoted"


def test_subjects_and_reply_headers():
    assert reply_subject("Plan") == "Re: Plan"
    assert reply_subject("RE: Plan") == "RE: Plan"
    assert reply_subject("Aw: Plan") == "Aw: Plan"
    assert reply_subject("") == "Re: (no subject)"
    assert normalised_subject("Re: Fwd: RE[2]:  The  Plan") == "the plan"
    message = Outbound(key="T1.answer", conversation_key="email:r@x", conversation_id=3,
                       text="Hi", reply_to={"to": "ann@x.com", "to_name": "Ann",
                                            "subject": "Re: Plan", "message_id": "p@x",
                                            "references": ["r@x", "p@x"]})
    message_id, data = build_reply(message, address="bot@steward.test", name="Steward")
    msg = email.message_from_bytes(data)
    tag = thread_tag("email:r@x")
    assert message_id == f"c3-{tag}.T1.answer@steward.test"
    assert msg["Message-ID"] == f"<{message_id}>"
    assert msg["In-Reply-To"] == "<p@x>" and msg["References"] == "<r@x> <p@x>"
    assert msg["Subject"] == "Re: Plan" and msg["Auto-Submitted"] == "auto-replied"
    assert msg["To"] == "Ann <ann@x.com>" and b"\r\n" in data


def test_a_message_that_answers_no_mail_starts_a_thread_of_its_own():
    # What a schedule delivering by email hands over: an address and its name.
    message = Outbound(key="T2.answer", conversation_key="schedule:s1", conversation_id=4,
                       text="Your to-dos.", reply_to={"to": "ann@x.com",
                                                      "subject": "Weekly digest"})
    message_id, data = build_reply(message, address="bot@steward.test", name="Steward")
    msg = email.message_from_bytes(data)
    assert msg["Message-ID"] == f"<{message_id}>" == (
        f"<c4-{thread_tag('schedule:s1')}.T2.answer@steward.test>")
    assert msg["Subject"] == "Weekly digest" and msg["Auto-Submitted"] == "auto-generated"
    assert msg["In-Reply-To"] is None and msg["References"] is None
    assert msg["To"] == "ann@x.com"
    nameless = Outbound(key="T3.answer", conversation_key="schedule:s2", conversation_id=5,
                        text="Hi", reply_to={"to": "ann@x.com", "subject": "  "})
    assert email.message_from_bytes(build_reply(nameless, address="bot@steward.test",
                                                name="Steward")[1])["Subject"] == (
        "A message from Steward")
    # A reply to mail that had no Message-ID is still a reply.
    no_id = Outbound(key="T4.answer", conversation_key="email:no-id:x", conversation_id=6,
                     text="Hi", reply_to={"to": "ann@x.com", "subject": "Lunch",
                                          "message_id": None, "references": []})
    msg = email.message_from_bytes(build_reply(no_id, address="bot@steward.test",
                                               name="Steward")[1])
    assert msg["Subject"] == "Re: Lunch" and msg["Auto-Submitted"] == "auto-replied"


EVERYONE = EmailConfig(address="steward@example.com", allow_everyone=True)


@pytest.mark.parametrize(("extra", "sender", "reason"), [
    ("Return-Path: <>\n", "ann@example.com", "empty return path (a bounce)"),
    ("Return-Path: < >\n", "ann@example.com", "empty return path (a bounce)"),
    ("", "MAILER-DAEMON@example.com", "automated sender mailer-daemon@example.com"),
    ("", "postmaster@example.com", "automated sender postmaster@example.com"),
    ("", "Steward@Example.com", "mail from Steward's own address"),
    ("Auto-Submitted: auto-generated\n", "ann@example.com", "Auto-Submitted: auto-generated"),
    ("Precedence: junk\n", "ann@example.com", "Precedence: junk"),
    ("List-Post: <mailto:l@x>\n", "ann@example.com", "mailing-list mail (List-Post)"),
    ("X-Autoreply: yes\n", "ann@example.com", "automatic reply (X-Autoreply)"),
    ("Content-Type: multipart/report; boundary=b\n", "ann@example.com",
     "delivery or read report"),
])
def test_each_rfc_3834_rule_refuses_on_its_own(extra, sender, reason):
    raw = f"{extra}From: {sender}\nTo: steward@example.com\nSubject: x\n\nbody\n"
    assert refusal(parse(raw), EVERYONE) == reason


def test_ordinary_mail_passes_when_everyone_is_allowed():
    for extra in ["", "Auto-Submitted: no\n", "Return-Path: <ann@example.com>\n"]:
        raw = f"{extra}From: ann@example.com\nSubject: x\n\nbody\n"
        assert refusal(parse(raw), EVERYONE) is None, extra


def test_a_predecessors_answer_is_found_in_sent_whatever_number_it_had():
    # An answer keyed by the mail it answers is searched by what follows the number (a
    # restored home numbers conversations anew), with or without the tag of older ids.
    tagged = f"c9-{thread_tag('email:r@x')}.in.T1.answer@steward.test"
    assert sent_search(tagged) == sent_search("c9.in.T1.answer@steward.test") == (
        ".in.T1.answer@steward.test>")
    assert sent_search("c9-0123abcd.T2.answer@steward.test") == (
        "<c9-0123abcd.T2.answer@steward.test>")
