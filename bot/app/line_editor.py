"""The line a person types at `steward chat`'s prompt, edited here rather than by the
terminal's driver, as readline does: the driver's own line editing hides what is half
typed from the program, so a reminder written above the prompt wiped it off the screen
(it was still in the driver's buffer, sent with the next Enter, but out of sight). Here the
program holds the line and its cursor, and can take them off the screen (`hide`) and draw
them again (`show`) around whatever it has to say.

The terminal is switched out of its line mode and echo for the whole chat (`editing`) and
given back as it was after it, Ctrl-Z and `fg` included; its signals stay on, so Ctrl-C
is still SIGINT (bot/app/interrupt.py). What is typed while an answer is written is kept,
not echoed into the answer, and shows at the next prompt. Keys: Enter; Backspace, Delete,
Ctrl-D (on an empty line: the end); Left/Right, Home/End, Ctrl-A/E/B/F; Ctrl-U/K/W (kill to
the start, to the end, a word back); Ctrl-L (clear the screen). No history.

Positions are counted in terminal columns (a wide character takes two, a combining mark
none) the way terminals place them: a wide character that does not fit in a row's last
column starts the next row. A resized terminal (SIGWINCH) has rewrapped the line, as
terminals that reflow do: the line is drawn again at the new width.
"""

import asyncio
import codecs
import contextlib
import os
import re
import signal
import termios
import unicodedata
from typing import TextIO

# ESC [ params final, ESC O final; anything else after ESC is a key on its own (Alt-x)
SEQUENCE = re.compile(r"\x1b(?:\[[0-9;?]*[@-~]|O.)", re.S)
MOVES = {"[D": "left", "[C": "right", "[H": "home", "[F": "end", "OH": "home", "OF": "end",
         "OD": "left", "OC": "right", "[1~": "home", "[7~": "home", "[4~": "end", "[8~": "end",
         "[3~": "delete"}
CONTROL = {"\x01": "home", "\x05": "end", "\x02": "left", "\x06": "right", "\x7f": "back",
           "\x08": "back", "\x15": "kill-start", "\x0b": "kill-end", "\x17": "kill-word",
           "\x0c": "clear", "\x04": "eof-or-delete", "\r": "enter", "\n": "enter"}


