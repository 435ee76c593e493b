"""The CLI's command declarations, parsed by Click.

Every command module declares its flags with `spec.add_argument(...)` in the argparse vocabulary
it always used (the keywords mean what argparse documents); `CommandSpec` turns each declaration
into one Click parameter when the tree is built, and Click does the parsing, the help and the
usage errors. Handlers still take `(context, args)`: `parse_args` merges the values of every
level of the command path into one `argparse.Namespace`, a subcommand's value winning over its
group's, as argparse's subparsers did.

What argparse had and Click has not is rebuilt here and only here: mutually exclusive groups,
options whose value is optional (`nargs="?"`), options taking every word up to the next option
(`nargs="+"`), several flags writing one destination (`--json` into `output`), defaults a flag
does not set unless given (`argparse.SUPPRESS`), and `spec.error(...)` for a handler's own usage
error. A usage error is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import click
from click.core import ParameterSource

# Flags a user gives (typed or from the environment), as opposed to a default.
_GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
_CONTEXT_SETTINGS: dict[str, Any] = {
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
}


class _Converted(click.ParamType):
    """An argparse `type=` callable (and `choices=`) as a Click type, with argparse's messages."""

    def __init__(self, convert: Callable[[str], Any], choices: Sequence[Any] | None) -> None:
        self._convert = convert
        self._choices = tuple(choices) if choices is not None else None
        self.name = getattr(convert, "__name__", "value")

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str | None:
        return "{" + ",".join(map(str, self._choices)) + "}" if self._choices else None

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value  # a default given already converted, or a flag's constant
        try:
            converted = self._convert(value)
        except argparse.ArgumentTypeError as exc:
            self.fail(str(exc), param, ctx)
        except (TypeError, ValueError):
            self.fail(f"invalid {self.name} value: {value!r}", param, ctx)
        if self._choices is not None and converted not in self._choices:
            choices = ", ".join(repr(choice) for choice in self._choices)
            self.fail(f"invalid choice: {converted!r} (choose from {choices})", param, ctx)
        return converted


class _GreedyOption(click.Option):
    """`nargs="+"` on an option: it takes every word up to the next option (or `--`)."""

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)
        for name in self.opts:
            option = parser._long_opt.get(name) or parser._short_opt.get(name)
            take_one = option.process

            def take_all(value: Any, state: Any, take_one: Any = take_one) -> None:
                take_one(value, state)
                while state.rargs and not state.rargs[0].startswith("-"):
                    take_one(state.rargs.pop(0), state)

            option.process = take_all


@dataclass
class _Declaration:
    """One `add_argument` call, kept as given: each command built from it gets a fresh parameter."""

    flags: tuple[str, ...]
    options: dict[str, Any]
    exclusive: _ExclusiveGroup | None = None

    @property
    def positional(self) -> bool:
        return not self.flags[0].startswith("-")

    @property
    def dest(self) -> str:
        if "dest" in self.options:
            return str(self.options["dest"])
        if self.positional:
            return self.flags[0]
        long = next((flag for flag in self.flags if flag.startswith("--")), self.flags[0])
        return long.lstrip("-").replace("-", "_")

    @property
    def suppressed(self) -> bool:
        return self.options.get("default") is argparse.SUPPRESS


@dataclass
class _ExclusiveGroup:
    """add_mutually_exclusive_group: at most one of its flags (exactly one when required);
    `_check_exclusive` enforces it once the command's flags are parsed."""

    spec: CommandSpec
    required: bool = False

    def add_argument(self, *flags: str, **options: Any) -> None:
        self.spec._declare(flags, options, exclusive=self)


def _help_text(options: dict[str, Any]) -> str | None:
    text = options.get("help")
    if text is None or text is argparse.SUPPRESS:
        return None
    return str(text).replace("%(default)s", str(options.get("default"))).replace("%%", "%")


def _param_type(options: dict[str, Any]) -> click.ParamType | None:
    convert, choices = options.get("type"), options.get("choices")
    if convert is None and choices is None:
        return None
    return _Converted(convert or str, choices)


def _click_option(name: str, declaration: _Declaration) -> click.Option:
    """One flag: argparse's action, nargs, const and default as Click's equivalents."""
    options = declaration.options
    action = options.get("action")
    common: dict[str, Any] = {
        "help": _help_text(options),
        "required": bool(options.get("required")),
        "metavar": options.get("metavar"),
        "hidden": options.get("help") is argparse.SUPPRESS,
    }
    default = None if declaration.suppressed else options.get("default")
    flags = [*declaration.flags, name]
    if action in ("store_true", "store_false"):
        flag = action == "store_true"
        return click.Option(
            flags, is_flag=True, flag_value=flag, default=options.get("default", not flag), **common
        )
    if action == "store_const":
        return click.Option(
            flags, is_flag=True, flag_value=options["const"], default=default, **common
        )
    kind = _param_type(options)
    if action in ("append", "extend"):
        cls = _GreedyOption if options.get("nargs") == "+" else click.Option
        return cls(flags, multiple=True, type=kind, **common)
    if options.get("nargs") == "?":
        return click.Option(
            flags,
            is_flag=False,
            flag_value=options.get("const"),
            type=kind,
            default=default,
            **common,
        )
    # argparse's metavar when none is declared: the destination in capitals.
    if options.get("choices") is None:
        common["metavar"] = common["metavar"] or declaration.dest.upper()
    return click.Option(flags, type=kind, default=default, show_default=False, **common)


