"""A parsed message as Steward stores it: the text the model reads (subject, the new part
of the body, the text of text attachments), the entry's data (the full body, headers that
matter, attachment notes) and one document per stored attachment, so that a transcript
page never carries attachment bytes."""

import base64
from dataclasses import dataclass, field
from typing import Any

from connectors.email.parse import Attachment, Mail
from connectors.email.trim import trim

TEXT_ATTACHMENT_CHARS = 20_000  # of one text attachment, shown to the model
MAX_FULL_TEXT = 1_000_000  # characters of the full body kept in the entry


@dataclass
class Rendered:
    text: str
    data: dict[str, Any]
    documents: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def size_label(n: int) -> str:
    for unit in ("bytes", "KB", "MB"):
        if n < 1024 or unit == "MB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


def render(mail: Mail, *, doc_prefix: str, max_attachment_bytes: int) -> Rendered:
    body = trim(mail.body) if mail.body else ""
    parts = [f"Subject: {mail.subject or '(no subject)'}", body or "(no text)"]
    notes, documents = [], []
    for n, att in enumerate(mail.attachments, 1):
        doc_name = f"{doc_prefix}:{n}" if att.data is not None else None
        parts.append(_attachment_text(att, max_attachment_bytes))
        notes.append({"filename": att.filename, "content_type": att.content_type,
                      "size": att.size, "document": doc_name,
                      "omitted": None if att.data is not None else
                      f"larger than the {max_attachment_bytes}-byte limit"})
        if doc_name:
            documents.append((doc_name, {
                "filename": att.filename, "content_type": att.content_type, "size": att.size,
                "base64": base64.b64encode(att.data).decode("ascii")}))
    data = {"email": {
        "from": mail.sender, "from_name": mail.sender_name, "subject": mail.subject,
        "date": mail.date, "message_id": mail.message_id, "references": mail.references,
        "in_reply_to": mail.in_reply_to, "format": mail.body_format,
        "full_text": mail.body[:MAX_FULL_TEXT], "trimmed": body != mail.body.strip(),
        "attachments": notes, "defects": mail.defects}}
    return Rendered("\n\n".join(parts), data, documents)


def _attachment_text(att: Attachment, cap: int) -> str:
    head = f"[Attachment: {att.filename} ({att.content_type}, {size_label(att.size)})"
    if att.data is None:
        return head + f" - not stored: larger than the {size_label(cap)} limit]"
    if att.text is None:
        return head + "]"
    text = att.text
    if len(text) > TEXT_ATTACHMENT_CHARS:
        text = text[:TEXT_ATTACHMENT_CHARS] + (
            f"\n[... {len(att.text) - TEXT_ATTACHMENT_CHARS} more characters not shown]")
    return head + "]\n" + text
