"""The text of office documents, read from the XML parts of their ZIP with the standard
library (blocking: `keep.py` runs it in a reader process): Word (docx), Excel (xlsx),
PowerPoint (pptx) and OpenDocument text, spreadsheets and presentations (odt, ods, odp).

A ZIP is a bomb until shown otherwise: the number of parts is capped, each part is read as
a stream and stops at `PART_BYTES` inflated (whatever its header claims), all parts
together at `TOTAL_BYTES` and `xmltext.ELEMENTS` elements (none nested deeper than
`xmltext.DEPTH`), and reading stops once `max_chars` of text are collected.
Spreadsheet rows are tab-separated, at most `MAX_COLUMNS` cells wide (a cell reference
like XFD1 does not make sixteen thousand empty cells).
"""

from __future__ import annotations

import io
import posixpath
import re
import zipfile
import zlib
from collections.abc import Callable

from . import xmltext
from .errors import TooLarge, Unreadable

MAX_PARTS = 5_000
PART_BYTES = 20_000_000
TOTAL_BYTES = 100_000_000
MAX_COLUMNS = 100
MAX_REPEAT = 100  # an OpenDocument spreadsheet's repeated cells, spaces


class Text:
    """Lines of text up to `max_chars`; past it, `xmltext.Enough` ends the reading."""

    def __init__(self, max_chars: int):
        self.max = max_chars
        self.parts: list[str] = []
        self.used = 0
        self.full = False

    def add(self, piece: str) -> None:
        if self.full:
            raise xmltext.Enough
        self.parts.append(piece)
        self.used += len(piece)
        if self.used >= self.max:
            self.full = True
            raise xmltext.Enough

    def result(self) -> str:
        text = re.sub(r"[ \t]+\n", "\n", "".join(self.parts))
        return re.sub(r"\n{3,}", "\n\n", text).strip()


class Package:
    """A ZIP's parts, each read at most once and within the byte budgets."""

    def __init__(self, data: bytes):
        try:
            self.zip = zipfile.ZipFile(io.BytesIO(data))
            infos = self.zip.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as exc:
            raise Unreadable(f"the document is not a readable ZIP ({exc})") from None
        if len(infos) > MAX_PARTS:
            raise TooLarge(f"the document has {len(infos)} parts (at most {MAX_PARTS})")
        self.names = {i.filename for i in infos}
        self.budget = TOTAL_BYTES
        self.elements = xmltext.ELEMENTS

    def has(self, name: str) -> bool:
        return name in self.names

    def walk(self, name: str, start, end, text) -> None:
        limit = min(PART_BYTES, self.budget)
        if self.zip.getinfo(name).file_size > limit:
            raise TooLarge(f"the part {name} claims more than {limit} bytes inflated")
        counted = _Counted()
        try:
            with self.zip.open(name) as stream:
                counted.stream = stream
                self.elements -= xmltext.walk(counted, limit=limit, start=start, end=end,
                                              text=text, elements=self.elements)
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError,
                RuntimeError) as exc:  # corrupt, encrypted, or an unknown compression
            raise Unreadable(f"the document's part {name} cannot be read ({exc})") from None
        finally:
            self.budget -= counted.total


class _Counted:
    """A part's stream that counts what it inflated (for the budget of all parts)."""

    def __init__(self):
        self.stream = None
        self.total = 0

    def read(self, n: int) -> bytes:
        chunk = self.stream.read(n)
        self.total += len(chunk)
        return chunk


def office_text(data: bytes, kind: str, *, max_chars: int) -> str:
    package = Package(data)
    reader = READERS.get(kind)
    if reader is None:
        raise Unreadable(f"{kind} documents are not read")
    out = Text(max_chars)
    try:
        reader(package, out)
    except xmltext.Enough:
        pass
    text = out.result()
    if out.full:
        text += "\n[... the rest of the document is not shown]"
    return text


# -- Word and PowerPoint: runs of text in paragraphs ------------------------------------

