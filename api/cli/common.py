"""What every ``fleet`` command shares: the typer app, the consoles, the error printer and the
way times are shown.

Exit status of every command: 0 done; 1 done in part (a bulk archive with sessions refused or
not found, a followed turn that did not complete, a confirmation declined); 2 refused (a usage
error, an error of the request, no fleet found). With ``--json`` an error is printed on stdout
as ``{"error": {"code", "message", "data"}}``, the shape the HTTP API answers.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NoReturn

import typer
import typer.core
from rich.console import Console, ConsoleDimensions
from rich.text import Text
from typer import _click as click  # typer's own click, which its commands are built on
from typer._click.exceptions import UsageError
from typer._click.globals import get_current_context

from orchestrator.errors import FleetError, InvalidParams, SessionActive, quoted_id
from orchestrator.families import names as family_names
from orchestrator.items import ActivityItem
from orchestrator.settings import FleetSettings, MissingRedisUrl

EXIT_CODES = (
    "Exit status: 0 done; 1 done in part (some sessions refused or not found, a followed turn "
    "that did not complete); 2 refused (usage, the request, no fleet found). With --json, "
    'errors are JSON on stdout: {"error": {"code", "message", "data"}}.'
)

#: Width given to output that goes to a pipe or a file: never wrapped.
_UNWRAPPED = 1_000_000


def _tidy_help(text: str | None) -> str | None:
    """A docstring as help: paragraphs joined into single lines (the terminal wraps them)."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def _tidy_params(command: click.Command, ctx: click.Context) -> None:
    """No ``<bool>``/``<str>`` type labels: an option's value shows as its metavar (its name in
    capitals), a flag and an argument as nothing; a default that stands for a setting (0 or
    empty) is not shown, since the help names the setting."""
    for param in command.get_params(ctx):
        if getattr(param, "_fleet_tidy", False):
            continue
        param._fleet_tidy = True  # type: ignore[attr-defined]
        valued = False
        if isinstance(param, typer.core.TyperOption) and not param.is_flag:
            valued = True
            desc = param.type_descriptor
            choices = [str(getattr(c, "value", c)) for c in desc.choices or ()]
            named = "|".join(choices) if desc.is_choice and choices else None
            param.metavar = param.metavar or named or (param.name or "value").upper()
            if not param.default:
                param.show_default = False
        elif isinstance(param, typer.core.TyperOption):
            param.show_default = False  # a flag's help says what it does when given
        elif isinstance(param, typer.core.TyperArgument):
            param.metavar = param.metavar or (param.name or "arg").upper()
        label = param.metavar if valued else None
        setattr(param, "display_type_rich", lambda ctx, label=label: label)  # noqa: B010


@contextmanager
def usage_errors_as_json(args: list[str]) -> Iterator[None]:
    """With ``--json`` among ``args`` (before any ``--``), a usage error raised inside (an
    unknown command or option, a missing argument) is JSON on stdout, as other errors are
    with ``--json``: ``invalid_params``, exit 2. ``--json=VALUE`` counts too: it asks for
    JSON, and its own error ("does not take a value") is one of those. Without it, click's
    usage text, unchanged. (Read on entry: click's parser consumes ``args`` as it goes.)"""
    options = args[: args.index("--")] if "--" in args else args
    wants_json = any(arg == "--json" or arg.startswith("--json=") for arg in options)
    try:
        yield
    except UsageError as exc:
        if not wants_json:
            raise
        from api.errors import error_body

        print(json.dumps(error_body("invalid_params", exc.format_message()), indent=2))
        raise typer.Exit(2) from None


