"""Where a misplaced option goes: one clear message per case, exit status 2, no traceback.

click's own errors name the problem but not the fix (``No such option '--dry-run'`` for
``abl --dry-run run G``, ``Got unexpected extra argument`` for ``--set KEY VALUE``). The ``abl``
group (abl.cli.AblGroup) hands its parse errors and those of the command it runs to ``explain``,
which looks the option up among every command and says where it goes, with the line to type:

- an option of a command given before it (``abl --db X compare E``): ``abl compare --db X E``;
- an option of another command (``abl compare --dry-run E``): the command that has it;
- an option whose one value is ``KEY=VALUE`` given as two words (``--set train.steps 3``):
  ``--set train.steps=3``.

Nothing here names an option or a command: the options are read from the commands themselves,
so a plugin's command (``register_commands``) is covered as it is registered.
"""

from __future__ import annotations

import shlex
from typing import Sequence

import click


class MisplacedOption(click.UsageError):
    """A usage error shown as abl shows user errors (``error: ...``, exit 2), without click's usage block."""

    def show(self, file=None) -> None:  # noqa: ARG002 - click's signature
        click.echo(f"error: {self.format_message()}", err=True)


def option_words(cmd: click.Command) -> dict[str, click.Option]:
    """Every spelling of every option of ``cmd`` (``--dry-run``, ``--no-wait``, ``-h``) -> the option."""
    out: dict[str, click.Option] = {}
    for p in cmd.params:
        if isinstance(p, click.Option):
            for word in (*p.opts, *p.secondary_opts):
                out[word] = p
    return out


def _takes_value(opt: click.Option) -> bool:
    return not opt.is_flag and not opt.count and opt.nargs > 0


def _joined(args: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def _arguments(cmd: click.Command) -> list[str]:
    """The command's positional arguments as its usage line names them (GRID_FILE)."""
    return [p.human_readable_name.upper() + ("..." if p.nargs == -1 else "")
            for p in cmd.params if isinstance(p, click.Argument)]


def _example(name: str, cmd: click.Command, opt: click.Option, word: str) -> str:
    """``abl NAME WORD [METAVAR] ARGUMENTS``: the line that puts the option where it goes."""
    value = [opt.metavar or opt.type.name.upper()] if _takes_value(opt) else []
    return _joined(["abl", name, word, *value]) + (" " + " ".join(_arguments(cmd)) if _arguments(cmd) else "")


def _split(word: str) -> tuple[str, str | None]:
    """``--db=X`` -> (``--db``, ``X``); ``--db`` -> (``--db``, None)."""
    if word.startswith("--") and "=" in word:
        head, _, value = word.partition("=")
        return head, value
    return word, None


def owners(group: click.Group, ctx: click.Context, word: str, but: str | None = None) -> list[tuple[str, click.Command, click.Option]]:
    """The commands (other than ``but``) that have the option ``word``, in the group's order."""
    out = []
    for name, cmd in group.commands.items():
        if name == but or cmd.hidden:
            continue
        opt = option_words(cmd).get(word)
        if opt is not None:
            out.append((name, cmd, opt))
    return out


def before_the_command(group: click.Group, ctx: click.Context, args: Sequence[str],
                       err: click.NoSuchOption) -> click.UsageError:
    """``abl --OPT ... COMMAND ...``: the group has no such option. When the command named after it has
    it, the user's own line with the option moved after the command; else the commands that have it."""
    word, inline = _split(err.option_name)
    args = list(args)
    at = next((i for i, a in enumerate(args) if _split(a)[0] == word), None)
    # the first word after the option that names a command
    named = next((a for a in args[(at or 0) + 1:] if a in group.commands), None)
    if named is not None and at is not None:
        opt = option_words(group.commands[named]).get(word)
        if opt is not None:
            taken = 2 if inline is None and _takes_value(opt) and at + 1 < len(args) and args[at + 1] != named else 1
            moved = args[at:at + taken]
            rest = args[:at] + args[at + taken:]
            c = rest.index(named)
            line = _joined(["abl", *rest[:c + 1], *moved, *rest[c + 1:]])
            return MisplacedOption(f"{word} is an option of `abl {named}`, not of abl itself: it goes after the "
                                   f"command: {line}")
    found = owners(group, ctx, word)
    if not found:
        return err
    where = "; ".join(f"`abl {n}` ({_example(n, c, o, word)})" for n, c, o in found)
    return MisplacedOption(f"{word} is not an option of abl itself; it is an option of {where}")


def of_another_command(group: click.Group, ctx: click.Context, err: click.NoSuchOption) -> click.UsageError:
    """``abl COMMAND --OPT``: COMMAND has no such option; a close spelling of one of its own comes first
    (click's suggestion), else the commands that have it."""
    word, _ = _split(err.option_name)
    name = err.ctx.info_name if err.ctx is not None else None
    if err.possibilities:  # a misspelling of an option this command has
        return err
    found = owners(group, ctx, word, but=name)
    if not found:
        return err
    where = "; ".join(f"`abl {n}` ({_example(n, c, o, word)})" for n, c, o in found)
    own = f" (abl {name} --help lists its options)" if name else ""
    return MisplacedOption(f"{word} is not an option of `abl {name}`{own}; it is an option of {where}")


def two_words(name: str, cmd: click.Command, args: Sequence[str]) -> click.UsageError | None:
    """An option whose value is one ``KEY=VALUE`` word (its metavar says so), given as two words
    (``--set train.steps 3``): the line with them joined. None when there is none (a value without
    ``=`` and no second word is the option's own error: expected KEY=VALUE)."""
    words = option_words(cmd)
    for i, a in enumerate(args):
        if a == "--":
            return None
        opt = words.get(a)
        if opt is None or not _takes_value(opt) or "=" not in (opt.metavar or "") or i + 1 >= len(args):
            continue
        value = args[i + 1]
        if "=" in value:
            continue
        nxt = args[i + 2] if i + 2 < len(args) else None
        if nxt is None or nxt.startswith("-") or nxt.endswith(".toml"):
            continue  # no second word: the option's own check says what it expected
        fix = f"{a} {shlex.quote(value + '=' + nxt)}"
        told = f"{a} {shlex.quote(value)} {shlex.quote(nxt)}"
        return MisplacedOption(f"{a} takes one word, {opt.metavar}, and got two, {told}: write {fix} "
                               f"(abl {name} --help)")
    return None
