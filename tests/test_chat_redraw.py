"""`steward chat` on a real terminal: a reminder that fires while the person is half-way
through typing a line is written above the prompt, and the prompt comes back with what
they had typed and the cursor where it was; they go on typing and the line sent is the
whole of it. A real `steward chat` in tmux (a terminal emulator: what it shows is what a
person sees), keys sent with send-keys, the screen read with capture-pane."""

import asyncio
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from bot.app.chat import PROMPT
from bot.app.line_editor import LineEditor, position
from tests.test_cli import steward, steward_env
from tests.test_terminal_reminders import remind

WIDTH = 40  # narrow: the half-typed line wraps onto a second row
SOCKET = "steward-chat-redraw"  # a tmux server of the test's own (-L), stopped at its end


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


class Tmux:
    def __init__(self, socket: str):
        assert shutil.which("tmux"), "tmux is needed (scripts/install-test-deps installs it)"
        self.socket = socket

    def run(self, *args: str, env: dict | None = None) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], env=env,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"tmux {' '.join(args)}: {done.stderr}"
        return done.stdout

    def start(self, env: dict, cwd, *command: str) -> None:
        """`command` (a shell's line) in a new window; the server, started here, and so
        the command have `env` as their environment. What it wrote stays readable after it
        ends (remain-on-exit)."""
        self.run("-f", "/dev/null", "new-session", "-d", "-s", "chat", "-x", str(WIDTH),
                 "-y", "24", "-c", str(cwd), " ".join(command), env=env)
        self.run("set-option", "-t", "chat", "remain-on-exit", "on")

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.run("send-keys", "-t", "chat", *(["-l"] if literal else []), *keys)

    def lines(self, joined: bool = True) -> list[str]:
        """The screen's lines, rows a long line wrapped onto joined again (or its rows)."""
        return [line.rstrip() for line in self.run(
            "capture-pane", "-p", *(["-J"] if joined else []), "-t", "chat").splitlines()]

    def cursor(self) -> tuple[int, int]:
        x, y = self.run("display-message", "-p", "-t", "chat",
                        "#{cursor_x} #{cursor_y}").split()
        return int(x), int(y)

    async def shows(self, text: str, seconds: float = 60) -> list[str]:
        lines: list[str] = []
        try:
            async with asyncio.timeout(seconds):
                while True:
                    lines = self.lines()
                    if any(text in line for line in lines):
                        return lines
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(f"no {text!r} on the screen:\n" + "\n".join(lines)) from None

    async def ended(self, seconds: float = 60) -> None:
        async with asyncio.timeout(seconds):
            while True:
                if self.run("display-message", "-p", "-t", "chat", "#{pane_dead}").strip() == "1":
                    return
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=30)


