"""The inbound journal reads back what an earlier process left, whatever the file holds:
a line that is JSON but not one of its records (a list, a number, a string, an event that
is no object) is passed over like a torn line, never a reason not to start."""

import json

from connectors.slack.journal import Journal


def body(n: int) -> dict:
    return {"event_id": f"Ev{n}", "event": {"type": "message", "ts": f"1700000000.00000{n}"}}


async def test_lines_that_are_no_records_do_not_stop_the_start(tmp_path):
    path = tmp_path / "slack-inbox.jsonl"
    lines = [json.dumps({"event": body(1)}), "[1, 2]", "42", '"event"', "null",
             json.dumps({"event": 5}), json.dumps({"event": "Ev1"}), json.dumps({"done": []}),
             json.dumps({"event": body(2)}), json.dumps({"done": "Ev2"}),
             json.dumps({"event": body(3)}), '{"event": {"torn']
    path.write_text("\n".join(lines) + "\n")
    journal = Journal(path)
    assert [b["event_id"] for b in await journal.open()] == ["Ev1", "Ev3"]
    await journal.close()
    # Rewritten with only the pending events: the next start reads the same two.
    assert [b["event_id"] for b in await Journal(path).open()] == ["Ev1", "Ev3"]
