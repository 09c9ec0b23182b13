"""Markdown to Slack mrkdwn, and splitting long answers."""

import pytest

from connectors.slack.mrkdwn import LIMIT, render, split, to_mrkdwn


@pytest.mark.parametrize("markdown, mrkdwn", [
    ("**bold** and __also bold__", "*bold* and *also bold*"),
    ("*italic* and _italic_", "_italic_ and _italic_"),
    ("~~gone~~", "~gone~"),
    ("[the docs](https://example.com/a?b=1)", "<https://example.com/a?b=1|the docs>"),
    ("![a cat](https://example.com/cat.png)", "<https://example.com/cat.png|a cat>"),
    ("see <https://example.com>", "see <https://example.com>"),
    ("# Title", "*Title*"),
    ("### **Bold** title ###", "*Bold title*"),
    ("- one\n  * two\n+ three", "• one\n  • two\n• three"),
    ("1. first\n2. second", "1. first\n2. second"),
    ("> quoted **text**", "> quoted *text*"),
    ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
    ("hi <@U123> in <#C456>", "hi <@U123> in <#C456>"),
    ("`**not bold** <x>`", "`**not bold** <x>`"),
    ("```python\nx = a**2 < 3  # *no*\n```", "```\nx = a**2 < 3  # *no*\n```"),
    ("2 * 3 * 4", "2 * 3 * 4"),
    ("snake_case_name", "snake_case_name"),
    ("---", "──────────"),
])
def test_markdown_to_mrkdwn(markdown, mrkdwn):
    assert to_mrkdwn(markdown) == mrkdwn


def test_short_text_is_one_part():
    assert split("hello") == ["hello"]
    assert render("  **hi**  ") == ["*hi*"]
    assert render("") == [" "]  # Slack refuses an empty message


def test_split_prefers_paragraphs_then_lines_then_words():
    paragraphs = "\n\n".join(["p" * 2000, "q" * 2000, "r" * 100])
    assert [len(p) for p in split(paragraphs)] == [2000, 2102]
    words = " ".join(["word"] * 2000)
    parts = split(words)
    assert all(len(p) <= LIMIT for p in parts)
    assert " ".join(parts) == words
    solid = "x" * 8000
    assert "".join(split(solid)) == solid


def test_split_closes_and_reopens_a_code_block():
    text = "intro\n```\n" + "\n".join(f"line {i}" for i in range(800)) + "\n```\nafter"
    parts = split(text)
    assert len(parts) >= 2
    assert all(p.count("```") % 2 == 0 for p in parts)
    assert parts[1].startswith("```\n")


def test_split_of_a_prefix_cuts_where_the_whole_will():
    whole = "\n".join(f"line number {i} of the answer" for i in range(400))
    prefix = whole[:5000]
    assert split(prefix)[0] == split(whole)[0]


ZWSP = "\u200b"


@pytest.mark.parametrize("markdown, shown", [
    ("<!channel> lunch is here", f"@{ZWSP}channel lunch is here"),
    ("<!here|here> and <!everyone>", f"@{ZWSP}here and @{ZWSP}everyone"),
    ("ask <!subteam^S0OPS|@ops> now", f"ask @{ZWSP}ops now"),
    ("ask <!subteam^S0OPS>", f"ask @{ZWSP}group"),
    ("`<!channel>` in code", f"`@{ZWSP}channel` in code"),
    ("```\n<!here>\n```", f"```\n@{ZWSP}here\n```"),
    ("plain @channel and @here", f"plain @{ZWSP}channel and @{ZWSP}here"),
    ("mail me@here.com, @heretic", "mail me@here.com, @heretic"),
    ("hi <@U123> on <!date^1700000000^{date}|today>",
     "hi <@U123> on <!date^1700000000^{date}|today>"),
])
def test_broadcast_mentions_are_shown_as_words_that_ping_nobody(markdown, shown):
    assert render(markdown) == [shown]
    assert "<!" not in "".join(render(markdown)).replace("<!date", "")


def test_broadcast_mentions_stay_when_allowed():
    assert render("<!channel> hi & bye", allow_broadcast=True) == ["<!channel> hi &amp; bye"]
    assert render("<!channel> hi & bye") == [f"@{ZWSP}channel hi &amp; bye"]


def test_text_is_escaped_once():
    assert to_mrkdwn("Tom & Jerry <3") == "Tom &amp; Jerry &lt;3"
