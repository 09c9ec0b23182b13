"""Where words came from (bot/provenance.py): the person's own part of a message, whole
addresses, addresses nested in a call's arguments, and the marks entries carry."""

from bot.provenance import MARK, Marked, of_entry, outside_of, own_part, urls_in, whole_urls
from bot.tools.permissions import _may_fetch
from store import Entry


def entry(kind, text, data=None):
    return Entry(1, 1, 1, kind, "you", text, data, None, None, 0.0)


def test_the_own_part_stops_at_a_forward_or_an_attached_file_and_skips_quotes():
    text = ("see http://mine.test/a\n> http://quoted.test/b\nthanks\n\n"
            "---------- Forwarded message ----------\nhttp://theirs.test/c")
    assert own_part(text) == "see http://mine.test/a\nthanks\n"
    attached = "what is this?\n[document: notes.pdf, 2 KB]\nhttp://file.test/d\n[end of notes.pdf]"
    assert own_part(attached) == "what is this?"


def test_only_a_whole_address_is_the_persons():
    own = "please read <http://127.0.0.1:9/p/aaaaaaaaaa>, then (https://x.test/q?a=1)."
    assert whole_urls(own) == {"http://127.0.0.1:9/p/aaaaaaaaaa", "https://x.test/q?a=1"}
    assert _may_fetch("http://127.0.0.1:9/p/aaaaaaaaaa", own, [])
    for prefix in ("http://127.0.0.1:9/p/aaaa", "http://127.0.0.1:9/p/a", "http://127.0.0.1:9"):
        assert not _may_fetch(prefix, own, []), prefix
    assert not _may_fetch("https://x.test/q?a=1&pin=4921", own, [])
    assert _may_fetch("https://docs.example.org/x", "", [".example.org"])


def test_addresses_nested_anywhere_in_arguments_are_found():
    arguments = {"server": "s", "tool": "t", "arguments": {
        "request": [{"target": "see https://evil.test/c?pin=4921."}], "n": 3}}
    assert urls_in(arguments) == ["https://evil.test/c?pin=4921"]


def test_entries_say_why_they_are_outside_text():
    assert of_entry(entry("user", "my own words")) is None
    assert of_entry(entry("user", "> someone said")) == "quoted text"
    assert of_entry(entry("user", "hi", {"attachments": [{"kind": "pdf"}]})) == \
        "an attached file"
    assert of_entry(entry("assistant", "ok", {MARK: "http_get"})) == "http_get"
    assert of_entry(entry("tool_result", "page", {"untrusted": True, "name": "http_get"})) \
        == "a result of http_get"
    assert of_entry(entry("tool_result", "x", ["not", "a", "dict"])) is None
    assert outside_of(Marked("text", "a page")) == "a page"
    assert outside_of("plain") is None and Marked("text") == "text"