@pytest.fixture
def tmux():
    term = Tmux(f"{SOCKET}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield term
    finally:
        term.stop()


TYPED = "the quick brown fox jumps over the lazy dog"  # wraps: 5 + 43 > WIDTH


async def half_typed(home, tmux) -> None:
    """A chat in tmux with TYPED typed at its prompt, the cursor before "dog"."""
    tmux.start(steward_env(home), home, sys.executable, "-m", "bot", "chat", "--session",
               "cli:talk")
    await tmux.shows("you>")
    tmux.keys(TYPED, literal=True)
    tmux.keys(*["Left"] * 3)
    await tmux.shows("you> " + TYPED)


async def test_a_reminder_keeps_the_half_typed_line_and_its_cursor(home, tmux):
    await half_typed(home, tmux)
    before = tmux.cursor()

    await remind(home, "cli:errands", "buy stamps", seconds=1)
    lines = await tmux.shows("[cli:errands] Reminder: buy stamps.")
    shown = [line for line in lines if line]
    assert shown[-2:] == ["[cli:errands] Reminder: buy stamps.", "you> " + TYPED], lines
    # The cursor where it was on the line: before "dog", one row further down.
    at = len("you> " + TYPED) - 3
    assert tmux.cursor()[0] == at % WIDTH, (before, tmux.cursor(), lines)
    assert tmux.cursor()[1] == before[1] + 1, (before, tmux.cursor(), lines)

    tmux.keys("lazy ", literal=True)  # typing goes on where the cursor is
    tmux.keys("Enter")
    lines = await tmux.shows('You said: "the quick brown fox jumps over the lazy lazy dog"')
    tmux.keys("Enter")  # an empty line ends the chat
    await tmux.ended()
    code, out, _ = await steward(home, "log", "cli:talk")
    assert "the quick brown fox jumps over the lazy lazy dog" in out, out


async def test_what_it_types_is_edited_in_place_and_the_terminal_left_as_it_was(home, tmux):
    """Backspace, Ctrl-U, Ctrl-W, Home/End and Delete edit the line as in a shell; after
    the chat the terminal echoes and reads lines again (its modes given back)."""
    env = steward_env(home)
    tmux.start(env, home, sys.executable, "-m", "bot", "chat", "--session", "cli:talk;",
               "stty", "-a")
    await tmux.shows("you>")
    tmux.keys("scratch this", literal=True)
    tmux.keys("C-u")
    tmux.keys("hello wrold", literal=True)
    tmux.keys("C-w")
    tmux.keys("world!", literal=True)
    tmux.keys("BSpace", "Home", "Delete")
    tmux.keys("H", literal=True)
    tmux.keys("End")
    tmux.keys(".", literal=True)
    await tmux.shows("you> Hello world.")
    tmux.keys("Enter")
    await tmux.shows('You said: "Hello world."')
    tmux.keys("Enter")
    await tmux.ended()
    words = " ".join(tmux.lines()).split()
    assert "icanon" in words and "echo" in words, words


async def test_ctrl_c_at_the_prompt_leaves_the_half_typed_line_on_screen(home, tmux):
    env = steward_env(home)
    tmux.start(env, home, "bash", "-c", f"'{sys.executable} -m bot chat --session cli:talk;"
               " echo exit=$?; stty -a'")
    await tmux.shows("you>")
    tmux.keys(TYPED, literal=True)
    tmux.keys("Home")  # the cursor on the line's first row
    await tmux.shows("you> " + TYPED)
    tmux.keys("C-c")
    await tmux.ended()
    lines = tmux.lines()
    assert "you> " + TYPED in lines, lines
    assert lines[lines.index("you> " + TYPED) + 1] == "exit=130", lines  # below it
    words = " ".join(lines).split()
    assert "icanon" in words and "echo" in words, words


# -- the editor itself, on a pseudo-terminal of the test's own ------------------------------


@pytest.fixture
async def editor():
    master, slave = os.openpty()
    out = os.fdopen(os.dup(slave), "w")
    typed = LineEditor(slave, out, PROMPT)
    try:
        with typed.editing():
            yield typed, master
    finally:
        out.close()
        os.close(slave)
        os.close(master)


async def test_keys_split_across_reads_pasted_lines_and_the_end(editor):
    typed, master = editor
    line = asyncio.ensure_future(typed.readline())
    for chunk in (b"abc\x1b", b"[", b"DX", "h\u00e9".encode()[:2], "h\u00e9".encode()[2:],
                  b"\x17foo  bar  \x17\r"):
        os.write(master, chunk)
        await asyncio.sleep(0.05)  # (read apart or together, the line is the same)
    assert await asyncio.wait_for(line, 30) == "foo  c"  # the cursor was before "c"
    # Pasted: three lines at once; the third edited (Home, Ctrl-D twice, Right, Ctrl-K).
    os.write(master, b"one\rtwo\rxxthree and more\x1b[1~\x04\x04" + b"\x1b[C" * 5 + b"\x0b\r")
    assert [await asyncio.wait_for(typed.readline(), 30) for _ in range(3)] == [
        "one", "two", "three"]
    os.write(master, b"x\x7f\x04")  # typed and erased: Ctrl-D on an empty line ends
    assert await asyncio.wait_for(typed.readline(), 30) is None


async def test_a_wide_character_at_a_rows_end_moves_to_the_next_row_and_the_cursor_too(
        home, tmux):
    """A wide character that does not fit in a row's last column is written at the start
    of the next one (the last column left empty): the cursor is counted the same way."""
    env = steward_env(home)
    tmux.start(env, home, sys.executable, "-m", "bot", "chat", "--session", "cli:talk")
    await tmux.shows("you>")
    first = "a" * (WIDTH - len("you> ") - 1)  # one column left in the first row
    tmux.keys(first + "漢字xyz", literal=True)
    await tmux.shows("字xyz")
    lines = tmux.lines(joined=False)
    row = lines.index("漢字xyz")
    assert lines[row - 1] == "you> " + first, lines
    assert tmux.cursor() == (len("漢字xyz") + 2, row), lines
    tmux.keys(*["Left"] * 4)  # the cursor on 字
    await asyncio.sleep(0.5)
    assert tmux.cursor() == (2, row)
    tmux.keys(*["Left"] * 1)  # on 漢, at the next row's start
    await asyncio.sleep(0.5)
    assert tmux.cursor() == (0, row)
    tmux.keys("Enter")
    await tmux.shows(f'You said: "{first}漢字xyz"')


def test_positions_are_counted_as_a_terminal_places_characters():
    assert position("abcd", 4) == (0, 4)  # full: the cursor waits past the last column
    assert position("abcde", 4) == (1, 1)
    assert position("ab漢", 4) == (0, 4)
    assert position("abc漢", 4) == (1, 2)  # no room for two columns: the next row
    assert position("e\u0301", 4) == (0, 1)  # a combining mark takes none


async def test_a_resized_terminal_redraws_the_half_typed_line_at_its_new_width(home, tmux):
    await half_typed(home, tmux)
    tmux.run("set-option", "-t", "chat", "window-size", "manual")
    tmux.run("resize-window", "-t", "chat", "-x", "20")
    await asyncio.sleep(1.0)
    await remind(home, "cli:errands", "buy stamps", seconds=1)
    lines = await tmux.shows("[cli:errands] Reminder: buy stamps.")
    shown = [line for line in lines if line]
    assert shown[-2:] == ["[cli:errands] Reminder: buy stamps.", "you> " + TYPED], lines
    at = len("you> " + TYPED) - 3
    rows = tmux.lines(joined=False)
    top = len(rows) - 1 - rows[::-1].index("you> " + TYPED[:15])
    assert rows[top - 2:top + 2] == ["[cli:errands] Remind", "er: buy stamps.",
                                     "you> " + TYPED[:15], TYPED[15:35].rstrip()], rows
    assert tmux.cursor() == (at % 20, top + at // 20), rows
    assert [row for row in rows if row.startswith("you>")] == ["you> " + TYPED[:15]], rows
