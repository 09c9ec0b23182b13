"""A schedule that delivers by email, end to end: the agent's `schedule` tool creates it,
the scheduler fires the occurrence, the turn answers it and the email connector sends the
answer to a real SMTP server (aiosmtpd), with its copy in a real Dovecot's Sent. A
scheduled message answers no mail: it starts a thread of its own."""

from datetime import UTC, datetime, timedelta

import pytest

from bot.scheduler.loop import Scheduler
from bot.scheduler.tool import schedule as schedule_tool
from bot.tools import ToolContext
from bot.tools.permissions import Recipients
from connectors.email.channel import SENDING
from connectors.email.threads import thread_tag
from store import new_id
from tests.fakes.mail_rig import ADDRESS, ALLOWED, Rig
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
    sink_fixture,
)


@pytest.fixture
async def rig(store, account, sink, tmp_path):
    made = Rig(store, account, sink, tmp_path)
    yield made
    await made.stop()


async def test_a_schedule_delivered_by_email_sends_one_new_thread(rig, store, account, sink):
    await rig.start()
    asking = await store.ensure_conversation("cli:planner")
    ctx = ToolContext(store=store, task_id=new_id(), conversation_id=asking.id,
                      http=rig.http, timezone="UTC", origin={"channel": "cli"},
                      recipients=Recipients.of([ALLOWED], ["email"]),
                      channels=rig.deps.channels)  # as a tool call gets them
    due = (datetime.now(UTC) + timedelta(days=1)).replace(hour=9, minute=0, second=0,
                                                          microsecond=0)
    made = await schedule_tool.run(ctx, {
        "action": "create", "name": "Weekly digest", "prompt": "Mail me my open to-dos.",
        "at": due.strftime("%Y-%m-%dT%H:%M"), "deliver_to": "email", "email": ALLOWED})
    await store.commit(ctx.writes)
    assert made.content.startswith("Scheduled 'Weekly digest'"), made.content

    scheduler = Scheduler(rig.deps, clock=lambda: due.timestamp() + 2)
    assert await scheduler.fire_due() == 1
    [sent] = await sink.wait_for(1, seconds=30)
    assert await scheduler.fire_due() == 0  # fired once
    await rig.settle(1.0)
    assert len(sink.messages) == 1

    msg = sent.message
    assert sent.rcpt_tos == [ALLOWED] and sent.mail_from == ADDRESS
    assert msg["Subject"] == "Weekly digest"  # its own subject, not "Re: …"
    assert msg["In-Reply-To"] is None and msg["References"] is None
    assert msg["Auto-Submitted"] == "auto-generated"  # RFC 3834: not a reply
    assert msg.get_payload(decode=True).decode().startswith("Answer to [[Scheduled: Weekly")
    [schedule] = await store.list_schedules()
    conversation = await store.get_conversation(f"schedule:{schedule.id}")
    [delivery] = await store.list_tasks(kind="deliver", conversation_id=conversation.id)
    # The Message-ID was derived from the delivery's key (stored before the send).
    tag = thread_tag(conversation.key)
    assert msg["Message-ID"] == f"<c{conversation.id}-{tag}.{delivery.idem_key}@example.com>"
    assert delivery.state == "done" and delivery.result["message_id"] in msg["Message-ID"]
    [copy] = await account.messages("Sent")
    assert copy["Message-ID"] == msg["Message-ID"]
    assert not any(SENDING in f for f in (await account.flags("Sent")).values())
