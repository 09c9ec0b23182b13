"""Reading shared files (bot/attachments/): real images made with Pillow, a real PDF, real
docx/xlsx/odt packages, and the hostile ones (decompression bombs, a corrupt PDF, a zip
bomb, entity expansion, files that lie about their type): each one a note, never an error.
The builders here are used by the Slack, mail and context tests too."""

import asyncio
import hashlib
import io
import os
import stat
import struct
import time
import zipfile
import zlib

import pytest
from PIL import Image

from bot.attachments import Attachments, BlobStore
from bot.attachments.office import office_text
from bot.attachments.pdf import pdf_text
from bot.config import AttachmentsConfig

# -- builders ---------------------------------------------------------------------------


def png(width: int, height: int, *, alpha: bool = False) -> bytes:
    """A real PNG: a gradient (compresses well, decodes like any photo-sized image)."""
    image = Image.linear_gradient("L").resize((width, height))
    image = Image.merge("RGB", (image, image.rotate(90), image))
    if alpha:
        image.putalpha(200)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def jpeg(width: int, height: int, *, orientation: int | None = None) -> bytes:
    image = Image.radial_gradient("L").resize((width, height)).convert("RGB")
    out = io.BytesIO()
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    exif[0x010F] = "Camera Maker"  # metadata that must not reach the model
    image.save(out, "JPEG", quality=90, exif=exif.tobytes())
    return out.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares `width` × `height` (a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 1000)) + chunk(b"IEND", b""))