def _runs(out: Text, *, text_tag: str, paragraph: str, breaks: dict[str, str]):
    """Callbacks that keep the text of `text_tag` elements, a newline per paragraph."""
    inside = [0]

    def start(name: str, _attrs: dict) -> None:
        if name == text_tag:
            inside[0] += 1
        elif name in breaks:
            out.add(breaks[name])

    def end(name: str) -> None:
        if name == text_tag:
            inside[0] -= 1
        elif name == paragraph:
            out.add("\n")

    def text(data: str) -> None:
        if inside[0]:
            out.add(data)

    return start, end, text


def _docx(package: Package, out: Text) -> None:
    if not package.has("word/document.xml"):
        raise Unreadable("the document has no word/document.xml part")
    package.walk("word/document.xml", *_runs(out, text_tag="t", paragraph="p", breaks={
        "tab": "\t", "br": "\n", "cr": "\n", "tc": "\t"}))


def _pptx(package: Package, out: Text) -> None:
    slides = sorted((n for n in package.names if re.fullmatch(r"ppt/slides/slide\d+\.xml", n)),
                    key=lambda n: int(re.sub(r"\D", "", posixpath.basename(n))))
    if not slides:
        raise Unreadable("the presentation has no slides")
    for n, name in enumerate(slides, 1):
        out.add(f"[slide {n}]\n")
        package.walk(name, *_runs(out, text_tag="t", paragraph="p", breaks={"br": "\n"}))
        out.add("\n")


def _odf_text(package: Package, out: Text) -> None:
    if not package.has("content.xml"):
        raise Unreadable("the document has no content.xml part")
    package.walk("content.xml", *_odf(out, spreadsheet=False))


def _ods(package: Package, out: Text) -> None:
    if not package.has("content.xml"):
        raise Unreadable("the spreadsheet has no content.xml part")
    package.walk("content.xml", *_odf(out, spreadsheet=True))


def _odf(out: Text, *, spreadsheet: bool):
    """OpenDocument content.xml: paragraphs and headings, or tables of cells."""
    row: list[str] = []
    cell: list[str] = []
    repeat = [1]
    depth = [0]  # inside a paragraph or heading

    def start(name: str, attrs: dict) -> None:
        if name in ("p", "h"):
            depth[0] += 1
            if spreadsheet and cell:
                cell.append(" ")
        elif name == "s" and depth[0]:
            emit(" " * min(int(attrs.get("c", "1") or 1), MAX_REPEAT))
        elif name == "tab" and depth[0]:
            emit("\t")
        elif name == "line-break" and depth[0]:
            emit("\n")
        elif spreadsheet and name == "table":
            out.add(f"[sheet {attrs.get('name', '')}]\n")
        elif spreadsheet and name in ("table-cell", "covered-table-cell"):
            cell.clear()
            repeat[0] = min(_int(attrs.get("number-columns-repeated")), MAX_REPEAT)

    def end(name: str) -> None:
        if name in ("p", "h"):
            depth[0] -= 1
            if not spreadsheet:
                out.add("\n")
        elif spreadsheet and name in ("table-cell", "covered-table-cell"):
            value = "".join(cell).strip()
            room = MAX_COLUMNS - len(row)
            row.extend([value] * max(0, min(repeat[0], room)))
        elif spreadsheet and name == "table-row":
            _row(out, row)
        elif spreadsheet and name == "table":
            out.add("\n")

    def emit(data: str) -> None:
        if spreadsheet:
            cell.append(data)
        else:
            out.add(data)

    def text(data: str) -> None:
        if depth[0]:
            emit(data)

    return start, end, text


def _row(out: Text, row: list[str]) -> None:
    while row and not row[-1]:
        row.pop()
    if row:
        out.add("\t".join(row) + "\n")
    row.clear()


def _int(value: str | None) -> int:
    try:
        return max(1, int(value or 1))
    except ValueError:
        return 1


# -- Excel: shared strings, the workbook's sheets in order, their cells ------------------

