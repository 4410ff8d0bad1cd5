"""The `ember train` configuration, loaded from YAML (the sections: `_schema`) with errors that say where and what."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from ember.cli._schema import WATCHER_NAME, Config, Rule
from ember.errors import ConfigError


def suggest(given: str, allowed: list[str]) -> str | None:
    """The allowed name a typo most likely meant: one it abbreviates, else the closest spelling."""
    starts = [a for a in allowed if a.startswith(given) and given]
    if len(starts) == 1:
        return starts[0]
    close = difflib.get_close_matches(given, allowed, n=1, cutoff=0.6)
    return close[0] if close else None


def _type_name(t: Any) -> str:
    if get_origin(t) is Annotated:
        return _type_name(get_args(t)[0])
    if get_origin(t) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(t))
    if get_origin(t) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(t))
    if get_origin(t) is list:
        return f"a list of {_type_name(get_args(t)[0])}"
    if get_origin(t) is dict:
        return "a mapping"
    if dataclasses.is_dataclass(t):
        return "a mapping"
    return {type(None): "null", bool: "true/false", int: "an int", float: "a number", str: "a string"}.get(t, str(t))


def _convert(value: Any, t: Any, path: str) -> Any:
    origin = get_origin(t)
    if origin is Annotated:  # a field's rule, written beside it in the schema
        kind, *rules = get_args(t)
        value = _convert(value, kind, path)
        for rule in rules:
            if isinstance(rule, Rule) and not rule.holds(value):
                raise ConfigError(f"{path}: expected {rule.expected}, got {value!r}.")
        return value
    if origin in (Union, types.UnionType):
        options = get_args(t)
        if value is None and type(None) in options:
            return None
        real = [o for o in options if o is not type(None)]
        if len(real) == 1:  # Optional[X]: X's own, more precise, error
            return _convert(value, real[0], path)
        for option in real:
            try:
                return _convert(value, option, path)
            except ConfigError:
                pass
        raise ConfigError(f"{path}: expected {_type_name(t)}, got {value!r}.")
    if origin is Literal:
        if value not in get_args(t):
            close = suggest(str(value), [str(a) for a in get_args(t)])
            hint = f"; did you mean {close!r}?" if close else "."
            raise ConfigError(f"{path}: expected {_type_name(t)}, got {value!r}{hint}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected {_type_name(t)}, got {value!r}.")
        return [_convert(v, get_args(t)[0], f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}.")
        kind = get_args(t)[1] if get_args(t) else Any
        if not dataclasses.is_dataclass(kind):
            return dict(value)
        return {k: _build(kind, v, f"{path}.{k}") for k, v in value.items()}  # type: ignore[arg-type]
    if dataclasses.is_dataclass(t):
        return _build(t, value, path)  # type: ignore[arg-type]  # is_dataclass narrowed t to a dataclass type
    if t in (int, float) and isinstance(value, str):
        value = _number(value, t)  # PyYAML reads 1e-3 (no dot) as a string
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(t, False)
    if not ok:
        raise ConfigError(f"{path}: expected {_type_name(t)}, got {value!r} ({type(value).__name__}).")
    return float(value) if t is float else value


def _number(text: str, t: type) -> Any:
    """``text`` as a finite number of type ``t`` when it spells one (``"1e-3"``, ``"64"``), else unchanged."""
    try:
        number = float(text) if t is float else int(text.strip())
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def _build(cls: type[Any], raw: Any, path: str) -> Any:
    """``cls`` from the mapping ``raw``; every problem in it (and in nested sections) raised at once."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {raw!r}.")
    hints = typing.get_type_hints(cls, include_extras=True)  # with each field's rule
    fields = {f.name for f in dataclasses.fields(cls)}
    problems: list[str] = []
    values = {}
    for key, value in raw.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            close = suggest(str(key), sorted(fields))
            hint = f"; did you mean {close!r}?" if close else ""
            problems.append(f"{where}: unknown field{hint} (allowed: {', '.join(sorted(fields))})")
            continue
        try:
            values[key] = _convert(value, hints[key], where)
        except ConfigError as e:
            problems.extend(getattr(e, "problems", None) or [str(e)])
    if problems:
        raise config_error(problems)
    return cls(**values)


