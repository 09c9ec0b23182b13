"""A parsed message as Steward stores it: the text the model reads (subject, the new part
of the body, the text of text attachments, and for the others what the agent's `keep`
made of them: an image's note, a document's text), the entry's data (the full body,
headers that matter, attachment notes, the refs of kept files) and one small document per
stored attachment saying where its bytes are. A transcript page never carries attachment
bytes: they are blobs in the home directory, stored before the message is committed."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.attachments import size_label
from bot.port import REF, Kept
from connectors.email.parse import Attachment, Mail
from connectors.email.trim import trim

TEXT_ATTACHMENT_CHARS = 20_000  # of one text attachment, shown to the model
MAX_FULL_TEXT = 1_000_000  # characters of the full body kept in the entry


@dataclass
class Rendered:
    text: str
    data: dict[str, Any]
    documents: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def render(mail: Mail, *, doc_prefix: str, max_attachment_bytes: int,
           kept: Sequence[Kept | None] = ()) -> Rendered:
    """`kept[n]`: what the agent's `keep` made of attachment n (None, or missing: not kept,
    as in an import)."""
    body = trim(mail.body) if mail.body else ""
    parts = [f"Subject: {mail.subject or '(no subject)'}", body or "(no text)"]
    notes, documents, refs = [], [], []
    for n, att in enumerate(mail.attachments, 1):
        took = kept[n - 1] if n <= len(kept) else None
        doc_name = f"{doc_prefix}:{n}" if att.data is not None else None
        parts.append(_attachment_text(att, max_attachment_bytes, took))
        notes.append({"filename": att.filename, "content_type": att.content_type,
                      "size": att.size, "document": doc_name,
                      **({"blob": took.ref.get("blob")} if took else {}),
                      "omitted": None if att.data is not None else
                      f"larger than the {max_attachment_bytes}-byte limit"})
        if took is not None:
            refs.append({**took.ref, "kind": "text"} if att.text is not None else took.ref)
        if doc_name:
            documents.append((doc_name, {
                "filename": att.filename, "content_type": att.content_type, "size": att.size,
                "blob": took.ref.get("blob") if took else None}))
    data: dict[str, Any] = {"email": {
        "from": mail.sender, "from_name": mail.sender_name, "subject": mail.subject,
        "date": mail.date, "message_id": mail.message_id, "references": mail.references,
        "in_reply_to": mail.in_reply_to, "format": mail.body_format,
        "full_text": mail.body[:MAX_FULL_TEXT], "trimmed": body != mail.body.strip(),
        "attachments": notes, "defects": mail.defects}}
    if refs:
        data[REF] = refs
    return Rendered("\n\n".join(parts), data, documents)


def _attachment_text(att: Attachment, cap: int, took: Kept | None) -> str:
    head = f"[Attachment: {att.filename} ({att.content_type}, {size_label(att.size)})"
    if att.data is None:
        return head + f" - not stored: larger than the {size_label(cap)} limit]"
    if att.text is None:
        return took.text if took is not None else head + "]"
    text = att.text
    if len(text) > TEXT_ATTACHMENT_CHARS:
        text = text[:TEXT_ATTACHMENT_CHARS] + (
            f"\n[... {len(att.text) - TEXT_ATTACHMENT_CHARS} more characters not shown]")
    return head + "]\n" + text