async def read_ready(fd: int, size: int = 65536) -> bytes:
    """What `fd` has, once the event loop says it is readable (b"" at its end). Raises
    PermissionError, ValueError or NotImplementedError for what the loop cannot watch."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)
    return os.read(fd, size)  # readable: this returns at once


def width_of(char: str) -> int:
    return 0 if unicodedata.combining(char) else \
        2 if unicodedata.east_asian_width(char) in "WF" else 1


def position(text: str, width: int) -> tuple[int, int]:
    """The row and column a terminal of `width` columns leaves its cursor at after `text`
    from a row's start; the column is `width` when the last row is full (the cursor waits
    past it until the next character)."""
    row = column = 0
    for char in text:
        size = width_of(char)
        if size and column + size > width:  # (a full row, or a wide one that does not fit)
            row, column = row + 1, 0
        column += size
    return row, column


class LineEditor:
    def __init__(self, fd: int, out: TextIO, prompt: str):
        self.fd = fd
        self.out = out
        self.prompt = prompt
        self.text = ""
        self.cursor = 0  # in characters of `text`
        self.shown = False  # the prompt and the line are on the screen
        self._row = 0  # the row the terminal's cursor is on, counted from the prompt's
        self._pending = ""  # typed ahead (or pasted) and not taken yet
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._mode: list | None = None

    @contextlib.contextmanager
    def editing(self):
        """The terminal's line mode and echo off while within; its modes given back."""
        saved = termios.tcgetattr(self.fd)
        self._mode = termios.tcgetattr(self.fd)
        self._mode[3] &= ~(termios.ICANON | termios.ECHO)
        self._mode[6][termios.VMIN], self._mode[6][termios.VTIME] = 1, 0
        # TCSANOW: what was typed before the chat started is kept (TCSAFLUSH drops it)
        termios.tcsetattr(self.fd, termios.TCSANOW, self._mode)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGCONT, self._continued)
        loop.add_signal_handler(signal.SIGWINCH, self._resized)
        try:
            yield self
        finally:
            loop.remove_signal_handler(signal.SIGCONT)
            loop.remove_signal_handler(signal.SIGWINCH)
            termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)
            self._mode = None

    def _continued(self) -> None:
        """Back from Ctrl-Z: the shell set the terminal its own way, and wrote over us."""
        if self._mode is not None:
            termios.tcsetattr(self.fd, termios.TCSANOW, self._mode)
        if self.shown:
            self._row = 0
            self._draw()

    def _resized(self) -> None:
        """The terminal rewrapped the line at its new width: the cursor's row in it is
        counted again, and the line drawn over itself."""
        if self.shown:
            self._row = self._cursor_at(self._width())[0]
            self._draw()

    def show(self) -> None:
        """Draw the prompt and the line typed so far, the cursor where it was (on a line of
        its own: whatever was written before ends with a newline)."""
        self._row = 0
        self._draw()
        self.shown = True

    def hide(self) -> None:
        """Take the prompt and the line off the screen, the cursor left where they began."""
        if self.shown:
            self.out.write("\r" + (f"\x1b[{self._row}A" if self._row else "") + "\x1b[J")
            self.out.flush()
            self._row = 0
            self.shown = False

    async def readline(self) -> str | None:
        """The next line (its prompt drawn if it is not yet); None at the end (Ctrl-D on
        an empty line, or the terminal gone)."""
        if not self.shown:
            self.show()
        while True:
            changed = False
            while self._pending:
                key, self._pending = _next_key(self._pending)
                if key is None:  # the start of a key whose rest is still to come
                    break
                if key == "enter":
                    return self.finish()
                if key == "eof-or-delete" and not self.text:
                    self.finish()
                    return None
                changed = self._apply(key) or changed
            if changed:
                self._draw()
            chunk = await read_ready(self.fd)
            if not chunk:
                self.finish()
                return None
            self._pending += self._decoder.decode(chunk)

    def _apply(self, key: str) -> bool:
        """Change the line or its cursor by one key; whether anything changed."""
        text, at = self.text, self.cursor
        if key.startswith("text:"):
            typed = key.removeprefix("text:")
            text, at = text[:at] + typed + text[at:], at + len(typed)
        elif key == "back" and at:
            text, at = text[:at - 1] + text[at:], at - 1
        elif key in ("delete", "eof-or-delete"):
            text = text[:at] + text[at + 1:]
        elif key == "left":
            at = max(0, at - 1)
        elif key == "right":
            at = min(len(text), at + 1)
        elif key == "home":
            at = 0
        elif key == "end":
            at = len(text)
        elif key == "kill-start":
            text, at = text[at:], 0
        elif key == "kill-end":
            text = text[:at]
        elif key == "kill-word":
            before = text[:at].rstrip()  # spaces before the cursor, then a word
            start = len(before) - len(before.split(" ")[-1])
            text, at = text[:start] + text[at:], start
        elif key == "clear":
            self.out.write("\x1b[H\x1b[2J")
            self._row = 0
            return True
        if (text, at) == (self.text, self.cursor):
            return False
        self.text, self.cursor = text, at
        return True

    def finish(self) -> str:
        """The line is done (or left, at Ctrl-C): the cursor to its end, then off it."""
        line = self.text
        self.cursor = len(line)
        self._draw()
        if position(self.prompt + line, self._width())[1] != self._width():
            self.out.write("\n")  # (a full last row: _draw moved the cursor off it already)
        self.out.flush()
        self.text, self.cursor, self._row, self.shown = "", 0, 0, False
        return line

    def _width(self) -> int:
        try:
            return max(1, os.get_terminal_size(self.out.fileno()).columns)
        except (AttributeError, ValueError, OSError):
            return 80

    def _cursor_at(self, width: int) -> tuple[int, int]:
        """The cursor's row and column: on the character after it, where the terminal put
        that character (or past the line's end)."""
        row, column = position(self.prompt + self.text[:self.cursor + 1], width)
        if self.cursor < len(self.text):
            column -= width_of(self.text[self.cursor])
        elif column == width:
            row, column = row + 1, 0
        return row, column

    def _draw(self) -> None:
        """Write the prompt and the line from the prompt's first row, the cursor put back."""
        width = self._width()
        drawn = "\r" + (f"\x1b[{self._row}A" if self._row else "") + "\x1b[J"
        drawn += self.prompt + self.text
        end, last = position(self.prompt + self.text, width)
        if last == width:
            # A full last row leaves the cursor waiting past its last column: move it to
            # the next row, as the next character would, so that the rows count right.
            drawn += " \r\x1b[K"
            end += 1
        row, column = self._cursor_at(width)
        if end > row:
            drawn += f"\x1b[{end - row}A"
        drawn += "\r" + (f"\x1b[{column}C" if column else "")
        self._row = row
        self.out.write(drawn)
        self.out.flush()


def _next_key(pending: str) -> tuple[str | None, str]:
    """The first key of what was typed (a character, or the name of an editing key; a run
    of plain characters taken at once, as pasted text comes) and the rest; (None, pending)
    when it starts a key not complete yet."""
    first = pending[0]
    if first == "\x1b":
        if len(pending) == 1 or (pending[1] in "[O" and not SEQUENCE.match(pending)):
            if len(pending) < 16:  # (a longer one is no sequence: dropped below)
                return None, pending
        match = SEQUENCE.match(pending)
        if match is None:  # ESC then a key (Alt-key): the key alone
            return "ignored", pending[1:]
        return MOVES.get(match.group()[1:], "ignored"), pending[match.end():]
    if first in CONTROL:
        return CONTROL[first], pending[1:]
    if first < " ":
        return "ignored", pending[1:]
    plain = re.match(r"[^\x00-\x1f\x7f]+", pending).group()
    return "text:" + plain, pending[len(plain):]
