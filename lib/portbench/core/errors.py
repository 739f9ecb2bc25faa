"""Error types. Every error names what was wrong and what was expected."""

from __future__ import annotations


def _rebuild(cls, args, state):
    """Unpickle a project error without calling its ``__init__`` (whose signature differs from ``args``)."""
    err = Exception.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class PortbenchError(Exception):
    """Base class of every error portbench raises on purpose.

    Every subclass pickles and unpickles with its message and fields (a worker's error reaches the
    terminal as the same message as in one process), whatever its ``__init__`` takes."""

    def __reduce__(self):
        return _rebuild, (type(self), self.args, dict(self.__dict__))


class ParameterError(PortbenchError, ValueError):
    """A parameter has an unknown name or an invalid value."""

    def __init__(self, param: str, value, expected: str):
        self.param, self.value, self.expected = param, value, expected
        super().__init__(f"parameter {param!r} = {value!r}: expected {expected}")


class DataError(PortbenchError, ValueError):
    """A data file is missing, malformed or fails its checksum.

    ``row`` is the 1-based data row (the header is row 0; for JSONL, the line number).
    """

    def __init__(self, file, problem: str, *, row: int | None = None, column: str | None = None):
        self.file, self.problem, self.row, self.column = str(file), problem, row, column
        where = self.file
        if row is not None:
            where += f", row {row}"
        if column is not None:
            where += f", column {column!r}"
        super().__init__(f"{where}: {problem}")


class SchedulerError(PortbenchError):
    """A scheduling policy broke the scheduler contract (see :mod:`portbench.sim.schedulers`).

    Names the policy, the hook that was called, the request concerned, what happened and the rule.
    (``args`` are the five fields, so the error survives re-raising by SimPy and pickling by workers.)
    """

    def __init__(self, policy: str, hook: str, request, problem: str, rule: str):
        super().__init__(policy, hook, request, problem, rule)
        self.policy, self.hook, self.request, self.problem, self.rule = policy, hook, request, problem, rule

    def __str__(self) -> str:
        who = "" if self.request is None else f", request {self.request}"
        return f"scheduler {self.policy!r}, hook {self.hook}{who}: {self.problem}; rule: {self.rule}"


class UnknownSchedulerError(ParameterError):
    """A parameter names a scheduler that is not registered (its plug-in was not loaded)."""

    def __init__(self, param: str, name, registered):
        registered = tuple(registered)
        ParameterError.__init__(self, param, name, "a registered scheduler: one of " + ", ".join(registered))
        self.args = (param, name, registered)
        self.registered = registered

    def __str__(self) -> str:
        return (f"scheduler {self.value!r} is not registered; load its plug-in with --plugin FILE or `plugins:` "
                f"(parameter {self.param}; registered: {', '.join(self.registered)})")


class IntegrityError(PortbenchError):
    """A frozen window or the manifest does not match its recorded hash."""


class ProtectedFileError(PortbenchError):
    """A study of the user's own tried to write a file of the default study that git tracks (its committed
    manifest, hybrids, figures or the README): refused before anything is written (:mod:`portbench.core.outputs`)."""


class PluginTimeoutError(PortbenchError):
    """A scheduler ran past its per-run time limit on a window (a plug-in that hangs): names it, the window, the
    region and the limit."""


class ConservationError(PortbenchError, AssertionError):
    """A simulation lost or invented requests (arrived != completed + unfinished + rejected)."""


def check_choice(param: str, value, allowed) -> None:
    """Raise ParameterError unless ``value`` is one of ``allowed`` (listed in the message)."""
    allowed = list(allowed)
    if value not in allowed:
        raise ParameterError(param, value, "one of " + ", ".join(map(str, allowed)))


YAML_BOOL_WORDS = {False: ("off", "false", "no"), True: ("on", "true", "yes")}


def choice(param: str, value, allowed):
    """``value`` checked against ``allowed`` (as :func:`check_choice`), where a YAML boolean stands for the
    matching word of an on/off choice: YAML reads an unquoted ``off`` / ``no`` / ``false`` as False (and ``on`` /
    ``yes`` / ``true`` as True), so ``--set engine.prefix_caching=off`` means ``off``. Returns the word."""
    allowed = list(allowed)
    if isinstance(value, bool):
        value = next((w for w in YAML_BOOL_WORDS[value] if w in allowed), value)
    check_choice(param, value, allowed)
    return value


def check_choices(param: str, values, allowed) -> list:
    """Like check_choice for a list; ``"all"`` expands to every allowed value."""
    allowed = list(allowed)
    if values == "all" or values is None:
        return allowed
    if isinstance(values, str):
        values = [values]
    values = list(values)
    if not values:
        raise ParameterError(param, values, "all or a non-empty list: one or more of " + ", ".join(map(str, allowed)))
    dup = sorted({str(v) for v in values if values.count(v) > 1})
    if dup:
        raise ParameterError(param, values, f"a list of distinct names ({', '.join(dup)} given twice)")
    for i, v in enumerate(values):
        check_choice(f"{param}[{i}]", v, allowed)
    return list(values)
