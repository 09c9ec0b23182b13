"""Every `steward COMMAND --help` page says what the command does and what each of its
arguments is: the parser is walked, so a command or argument added without its text
fails here."""

import argparse
import subprocess
import sys

from bot.app.cli import _parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    [group] = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return group.choices


def test_every_subcommand_has_a_description_and_every_argument_a_help_text():
    parser = _parser()
    [group] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    listed = {a.dest: a.help for a in group._choices_actions}
    lacking = []
    for name, sub in group.choices.items():
        if not listed.get(name):
            lacking.append(f"{name}: no line in `steward --help`")
        if not (sub.description or "").strip():
            lacking.append(f"{name}: no description")
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            if not (action.help or "").strip():
                lacking.append(f"{name} {'/'.join(action.option_strings) or action.dest}: "
                               "no help")
    assert lacking == []


def test_a_help_page_shows_the_description_and_the_positionals_help():
    out = subprocess.run([sys.executable, "-m", "bot", "log", "--help"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    description = subcommands()["log"].description
    assert " ".join(description.split()) in " ".join(out.split())
    key_help = next(a.help for a in subcommands()["log"]._actions if a.dest == "key")
    assert " ".join(key_help.split()) in " ".join(out.split())