class FleetCommand(typer.core.TyperCommand):
    """A ``fleet`` command: tidy help, and a ``FleetError`` escaping it printed by ``fail``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = _tidy_help(self.help)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _tidy_params(self, ctx)
        super().format_help(ctx, formatter)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with usage_errors_as_json(args):
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        import pydantic
        import redis

        from orchestrator.storage.redisconn import store_unavailable

        try:
            return super().invoke(ctx)
        except FleetError as exc:
            fail(exc)
        except redis.RedisError as exc:
            fail(store_unavailable(exc))
        except pydantic.ValidationError as exc:
            if exc.title != "FleetSettings":
                raise
            fail(InvalidParams(_settings_problem(exc)))


def _settings_problem(exc: Any) -> str:
    """One line per setting a ``pydantic.ValidationError`` of ``FleetSettings`` refused,
    named by its environment variable (``FLEET_API_PORT: Input should be ...``)."""
    said = [
        f"FLEET_{'_'.join(str(part) for part in e['loc']).upper()}: {e['msg']}"
        for e in exc.errors()
    ]
    return "; ".join(said) + "."


class FleetGroup(typer.core.TyperGroup):
    """A ``fleet`` group: tidy help; with ``--json``, an unknown command or option is a JSON
    error (``usage_errors_as_json``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = _tidy_help(self.help)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with usage_errors_as_json(args):
            return super().parse_args(ctx, args)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        with usage_errors_as_json(args):
            return super().resolve_command(ctx, args)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _tidy_params(self, ctx)
        for command in self.commands.values():
            if command.help and not command.short_help:
                # The listing shows each command's first sentence; its --help, all of it.
                command.short_help = re.split(r"(?<=\.)\s", command.help, maxsplit=1)[0]
        super().format_help(ctx, formatter)


class FleetTyper(typer.Typer):
    """``typer.Typer`` whose commands are ``FleetCommand`` and groups ``FleetGroup``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=FleetGroup, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", FleetCommand)
        return super().command(*args, **kwargs)


app = FleetTyper(
    help="agent-fleet: a control plane for agent sessions on Celery and Redis.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=False,
)
sessions_app = FleetTyper(help="List, show and create sessions.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")


class _Out(Console):
    """stdout: as wide as the terminal, or as ``COLUMNS`` says; a pipe or a file gets lines
    that are never wrapped.

    A string is printed as it is: no Rich markup (``[/b]`` in a title, a directory or an id
    is text, not a tag) and no emoji codes (``root:x:0:0`` stays so). Styled output is a
    ``rich.text.Text`` (``Text.assemble(("error", "red"), ...)``), whose plain parts are
    literal too."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, emoji=False, **kwargs)

    @property
    def size(self) -> ConsoleDimensions:
        dims = Console.size.fget(self)  # type: ignore[attr-defined]
        if self.is_terminal or (os.environ.get("COLUMNS") or "").isdigit():
            return dims  # type: ignore[no-any-return]
        return ConsoleDimensions(_UNWRAPPED, dims.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


console = _Out()
err = _Out(stderr=True)


#: ``--family`` choices: the registered families (orchestrator/families).
FamilyName = StrEnum("FamilyName", {name: name for name in family_names()})  # type: ignore[misc]


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.callback()
def _every_command() -> None:
    # What a command changes is audited as done by "cli" (``fleet api`` and ``fleet acp``
    # name their own actors per request or connection).
    from orchestrator.storage import audit

    audit.set_default_actor("cli")


#: API field names in the orchestrator's messages -> what the CLI calls them.
_CLI_WORDS = {
    "stopActivity": "--stop",
    "confirmedActivity": "--confirmed",
    "idleSince": "--idle-since",
    "sessionIds": "session ids",
    "idleSeconds": "--idle-seconds",
}
_WORDS_RE = re.compile(r"\b(" + "|".join(_CLI_WORDS) + r")\b")


def cli_words(message: str) -> str:
    """``message`` with the API's field names replaced by the CLI's options (``stopActivity``
    -> ``--stop``, ``idleSince`` -> ``--idle-since``, a leading ``q`` -> ``--q``)."""
    message = _WORDS_RE.sub(lambda m: _CLI_WORDS[m.group(1)], message)
    return re.sub(r"^q (must|is)\b", r"--q \1", message)


def printable(text: str) -> str:
    """``text`` with each character that is not printable (a control character such as ESC,
    a NUL, a byte-order mark, a right-to-left override) as its Python escape (``\\x1b``,
    ``\\ufeff``, ``\\u202e``): what human output prints of text a client, a model or a file
    chose, so it cannot move the cursor, retitle or hide lines of the terminal, and an
    invisible character shows."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shown_id(session_id: str) -> str:
    """A session id as human output prints it: its first 80 characters (``quoted_id``, as
    the API quotes a malformed one), ``printable``."""
    return printable(quoted_id(session_id))


def item_line(item: ActivityItem) -> str:
    """One live item as human output lists it: ``family id  label``, the label (a prompt's
    or a reminder's text, a job's command) ``printable``."""
    return f"{item.family:9} {item.id}  {printable(item.label)}"


def json_wanted() -> bool:
    """Whether the running command was given ``--json``."""
    ctx = get_current_context(silent=True)
    return bool(ctx is not None and ctx.params.get("as_json"))


def fail(exc: FleetError) -> NoReturn:
    """Print a refused request and exit 2: with ``--json`` the API's error shape on stdout
    (a ``SessionActive`` carries its items in ``data.activity``); otherwise code and message
    on stderr, then the live items of a ``SessionActive``."""
    from api.errors import error_body

    message = cli_words(exc.message)
    if json_wanted():
        print(json.dumps(error_body(exc.code, message, exc.data), indent=2))
        raise typer.Exit(2)
    err.print(Text.assemble(("error", "red"), f" ({exc.code}): {message}"))
    if isinstance(exc, SessionActive):
        for item in exc.items:
            err.print(f"  - {item_line(item)}", highlight=False)
    raise typer.Exit(2)


def usage(message: str) -> NoReturn:
    """A usage error (conflicting or missing options): ``invalid_params``, exit 2."""
    fail(InvalidParams(message))


def when(iso_time: str | None, now: datetime | None = None) -> str:
    """An ISO 8601 instant as people read it, in at most 11 characters: ``just now``,
    ``3 min ago``, ``5 h ago``, ``12 days ago``, then the local date (``2026-01-31``);
    '' for none."""
    if not iso_time:
        return ""
    moment = datetime.fromisoformat(iso_time.replace("Z", "+00:00"))
    seconds = ((now or datetime.now(UTC)) - moment).total_seconds()
    if seconds < 45:
        return "just now"
    if seconds < 3600:
        return f"{max(1, round(seconds / 60))} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    if seconds < 30 * 86400:
        days = int(seconds // 86400)
        return f"{days} day{'s' if days > 1 else ''} ago"
    return moment.astimezone().strftime("%Y-%m-%d")


def local_time(iso_time: str | None) -> str:
    """An ISO 8601 instant in the machine's local time, ``2026-01-31 13:05:09 CET``."""
    if not iso_time:
        return ""
    moment = datetime.fromisoformat(iso_time.replace("Z", "+00:00")).astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z")


def settings_with_redis() -> FleetSettings:
    """The settings of this command, read once from the environment, with a Redis URL: without
    one (or with one of another scheme) the command ends with what to do (exit 2, ``fail``)."""
    settings = FleetSettings()
    try:
        settings.require_redis_url()
    except MissingRedisUrl as exc:  # a refusal like any other: exit 2, JSON with --json
        fail(InvalidParams(str(exc), {"param": "FLEET_REDIS_URL"}))
    return settings


LOOPBACK = ("127.0.0.1", "localhost", "::1")
