"""Markup built so that escaping cannot be forgotten: `tag` escapes every child and
attribute value that is not already `Html`, and `Html` is only made here."""

from collections.abc import Iterable
from html import escape
from urllib.parse import urlencode


class Html(str):
    """Text that is already markup (escaped, or built by `tag`)."""

    __slots__ = ()


def esc(value) -> Html:
    if isinstance(value, Html):
        return value
    return Html(escape("" if value is None else str(value), quote=True))


def join(children) -> Html:
    """Children (strings, numbers, None, nested lists) as one escaped fragment."""
    if children is None:
        return Html("")
    if isinstance(children, str | int | float):
        return esc(children)
    return Html("".join(join(c) for c in children))


# Written as `<name ... />`: HTML's void elements, and SVG shapes (which have no content).
_EMPTY = {"br", "hr", "input", "link", "meta", "rect", "line", "path", "circle"}


def tag(name: str, /, *children, **attrs) -> Html:
    """`<name attrs>children</name>`. `class_` stands for `class`; `data_x` for `data-x`;
    an attribute whose value is None or False is left out, True is written bare."""
    parts = [name]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        key = key.rstrip("_").replace("_", "-")
        parts.append(key if value is True else f'{key}="{esc(value)}"')
    if name in _EMPTY and not children:
        return Html(f"<{' '.join(parts)} />")
    return Html(f"<{' '.join(parts)}>{join(children)}</{name}>")


def url(path: str, **params) -> str:
    """A link to `path` with the given query parameters (None ones left out); `tag`
    escapes it as an attribute."""
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return f"{path}?{query}" if query else path


def link(text, path: str, **params) -> Html:
    return tag("a", text, href=url(path, **params))


def table(header: list[str], rows: Iterable[list], empty: str, id: str | None = None) -> Html:
    """A table, or the `empty` sentence when there are no rows; `id` names either."""
    rows = list(rows)
    if not rows:
        return tag("p", empty, class_="empty", id=id)
    return tag("table", tag("thead", tag("tr", [tag("th", h) for h in header])),
               tag("tbody", [tag("tr", [tag("td", cell) for cell in row]) for row in rows]),
               id=id)