def config_error(problems: list[str]) -> ConfigError:
    """One error for all the problems found: the message itself for one, a list for several."""
    message = (
        problems[0]
        if len(problems) == 1
        else f"{len(problems)} problems in the config:\n" + "\n".join(f"  {problem}" for problem in problems)
    )
    error = ConfigError(message)
    error.problems = problems  # type: ignore[attr-defined]  # a ConfigError carries the list of problems for the caller
    return error


def _apply_overrides(raw: Any, overrides: Sequence[str]) -> dict[str, Any]:
    """``raw`` with each ``dotted.key=value`` set in it, the value read as YAML reads it (``3``, ``1e-3``, ``null``)."""
    import yaml

    raw = copy.deepcopy(raw) if isinstance(raw, dict) else {} if raw is None else raw
    if not isinstance(raw, dict):
        return raw  # _build names it
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: expected dotted.key=value, such as trainer.max_epochs=3.")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({e}).") from None
        *parents, last = key.split(".")
        section = raw
        for i, part in enumerate(parents):
            child = section.setdefault(part, {})
            if child is None:  # a section set to null (early_stopping: null): the override brings it back
                child = section[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parents[: i + 1])} is {child!r}, not a section.")
            section = child
        section[last] = value
    return raw


def load_config(source: str | os.PathLike[str] | dict[str, Any] | None = None, overrides: Sequence[str] = ()) -> Config:
    """A [`Config`][ember.cli.Config] from a YAML file, a mapping, or nothing (the embedded default run).

    ``overrides`` are ``dotted.key=value`` strings, as ``ember train CONFIG trainer.max_epochs=3`` takes
    them; each value is read as YAML reads it, then checked with the rest. Unknown fields, wrong types and
    values outside a field's choices fail here, all at once, each with the field's dotted path, what was
    given, what is allowed and, for a typo, the closest allowed name.

    Examples:
        >>> from ember.cli import load_config
        >>> load_config({"optimizer": {"name": "sgd", "learning_rate": 0.1}}).optimizer.name
        'sgd'
        >>> load_config(None, ["trainer.max_epochs=3", "optimizer.learning_rate=1e-3"]).trainer.max_epochs
        3
    """
    if isinstance(overrides, str):
        raise TypeError(f"`overrides` must be a sequence of 'dotted.key=value' strings, got {overrides!r}.")
    raw: Any = {} if source is None else source
    if source is not None and not isinstance(source, dict):
        import yaml

        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"No config file at {path}.")
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({e}).") from None
        if raw is None:  # an empty file (or only comments): not the embedded run a user did not ask for
            raise ConfigError(
                f"{path} is empty. Write the fields to change (see `ember train --help` and the CLI page), or leave "
                "the file out to train the built-in example."
            )
    config: Config = _build(Config, _apply_overrides(raw, overrides), "")
    _check_across_fields(config)
    return config


def _check_across_fields(config: Config) -> None:
    """What one field alone cannot say: the evaluations' names and schedules, the one ``best_on`` names, a source."""
    problems = []
    if config.init is not None and not config.init.source:
        problems.append("init.source: expected the run, checkpoint or weights file to start from; none was given.")
    for name, evaluation in config.evaluations.items():
        if not isinstance(name, str) or not name or "/" in name or name == "val":
            problems.append(f"evaluations.{name}: expected a name without '/', other than 'val', got {name!r}.")
        periods = (evaluation.every_epochs, evaluation.every_iters, evaluation.every_secs)
        if all(period is None for period in periods) and not evaluation.at_iters:
            problems.append(
                f"evaluations.{name}: give every_epochs, every_iters, every_secs or at_iters (or several); none is set."
            )
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 1 for i in evaluation.at_iters):
            problems.append(f"evaluations.{name}.at_iters: expected positive ints, got {evaluation.at_iters!r}.")
    allowed = ", ".join(["val", *map(str, config.evaluations)])
    named = {"checkpoint.best_on": config.handlers.checkpoint.best_on}
    if config.handlers.early_stopping is not None:
        named["early_stopping.on"] = config.handlers.early_stopping.on
    for field, name in named.items():
        if name != "val" and name not in config.evaluations:
            problems.append(f"handlers.{field}: expected an evaluation of the run ({allowed}), got {name!r}.")
    for name in config.handlers.checkpoint.keep_for_watchers:
        if not isinstance(name, str) or not re.fullmatch(WATCHER_NAME, name):
            problems.append(
                "handlers.checkpoint.keep_for_watchers: expected watcher names of letters, digits, '_', '.' and '-', "
                f"got {name!r}."
            )
    if problems:
        raise config_error(problems)