def _argument_metavar(metavar: str | None, nargs: Any) -> str | None:
    """argparse's `FILE [FILE ...]` as Click writes a repeated positional: `FILE...`."""
    if metavar is None or " " in metavar or nargs not in ("*", "+"):
        return metavar
    return f"[{metavar}]..." if nargs == "*" else f"{metavar}..."


class _Argument(click.Argument):
    """A positional with argparse's help text (Click's own arguments carry none)."""

    def __init__(self, *args: Any, help_text: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help_text = help_text


def _click_argument(name: str, declaration: _Declaration) -> click.Argument:
    options = declaration.options
    nargs = options.get("nargs")
    many = nargs in ("*", "+", argparse.REMAINDER)
    return _Argument(
        [name],
        nargs=-1 if many else 1,
        required=nargs in (None, "+"),
        type=_param_type(options),
        metavar=_argument_metavar(options.get("metavar"), nargs),
        default=options.get("default") if nargs == "?" else None,
        help_text=_help_text(options),
    )


class CommandSpec:
    """One command (or group of subcommands) declared in argparse's words, built as Click's."""

    def __init__(
        self,
        prog: str,
        *,
        help_text: str | None = None,
        parents: Sequence[CommandSpec] = (),
        passthrough: bool = False,
    ) -> None:
        self.prog = prog
        self.help_text = help_text
        self.passthrough = passthrough  # role commands: every argument reaches the service
        # A parent's flags (the global options) are declared again on this command.
        self.declarations: list[_Declaration] = [d for p in parents for d in p.declarations]
        self.defaults: dict[str, Any] = {}
        self.subcommands: dict[str, CommandSpec] = {}
        self.version: str | None = None

    # ---- argparse's declaration API -------------------------------------------------------

    def _declare(
        self, flags: Sequence[str], options: dict[str, Any], exclusive: _ExclusiveGroup | None
    ) -> _Declaration:
        declaration = _Declaration(tuple(flags), dict(options), exclusive)
        if options.get("action") == "version":
            self.version = str(options["version"])
        else:
            self.declarations.append(declaration)
        return declaration

    def add_argument(self, *flags: str, **options: Any) -> None:
        self._declare(flags, options, exclusive=None)

    def add_argument_group(self, title: str | None = None) -> CommandSpec:
        return self  # Click's help has one option list; the group's title is not shown

    def add_mutually_exclusive_group(self, required: bool = False) -> _ExclusiveGroup:
        return _ExclusiveGroup(self, required)

    def set_defaults(self, **values: Any) -> None:
        self.defaults.update(values)

    def add_subparsers(self, **_: Any) -> CommandSpec:
        return self  # `add_parser` on the result adds a subcommand to this spec

    def add_parser(
        self,
        name: str,
        *,
        parents: Sequence[CommandSpec] = (),
        help: str | None = None,
        description: str | None = None,
        add_help: bool = True,
    ) -> CommandSpec:
        sub = CommandSpec(
            f"{self.prog} {name}",
            help_text=description or help,
            parents=parents,
            passthrough=not add_help,
        )
        self.subcommands[name] = sub
        return sub

    def error(self, message: str) -> NoReturn:
        """A handler's usage error, as argparse's: one line naming this command, exit status 2."""
        print(_usage_line(self.prog, message), file=sys.stderr)
        raise SystemExit(2)

    # ---- building and parsing -----------------------------------------------------------

    def build(self, name: str | None = None) -> click.Command:
        params: list[click.Parameter] = []
        for index, declaration in enumerate(self.declarations):
            internal = f"p{index}"  # several flags may share one dest (--json, --wait/--no-wait)
            build = _click_argument if declaration.positional else _click_option
            params.append(build(internal, declaration))
        if self.version is not None:
            params.append(_version_option(self.version))
        attrs: dict[str, Any] = {
            "name": name or self.prog,
            "params": params,
            "help": self.help_text,
            "short_help": self.help_text,  # whole in `gantry --help`, as argparse listed it
            "callback": click.pass_context(self._collect),
            "context_settings": dict(_CONTEXT_SETTINGS),
        }
        if self.passthrough:
            attrs["add_help_option"] = False
            attrs["context_settings"].update(ignore_unknown_options=True, allow_extra_args=True)
        if not self.subcommands:
            return _Command(**attrs)
        return _SpecGroup(self.subcommands, invoke_without_command=True, **attrs)

    def _collect(self, ctx: click.Context, **values: Any) -> None:
        """Merge this level's values into the namespace (ctx.obj); later levels win."""
        _check_exclusive(ctx, self.declarations)
        level: dict[str, Any] = {**self.defaults, "_context": ctx}
        given: list[tuple[str, Any]] = []
        for index, declaration in enumerate(self.declarations):
            value = _value(declaration, values[f"p{index}"])
            if ctx.get_parameter_source(f"p{index}") in _GIVEN:
                given.append((declaration.dest, value))
            elif not declaration.suppressed:
                level.setdefault(declaration.dest, value)  # the first flag of a dest sets it
        level.update(given)
        ctx.find_root().obj.update(level)

    def parse_args(self, arguments: Sequence[str]) -> argparse.Namespace:
        """The namespace of a command line; usage errors and --help end in SystemExit."""
        namespace: dict[str, Any] = {}
        command = self.build()
        try:
            with command.make_context(self.prog, list(arguments), obj=namespace) as ctx:
                command.invoke(ctx)
        except click.exceptions.Exit as done:
            raise SystemExit(done.exit_code) from None
        except click.ClickException as exc:
            print_usage_error(exc)
            raise SystemExit(exc.exit_code) from None
        return argparse.Namespace(**namespace)


def _value(declaration: _Declaration, value: Any) -> Any:
    """Click's value as argparse gave it: lists for repeated flags and many positionals."""
    options = declaration.options
    if isinstance(value, tuple) and (
        options.get("action") in ("append", "extend") or options.get("nargs") in ("*", "+")
    ):
        if not value and options.get("action") in ("append", "extend"):
            return options.get("default")
        return list(value)
    return value


def _flag_names(declaration: _Declaration) -> str:
    return "/".join(declaration.flags)


def _check_exclusive(ctx: click.Context, declarations: Sequence[_Declaration]) -> None:
    groups: dict[int, list[tuple[_Declaration, bool]]] = {}
    for index, declaration in enumerate(declarations):
        if declaration.exclusive is not None:
            given = ctx.get_parameter_source(f"p{index}") in _GIVEN
            groups.setdefault(id(declaration.exclusive), []).append((declaration, given))
    for members in groups.values():
        chosen = [declaration for declaration, given in members if given]
        if len(chosen) > 1:
            raise click.UsageError(
                f"{_flag_names(chosen[1])} cannot be used with {_flag_names(chosen[0])}", ctx
            )
        if not chosen and members[0][0].exclusive is not None and members[0][0].exclusive.required:
            names = " ".join(declaration.flags[0] for declaration, _ in members)
            raise click.UsageError(f"one of the options {names} is required", ctx)


def _version_option(version: str) -> click.Option:
    def show(ctx: click.Context, _: click.Parameter, value: bool) -> None:
        if value and not ctx.resilient_parsing:
            click.echo(version)
            ctx.exit(0)

    return click.Option(
        ["--version"],
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=show,
        help="show the version and exit",
    )


def _format_arguments(ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """The positionals with help, above the options, as argparse listed them."""
    rows = [
        (param.make_metavar(ctx), param.help_text)
        for param in ctx.command.get_params(ctx)
        if isinstance(param, _Argument) and param.help_text
    ]
    if rows:
        with formatter.section("Arguments"):
            formatter.write_dl(rows)


class _Command(click.Command):
    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _format_arguments(ctx, formatter)
        super().format_options(ctx, formatter)


class _SpecGroup(click.Group):
    """Subcommands built from their specs when named (only the one run is built), listed in the
    order they were declared rather than sorted."""

    def __init__(self, specs: dict[str, CommandSpec], **attrs: Any) -> None:
        super().__init__(**attrs)
        self._specs = specs

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self._specs)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self._specs:
            self.add_command(self._specs[cmd_name].build(cmd_name), cmd_name)
        return self.commands.get(cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand:  # suggest among every name, built or not
            raise click.exceptions.NoSuchCommand(
                args[0], possibilities=list(self._specs), ctx=ctx
            ) from None

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _format_arguments(ctx, formatter)
        super().format_options(ctx, formatter)


def print_usage_error(exc: click.ClickException) -> None:
    """`gantry CMD: error: MESSAGE (see gantry CMD --help)`: one line on stderr."""
    ctx = getattr(exc, "ctx", None)
    print(
        _usage_line(ctx.command_path if ctx is not None else "gantry", exc.format_message()),
        file=sys.stderr,
    )


def _usage_line(path: str, message: str) -> str:
    return f"{path}: error: {' '.join(message.split())} (see {path} --help)"
