"""Errors about one argument, with the parts of their message as data (private).

A library error about one argument is an :class:`InputError` (a ValueError): ``str(err)`` is the
STYLE.md message for Python callers, ``"<function>(): '<arg>' must be …"``, and the error also
carries the argument, the function and the text after ``"<function>(): "``, so a front end (the
command line) names the argument its own way (its option) without parsing the message. A
caller that knows which of its own parameters fed an inner call's renames the argument with
:func:`passed_as`. Must not import anything from hyperreg, nor torch (the geometry layer and
``hyperreg --help`` use it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = [
    "InputError",
    "MissingInputError",
    "failure_text",
    "named_by",
    "passed_as",
    "quoted",
]

# how failure_text names arguments; None: quoted, as the library does
_NAMES: ContextVar[Callable[[str], str | None] | None] = ContextVar("_NAMES", default=None)


def quoted(argument: str) -> str:
    """How a Python message names an argument: ``'moving'``."""
    return f"'{argument}'"


class InputError(ValueError):
    """A ValueError about one argument, with the parts of its message as data.

    ``str(err)`` is the STYLE.md message for Python callers, ``"<function>(): <detail>"``, every
    argument in it quoted (``'moving'``). A front end that names arguments its own way (the
    command line's options) calls :meth:`describe` with its own naming; arguments it does not
    know stay quoted.

    Args:
        fn: The public function whose argument was wrong (``""``: no prefix).
        template: The message after ``"<function>(): "``, a :meth:`str.format` template: ``{0}``
            is ``argument``, ``{1}``, ``{2}`` … the arguments of ``others``; the named fields
            are filled from ``values`` (paths, shapes: never substituted into the template
            before formatting, so braces in them are safe).
        argument: The parameter that fed the wrong value (the caller's name for it).
        *others: Further parameters the message names.
        **values: The values of the template's named fields.

    Attributes:
        fn, template, argument, others, values: As given; :func:`passed_as` renames
            ``argument`` and ``others`` (never the message).
        detail: The message without ``"<function>(): "``, arguments quoted.
    """

    def __init__(
        self, fn: str, template: str, argument: str, *others: str, **values: object
    ) -> None:
        self.fn = fn
        self.template = template
        self.argument = argument
        self.others = others
        self.values = values
        self.detail = self.describe(quoted)
        super().__init__(f"{fn}(): {self.detail}" if fn else self.detail)

    def describe(self, name: Callable[[str], str | None]) -> str:
        """The detail with every argument named by ``name`` (quoted where it gives None)."""
        names = [name(a) or quoted(a) for a in (self.argument, *self.others)]
        return self.template.format(*names, **self.values)

    def __reduce__(self) -> tuple[object, ...]:  # picklable (batch workers, torchrun)
        state = (self.fn, self.template, self.argument, self.others, self.values)
        return (_rebuild, (type(self), *state))


class MissingInputError(InputError, FileNotFoundError):
    """An :class:`InputError` that is also a FileNotFoundError: a missing input path."""


def _rebuild(
    cls: type[InputError],
    fn: str,
    template: str,
    argument: str,
    others: tuple[str, ...],
    values: dict[str, object],
) -> InputError:
    return cls(fn, template, argument, *others, **values)


@contextmanager
def passed_as(**names: str) -> Iterator[None]:
    """Rename the ``argument`` of an :class:`InputError` raised inside: the caller knows which
    of its own parameters fed the inner call's (``passed_as(path="moving")``). The message is
    left as it is; only the argument a front end names changes."""
    try:
        yield
    except InputError as err:
        err.argument = names.get(err.argument, err.argument)
        err.others = tuple(names.get(a, a) for a in err.others)
        raise


@contextmanager
def named_by(name: Callable[[str], str | None]) -> Iterator[None]:
    """Inside, :func:`failure_text` names an :class:`InputError`'s arguments by ``name`` (a
    front end's own: the command line passes its options, ``{"replace_nonfinite":
    "--replace-nonfinite"}.get``), so what a batch stores for a failed item speaks its user's
    language; an argument ``name`` gives None for stays quoted."""
    token = _NAMES.set(name)
    try:
        yield
    finally:
        _NAMES.reset(token)


def failure_text(err: BaseException) -> str:
    """One line for a failed item of a batch (a pair, a CSV row): the library's own words (an
    :class:`InputError`'s ``detail``, without the function name, its arguments named as
    :func:`named_by` says where it is in force); the exception type only when the message is
    empty, or for an unexpected error (not a ValueError, TypeError or OSError)."""
    name = _NAMES.get()
    detail = err.describe(name) if name and isinstance(err, InputError) else None
    text = " ".join(str(detail or getattr(err, "detail", err)).split())
    if isinstance(err, (ValueError, TypeError, OSError)) and text:
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