def pdf(*pages: str) -> bytes:
    """A minimal valid PDF (xref offsets and all), one line of text per page."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", None,
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for text in pages:
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
        content = len(objects)
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                       b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % content)
        kids.append(len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
        b" ".join(b"%d 0 R" % k for k in kids), len(kids))
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (n, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, xref)
    return bytes(out)


W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
S = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
R = 'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"'


def package(parts: dict[str, str | bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, body in parts.items():
            z.writestr(name, body)
    return out.getvalue()


def docx(*paragraphs: str, doctype: str = "") -> bytes:
    body = "".join(f"<w:p><w:r><w:t>{p}</w:t></w:r></w:p>" for p in paragraphs)
    return package({
        "[Content_Types].xml": '<?xml version="1.0"?><Types/>',
        "word/document.xml": f'<?xml version="1.0"?>{doctype}<w:document {W}><w:body>{body}'
                             "</w:body></w:document>"})


def xlsx(rows: list[list[str | int]]) -> bytes:
    strings = sorted({c for row in rows for c in row if isinstance(c, str)})
    cells = []
    for r, row in enumerate(rows, 1):
        cs = []
        for c, value in enumerate(row):
            ref = f"{chr(65 + c)}{r}"
            cs.append(f'<c r="{ref}" t="s"><v>{strings.index(value)}</v></c>'
                      if isinstance(value, str) else f'<c r="{ref}"><v>{value}</v></c>')
        cells.append(f'<row r="{r}">{"".join(cs)}</row>')
    return package({
        "[Content_Types].xml": '<?xml version="1.0"?><Types/>',
        "xl/workbook.xml": f'<workbook {S} {R}><sheets><sheet name="Budget" sheetId="1" '
                           'r:id="rId1"/></sheets></workbook>',
        "xl/_rels/workbook.xml.rels": '<Relationships xmlns="http://schemas.openxmlformats.org/'
                                      'package/2006/relationships"><Relationship Id="rId1" '
                                      'Target="worksheets/sheet1.xml"/></Relationships>',
        "xl/sharedStrings.xml": f"<sst {S}>" + "".join(f"<si><t>{s}</t></si>" for s in strings)
                                + "</sst>",
        "xl/worksheets/sheet1.xml": f"<worksheet {S}><sheetData>{''.join(cells)}</sheetData>"
                                    "</worksheet>"})


def odt(*paragraphs: str) -> bytes:
    ns = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
          'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"')
    body = "".join(f"<text:p>{p}</text:p>" for p in paragraphs)
    return package({"mimetype": "application/vnd.oasis.opendocument.text",
                    "content.xml": f"<office:document-content {ns}><office:body><office:text>"
                                   f"{body}</office:text></office:body></office:document-content>"})


def zip_bomb_docx(inflated: int = 60_000_000) -> bytes:
    """A docx whose document part inflates to `inflated` bytes (about 60 KB compressed)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("word/document.xml", "w") as part:
            part.write(f"<w:document {W}><w:body><w:p><w:r><w:t>".encode())
            block = b"a" * 1_000_000
            for _ in range(inflated // len(block)):
                part.write(block)
            part.write(b"</w:t></w:r></w:p></w:body></w:document>")
    return out.getvalue()


DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
ODT = "application/vnd.oasis.opendocument.text"


def attachments(tmp_path, **settings) -> Attachments:
    return Attachments(BlobStore(tmp_path / "blobs"), AttachmentsConfig(**settings))


def stored(tmp_path) -> list:
    return sorted(p for p in (tmp_path / "blobs").rglob("*") if p.is_file())


# -- the blob store ---------------------------------------------------------------------


async def test_blobs_are_whole_or_absent_and_an_unreferenced_one_is_harmless(tmp_path):
    blobs = BlobStore(tmp_path / "blobs")
    data = b"x" * 10_000
    digest = hashlib.sha256(data).hexdigest()
    final = blobs.path(digest)
    final.parent.mkdir(parents=True)
    (final.parent / ".tmp-left-by-a-crash").write_bytes(b"x" * 10)  # died mid-write
    final.write_bytes(b"x" * 10)  # a damaged copy (a restore gone wrong)
    assert await blobs.get(digest) is None  # checked against its digest
    assert await blobs.put(data) == digest  # written again, whole
    assert await blobs.get(digest) == data
    # kept but never committed (the step died before its commit): the next try finds it
    assert await blobs.put(data) == digest and final.read_bytes() == data
    with pytest.raises(ValueError):
        blobs.path("../../etc/passwd")


# -- images -----------------------------------------------------------------------------


async def test_a_large_png_is_downscaled_and_stored_once(tmp_path):
    keeper = attachments(tmp_path)
    data = png(4000, 3000)
    kept = await keeper.keep(data, name="plan.png", media_type="image/png")
    ref = kept.ref
    assert (ref["kind"], ref["width"], ref["height"]) == ("image", 1568, 1176)
    assert ref["media_type"] in ("image/png", "image/jpeg")
    assert ref["blob_size"] <= AttachmentsConfig().max_image_bytes
    assert kept.text.startswith("[image: plan.png (image/png, ")
    assert "4000×3000, shown at 1568×1176" in kept.text
    [blob] = stored(tmp_path)
    assert blob.name == ref["blob"] == hashlib.sha256(blob.read_bytes()).hexdigest()
    with Image.open(blob) as image:
        assert image.size == (1568, 1176)
    again = await keeper.keep(data, name="same-again.png", media_type="image/png")
    assert again.ref["blob"] == ref["blob"] and stored(tmp_path) == [blob]  # once
    assert stat.S_IMODE(blob.stat().st_mode) == 0o600
    for directory in (tmp_path / "blobs", blob.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert not [p for p in blob.parent.iterdir() if p.name.startswith(".tmp-")]


async def test_a_jpeg_is_turned_upright_and_loses_its_metadata(tmp_path):
    kept = await attachments(tmp_path).keep(jpeg(1200, 800, orientation=6), name="cat.jpg",
                                            media_type="image/jpeg")
    assert (kept.ref["width"], kept.ref["height"]) == (800, 1200)  # rotated by its EXIF
    [blob] = stored(tmp_path)
    assert kept.ref["media_type"] == "image/jpeg"
    with Image.open(blob) as image:
        assert image.format == "JPEG" and not image.getexif()


async def test_a_transparent_png_stays_a_png(tmp_path):
    kept = await attachments(tmp_path).keep(png(300, 200, alpha=True), name="logo.png",
                                            media_type="image/png")
    assert kept.ref["media_type"] == "image/png" and "shown at" not in kept.text


@pytest.mark.parametrize("size", [(100_000, 100_000), (8_000, 8_000)])
async def test_a_decompression_bomb_is_refused_at_its_header(tmp_path, size):
    bomb = png_header_only(*size)
    assert len(bomb) < 200
    kept = await attachments(tmp_path).keep(bomb, name="bomb.png", media_type="image/png")
    assert kept.ref["kind"] == "unreadable" and "blob" not in kept.ref
    assert kept.text.startswith("[attached file: bomb.png (image/png, ")
    assert "(not read: the image declares" in kept.text and "pixel" in kept.text
    assert stored(tmp_path) == []


async def test_a_damaged_image_is_a_note(tmp_path):
    data = png(400, 300)[:300]  # cut off in the middle of its data
    kept = await attachments(tmp_path).keep(data, name="cut.png", media_type="image/png")
    assert kept.ref["kind"] == "unreadable"
    assert "(not read: the image is damaged" in kept.text


async def test_files_that_lie_about_their_type(tmp_path):
    keeper = attachments(tmp_path)
    fake = await keeper.keep(b"<html><script>alert(1)</script></html>", name="photo.jpg",
                             media_type="image/jpeg")
    assert fake.ref["kind"] == "unreadable"
    assert "not read: its content is not an image Steward can read" in fake.text
    real = await keeper.keep(jpeg(64, 64), name="really.png", media_type="image/png")
    assert real.ref["kind"] == "image" and "it is a JPEG image" in real.text
    document = await keeper.keep(pdf("Invoice 42"), name="scan.png", media_type="image/png")
    assert document.ref["kind"] == "pdf" and "Invoice 42" in document.text
    assert "it is a PDF" in document.text


async def test_reading_an_image_leaves_the_event_loop_free(tmp_path):
    data = png(6000, 4000)
    lags: list[float] = []

    async def ticker():
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - before - 0.01)

    ticking = asyncio.create_task(ticker())
    started = time.monotonic()
    await attachments(tmp_path).keep(data, name="big.png", media_type="image/png")
    took = time.monotonic() - started
    ticking.cancel()
    assert max(lags) < max(0.25, took / 3), (max(lags), took)


# -- documents --------------------------------------------------------------------------


async def test_a_pdf_becomes_its_text(tmp_path):
    kept = await attachments(tmp_path).keep(pdf("Total due 99 EUR", "Pay by Friday"),
                                            name="bill.pdf", media_type="application/pdf")
    assert kept.ref["kind"] == "pdf" and kept.ref["blob"]
    assert kept.text.startswith("[document: bill.pdf (application/pdf, ")
    assert "[page 1]\nTotal due 99 EUR" in kept.text and "[page 2]\nPay by Friday" in kept.text
    assert kept.text.endswith("[end of bill.pdf]")


@pytest.mark.parametrize("data", [
    b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 9 0 R >>\nendobj\ntrailer\n<<>>\n%%EOF",
    b"%PDF-1.7\n" + os.urandom(5000),
    pdf("fine")[:60],
], ids=["dangling", "noise", "truncated"])
async def test_a_corrupt_pdf_is_a_note(tmp_path, data):
    kept = await attachments(tmp_path).keep(data, name="bad.pdf", media_type="application/pdf")
    assert kept.ref["kind"] == "unreadable"
    assert kept.text.startswith("[attached file: bad.pdf (application/pdf, ")
    assert "(not read: the PDF" in kept.text


def test_long_documents_are_cut_at_the_limit():
    text = pdf_text(pdf(*[f"page {n} " + "word " * 50 for n in range(30)]), max_chars=500)
    assert 500 <= len(text) < 1500 and "[page 30]" not in text
    long = office_text(docx(*["x" * 100] * 1000), "docx", max_chars=1000)
    assert len(long) < 1200 and long.endswith("[... the rest of the document is not shown]")


async def test_office_documents_become_text(tmp_path):
    keeper = attachments(tmp_path)
    word = await keeper.keep(docx("Agenda", "1. Budget &amp; staff"), name="agenda.docx",
                             media_type=DOCX)
    assert word.ref["kind"] == "docx"
    assert "Agenda\n1. Budget & staff" in word.text
    sheet = await keeper.keep(xlsx([["Item", "Cost"], ["Rent", 1200], ["Food", 300]]),
                              name="budget.xlsx", media_type=XLSX)
    assert "[sheet Budget]\nItem\tCost\nRent\t1200\nFood\t300" in sheet.text
    writer = await keeper.keep(odt("Hello from Writer", "Second line"), name="note.odt",
                               media_type="application/octet-stream")  # by its name
    assert writer.ref["kind"] == "odt" and "Hello from Writer\nSecond line" in writer.text


async def test_a_zip_bomb_is_refused(tmp_path):
    bomb = zip_bomb_docx()
    assert len(bomb) < 200_000
    kept = await attachments(tmp_path).keep(bomb, name="bomb.docx", media_type=DOCX)
    assert kept.ref["kind"] == "unreadable"
    assert "claims more than 20000000 bytes" in kept.text


async def test_entities_in_office_xml_are_refused(tmp_path):
    laughs = ('<!DOCTYPE d [<!ENTITY a "lol"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
              '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>')
    kept = await attachments(tmp_path).keep(docx("&c;", doctype=laughs), name="laughs.docx",
                                            media_type=DOCX)
    assert kept.ref["kind"] == "unreadable" and "DTD or entities (refused)" in kept.text


async def test_broken_packages_and_unknown_binaries_are_notes(tmp_path):
    keeper = attachments(tmp_path)
    broken = await keeper.keep(b"PK\x03\x04" + os.urandom(300), name="x.docx",
                               media_type=DOCX)
    assert broken.ref["kind"] == "unreadable" and "not a readable ZIP" in broken.text
    other = await keeper.keep(b"\x7fELF" + bytes(100), name="tool", media_type="")
    assert other.ref["kind"] == "binary" and other.ref["blob"]
    assert other.text == "[attached file: tool (unknown type, 104 bytes)] (not a text file; " \
                         "not read)"


async def test_a_slow_reader_gives_up(tmp_path):
    kept = await attachments(tmp_path, read_seconds=0.001).keep(
        png(3000, 3000), name="slow.png", media_type="image/png")
    assert kept.ref["kind"] == "unreadable" and "took longer than" in kept.text
