"""Command-line options derived from a config dataclass: one ``--kebab-case`` option per field, typed from its
annotation, with the field's trailing ``# comment`` as help. Shared by ``minirl train`` and ``minirl lm``."""

import argparse
import dataclasses
import inspect
import io
import tokenize
import types
import typing

ALIASES = {"env_id": ["--env"], "total_steps": ["--steps"]}


def field_comments(cls: type) -> dict[str, str]:
    """The trailing ``# comment`` of each field line in the dataclass source.

    Read with the ``tokenize`` module rather than a regular expression, so a ``#`` inside a default string
    (``sep: str = "#"  # separator``) is part of the string, not the start of the comment.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    comments, first = {}, {}  # field -> comment; line number -> first name token on that line
    for tok in tokenize.generate_tokens(io.StringIO(inspect.getsource(cls)).readline):
        line = tok.start[0]
        if tok.type == tokenize.NAME and line not in first:
            first[line] = tok.string
        elif tok.type == tokenize.COMMENT and first.get(line) in names:
            comments[first[line]] = tok.string.lstrip("#").strip()
    return comments


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one option per field of ``cls``; ``X | None`` fields accept the word ``none``; tuples take several values."""
    hints = typing.get_type_hints(cls)
    helps = field_comments(cls)
    for f in dataclasses.fields(cls):
        flags = [f"--{f.name.replace('_', '-')}", *ALIASES.get(f.name, [])]
        kind, optional = hints[f.name], False
        if isinstance(kind, types.UnionType) and type(None) in kind.__args__:
            (kind,) = [a for a in kind.__args__ if a is not type(None)]
            optional = True
        text = f"{helps.get(f.name, '')} (default: {f.default})".strip()
        if kind is bool:
            parser.add_argument(
                *flags, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default, help=text
            )
        elif typing.get_origin(kind) is tuple:
            parser.add_argument(*flags, dest=f.name, type=int, nargs="+", default=f.default, help=text)
        else:
            convert = _none_or(kind) if optional else kind
            parser.add_argument(*flags, dest=f.name, type=convert, default=f.default, help=text)


def config_from(args: argparse.Namespace, cls: type):
    """The dataclass ``cls`` filled from parsed ``args``."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def _none_or(kind: type):
    def convert(text: str):
        return None if text.lower() == "none" else kind(text)

    convert.__name__ = kind.__name__
    return convert