def dump_config(config: Config, source: str | os.PathLike[str] | None = None) -> str:
    """``config`` as YAML text that [`load_config`][ember.cli.load_config] reads back to an equal config.

    ``source`` is the folder of the config file the run started from: a comment records it, so that a
    relaunch from the run folder (``ember resume RUN_DIR``) still finds a model module that sits beside
    the original config (`ember resume` reads it back).

    Examples:
        >>> from ember.cli import Config, dump_config, load_config
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "config.yaml"
        >>> _ = path.write_text(dump_config(Config()))
        >>> load_config(path) == Config()
        True
    """
    import yaml

    header = f"{_SOURCE}{Path(source).resolve()}\n" if source is not None else ""
    text: str = header + yaml.safe_dump(dataclasses.asdict(config), sort_keys=False)
    return text


_SOURCE = "# ember: model modules are also looked for in "


def config_source(config_file: str | os.PathLike[str]) -> Path:
    """The folder a run's model module may sit in: the one its config file recorded, or the file's own.

    Examples:
        >>> import tempfile, pathlib
        >>> from ember.cli import Config, dump_config
        >>> from ember.cli._config import config_source
        >>> run, origin = pathlib.Path(tempfile.mkdtemp()), pathlib.Path(tempfile.mkdtemp())
        >>> _ = (run / "config.yaml").write_text(dump_config(Config(), source=origin))
        >>> config_source(run / "config.yaml") == origin.resolve()
        True
    """
    path = Path(config_file).resolve()
    with open(path, encoding="utf-8") as text:
        first = text.readline()
    return Path(first[len(_SOURCE) :].strip()) if first.startswith(_SOURCE) else path.parent


def importable(folder: str | os.PathLike[str]) -> None:
    """Put ``folder`` first on ``sys.path`` (once): a model named ``mymodels:Net`` may sit beside the config.

    Examples:
        >>> import sys, tempfile
        >>> from ember.cli._config import importable
        >>> folder = tempfile.mkdtemp(); importable(folder); sys.path[0] == folder
        True
    """
    import sys

    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")  # trainer.max_epochs: a key, not a file name


def config_from(items: Sequence[str], command: str) -> Config:
    """The config a command line of ``ember COMMAND`` names: at most one file, then ``KEY=VALUE`` overrides.

    Examples:
        >>> from ember.cli._config import config_from
        >>> config_from(["trainer.max_epochs=3"], "train").trainer.max_epochs
        3
    """
    files = [item for item in items if "=" not in item]
    for item in files:
        if not Path(item).exists() and _DOTTED.fullmatch(item):
            raise ConfigError(
                f"{item!r} is not a config file; an override takes a value: {item}=VALUE (such as "
                "trainer.max_epochs=3)."
            )
    if len(files) > 1:
        raise ValueError(f"ember {command} takes one config file, got {files}; overrides are KEY=VALUE.")
    source = source_of(files)
    if source is not None:  # a model given as "mymodels:Net" may sit beside the config file
        importable(source)
    return load_config(files[0] if files else None, [item for item in items if "=" in item])


def source_of(items: Sequence[str]) -> Path | None:
    """The folder of the config file on a command line (the one it recorded, for a run folder's config).

    Examples:
        >>> from ember.cli._config import source_of
        >>> print(source_of(["trainer.max_epochs=3"]))
        None
    """
    files = [item for item in items if "=" not in item and Path(item).is_file()]
    return config_source(files[0]) if files else None
