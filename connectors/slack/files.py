"""Files shared with Steward. Text files are downloaded and their content is put under the
message; images, PDFs and office documents are downloaded and handed to the agent's
`keep` (an image goes to the model, a document's text into the message, the bytes into
the blob store, a ref into the message's data); other files are listed by name, type and
size. Downloads use the bot token, stop at `max_file_bytes`, and go only to Slack's own
hosts (or the configured `api_base_url`'s)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httpx

from bot.attachments import wanted
from bot.port import Kept

log = logging.getLogger(__name__)

Keep = Callable[..., Awaitable[Kept]]  # AgentPort.keep

TEXT_MIMETYPES = {"application/json", "application/xml", "application/javascript",
                  "application/x-yaml", "application/yaml", "application/x-sh",
                  "application/sql", "application/toml", "application/x-python"}
TEXT_FILETYPES = {"text", "markdown", "python", "javascript", "typescript", "json", "yaml",
                  "csv", "tsv", "xml", "html", "css", "shell", "sql", "go", "rust", "java",
                  "c", "cpp", "csharp", "ruby", "php", "kotlin", "swift", "toml", "diff",
                  "post", "space"}


def is_text(file: dict) -> bool:
    mimetype = (file.get("mimetype") or "").split(";")[0].strip().lower()
    return (mimetype.startswith("text/") or mimetype in TEXT_MIMETYPES
            or (file.get("filetype") or "").lower() in TEXT_FILETYPES)


class Files:
    def __init__(self, http: httpx.AsyncClient, token: str, api_base_url: str, max_bytes: int):
        self.http = http
        self.token = token
        self.max_bytes = max_bytes
        self.trusted = {urlsplit(api_base_url).hostname or "slack.com"}

    def _trusted(self, url: str) -> bool:
        host = urlsplit(url).hostname or ""
        return host in self.trusted or host == "slack.com" or host.endswith(".slack.com")

    async def describe(self, files: tuple[dict, ...] | list[dict], keep: Keep | None = None
                       ) -> tuple[str, list[dict]]:
        """The text to append to the message (one section per file) and the refs of the
        files `keep` took (for the message's data)."""
        parts, refs = [], []
        for file in files:
            text, kept = await self._one(file, keep)
            parts.append("\n\n" + text)
            if kept is not None:
                refs.append(kept.ref)
        return "".join(parts), refs

    async def _one(self, file: dict, keep: Keep | None) -> tuple[str, Kept | None]:
        name = file.get("name") or file.get("title") or file.get("id") or "file"
        size = int(file.get("size") or 0)
        kind = file.get("mimetype") or file.get("filetype") or "unknown type"
        head = f"[attached file: {name} ({kind}, {size} bytes)]"
        url = file.get("url_private_download") or file.get("url_private") or ""
        if file.get("mode") == "tombstone" or not url:
            return f"{head} (no longer available)", None
        readable = keep is not None and wanted(file.get("mimetype") or "", name)
        if not is_text(file) and not readable:
            return f"{head} (not a text file; not read)", None
        if size > self.max_bytes:
            return f"{head} (larger than the {self.max_bytes}-byte limit; not read)", None
        if not self._trusted(url):
            return f"{head} (not hosted by Slack; not read)", None
        try:
            data = await self._download(url, html=kind.endswith("html"))
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("slack: downloading %s failed: %s", name, exc)
            return f"{head} (could not be downloaded: {exc})", None
        if data is None:
            return f"{head} (larger than the {self.max_bytes}-byte limit; not read)", None
        if readable:
            assert keep is not None
            kept = await keep(data, name=name, media_type=file.get("mimetype") or "")
            return kept.text, kept
        if b"\x00" in data:
            return f"{head} (binary content; not read)", None
        return f"{head}\n{data.decode('utf-8', 'replace')}\n[end of {name}]", None

    async def _download(self, url: str, *, html: bool) -> bytes | None:
        """The file's bytes, or None past the cap (the download stops there)."""
        chunks: list[bytes] = []
        total = 0
        headers = {"Authorization": f"Bearer {self.token}"}
        async with self.http.stream("GET", url, headers=headers, follow_redirects=True,
                                    timeout=30.0) as response:
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            if "text/html" in response.headers.get("content-type", "") and not html:
                raise ValueError("Slack answered with a login page (is files:read granted?)")
            async for chunk in response.aiter_bytes():
                total += len(chunk)
                if total > self.max_bytes:
                    return None
                chunks.append(chunk)
        return b"".join(chunks)