def _xlsx(package: Package, out: Text) -> None:
    strings = _shared_strings(package) if package.has("xl/sharedStrings.xml") else []
    for name, part in _sheets(package):
        out.add(f"[sheet {name}]\n")
        package.walk(part, *_cells(out, strings))
        out.add("\n")


def _shared_strings(package: Package) -> list[str]:
    strings: list[str] = []
    current: list[str] = []
    state = {"t": 0, "phonetic": 0}

    def start(name: str, _attrs: dict) -> None:
        if name == "si":
            current.clear()
        elif name in ("t", "rPh"):
            state["t" if name == "t" else "phonetic"] += 1

    def end(name: str) -> None:
        if name == "si":
            strings.append("".join(current))
        elif name in ("t", "rPh"):
            state["t" if name == "t" else "phonetic"] -= 1

    def text(data: str) -> None:
        if state["t"] and not state["phonetic"]:
            current.append(data)

    package.walk("xl/sharedStrings.xml", start, end, text)
    return strings


def _sheets(package: Package) -> list[tuple[str, str]]:
    """(sheet name, part) in the workbook's order; else the worksheet parts by number."""
    listed: list[tuple[str, str]] = []
    targets: dict[str, str] = {}
    if package.has("xl/workbook.xml") and package.has("xl/_rels/workbook.xml.rels"):
        def relation(name: str, attrs: dict) -> None:
            if name == "Relationship":
                targets[attrs.get("Id", "")] = attrs.get("Target", "")

        def sheet(name: str, attrs: dict) -> None:
            if name == "sheet":
                listed.append((attrs.get("name", ""), attrs.get("id", "")))

        package.walk("xl/_rels/workbook.xml.rels", relation, _ignore, _ignore)
        package.walk("xl/workbook.xml", sheet, _ignore, _ignore)
    found = []
    for name, rid in listed:
        target = targets.get(rid, "")
        part = target.lstrip("/") if target.startswith("/") else posixpath.normpath(
            posixpath.join("xl", target))
        if package.has(part):
            found.append((name, part))
    if found:
        return found
    parts = sorted((n for n in package.names if re.fullmatch(r"xl/worksheets/sheet\d+\.xml", n)),
                   key=lambda n: int(re.sub(r"\D", "", posixpath.basename(n))))
    if not parts:
        raise Unreadable("the workbook has no worksheets")
    return [(posixpath.basename(p)[:-4], p) for p in parts]


def _cells(out: Text, strings: list[str]) -> tuple[Callable, Callable, Callable]:
    row: list[str] = []
    cell = {"type": "", "column": 0, "value": [], "in": 0}

    def start(name: str, attrs: dict) -> None:
        if name == "c":
            cell.update(type=attrs.get("t", ""), column=_column(attrs.get("r", ""), len(row)),
                        value=[], **{"in": 0})
        elif name in ("v", "t"):
            cell["in"] += 1

    def end(name: str) -> None:
        if name in ("v", "t"):
            cell["in"] -= 1
        elif name == "c":
            value = "".join(cell["value"])
            if cell["type"] == "s":
                index = _int_or(value)
                value = strings[index] if index is not None and index < len(strings) else ""
            elif cell["type"] == "b":
                value = "TRUE" if value == "1" else "FALSE"
            column = cell["column"]
            if column < MAX_COLUMNS and value:
                row.extend([""] * (column - len(row) + 1))
                row[column] = value
        elif name == "row":
            _row(out, row)

    def text(data: str) -> None:
        if cell["in"]:
            cell["value"].append(data)

    return start, end, text


def _column(ref: str, default: int) -> int:
    letters = re.match(r"[A-Z]{1,3}", ref.upper())
    if not letters:
        return default
    n = 0
    for ch in letters.group(0):
        n = n * 26 + ord(ch) - 64
    return n - 1


def _int_or(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _ignore(*_args) -> None:
    pass


READERS: dict[str, Callable[[Package, Text], None]] = {
    "docx": _docx, "xlsx": _xlsx, "pptx": _pptx, "odt": _odf_text, "odp": _odf_text,
    "ods": _ods}
