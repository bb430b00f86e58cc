"""Plan files and spec files: the settings of one command in a TOML (or YAML) file instead of a flag line.

* A **plan file** (``--plan FILE`` of `planner predict`, `explain` and `export`, ``plan=`` of the Python API's
  ``planner.predict`` / ``planner.explain``) holds one plan as top-level keys: the keys of a
  `planner predict --batch` line (:data:`planner.requests.REQUEST_KEYS`), checked by the batch parser's own
  per-key check (:func:`planner.requests.check_value`).
* A **spec file** (``--spec FILE`` of `planner search`, `compare` and `size`) holds that command's options as
  top-level keys named like its flags with underscores (``model``, ``gpu``, ``gpus``, ``space``, ``objective``,
  ``tokens_per_batch`` ...), each converted by the command's own click parameter type. A list stands for a
  comma-separated flag value (``tp = [1, 2, 4]`` is ``--tp 1,2,4``) or for a repeated flag (``gpu = ["a100-80gb",
  "h100-sxm"]``); ``price`` may be a table (``price = {gh200 = 2.1}``).

Flags given on the command line override the file (click's ``get_parameter_source``). A bad file is one line
naming the file, the key and what to write instead. TOML is read with :mod:`tomllib`; ``.yaml`` / ``.yml``
files need PyYAML.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from costmodel.core.errors import PlannerError
from planner.requests import REQUEST_KEYS, check_value

SUFFIXES = (".toml", ".yaml", ".yml")
_GIVEN = ("COMMANDLINE", "ENVIRONMENT")
"""Where a flag's value came from when the user gave it (click's ParameterSource names), not its default."""


def read_settings(path: str | Path, what: str) -> dict:
    """The top-level table of the TOML / YAML file ``path`` (``what``: 'plan file' or 'spec file', for errors)."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise PlannerError(f"{what} {path} must end in .toml, .yaml or .yml; rename it or pass a TOML file")
    if not path.is_file():
        raise PlannerError(f"{what} {path} not found; check the path (e.g. examples/llama13b_a100_tp2pp2.toml)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlannerError(f"cannot read {what} {path} ({type(exc).__name__}); pass a UTF-8 TOML file") from None
    data = _parse_toml(path, text, what) if path.suffix.lower() == ".toml" else _parse_yaml(path, text, what)
    if not isinstance(data, dict):
        raise PlannerError(f"{what} {path} must hold keys (key = value), not a {type(data).__name__}")
    return data


def _parse_toml(path: Path, text: str, what: str) -> Any:
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise PlannerError(f"{what} {path} is not valid TOML ({exc}); fix the syntax") from None


def _parse_yaml(path: Path, text: str, what: str) -> Any:
    try:
        import yaml  # deferred: only YAML plan and spec files need the YAML parser
    except ImportError:
        raise PlannerError(f"{what} {path} is YAML but PyYAML is not installed; pip install pyyaml, or write the "
                           "file as TOML") from None
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise PlannerError(f"{what} {path} is not valid YAML ({' '.join(str(exc).split())}); fix the syntax"
                           ) from None
    return {} if data is None else data


def plan_file_values(path: str | Path) -> dict:
    """The plan keys of plan file ``path``, each checked as a batch line's (unknown key, wrong type: one-line
    PlannerError naming the file and the key). An ``id`` key is dropped (it labels batch lines only)."""
    data = read_settings(path, "plan file")
    unknown = sorted(set(data) - set(REQUEST_KEYS))
    if unknown:
        raise PlannerError(f"plan file {path}: unknown key {unknown[0]!r}; allowed keys are the `predict --batch` "
                           f"keys: {', '.join(k for k in REQUEST_KEYS if k != 'id')}")
    out = {}
    for key, value in data.items():
        if key == "id":
            continue
        try:
            check_value(key, value)
        except PlannerError as exc:
            raise PlannerError(f"plan file {path}: {exc}") from None
        out[key] = value
    return out


def merge_plan_file(path: str | Path, plan: dict, given: set[str]) -> dict:
    """``plan`` (the command's plan flags by name) with the plan file's values where a flag was not ``given``."""
    file_values = plan_file_values(path)
    return {**plan, **{k: v for k, v in file_values.items() if k not in given}}


def given_flags(ctx: typer.Context | None, names) -> set[str]:
    """The parameters among ``names`` of the command running in ``ctx`` that were set on the command line (or
    from the environment), not left at their defaults; none without a context."""
    if ctx is None:
        return set()
    return {n for n in names if (src := ctx.get_parameter_source(n)) is not None and src.name in _GIVEN}


def spec_file_values(path: str | Path, ctx: typer.Context, exclude: tuple[str, ...] = ()) -> dict:
    """The options in spec file ``path`` for the command running in ``ctx``, converted by each option's own type
    (unknown key, wrong type: one-line PlannerError naming the file and the key)."""
    params = {_key(p): p for p in ctx.command.params if p.name not in exclude and p.param_type_name == "option"}
    data = read_settings(path, "spec file")
    out = {}
    for key, value in data.items():
        param = params.get(key)
        if param is None:
            raise PlannerError(f"spec file {path}: unknown key {key!r} for `planner {ctx.info_name}`; allowed keys "
                               f"(its flags with underscores): {', '.join(sorted(params))}")
        out[param.name] = _spec_value(path, ctx, param, value)
    return out


def _key(param: Any) -> str:
    """A spec-file key: the option's long flag without dashes, underscores between words (--format: format)."""
    long = [o for o in param.opts if o.startswith("--")]
    return long[0][2:].replace("-", "_") if long else param.name


def _spec_value(path: str | Path, ctx: typer.Context, param: Any, value: Any) -> Any:
    """``value`` of spec-file key ``param.name`` as the flag's own type reads it (typer's conversion)."""
    if param.name == "price" and isinstance(value, Mapping):
        value = [f"{k}={v}" for k, v in value.items()]
    if param.multiple:
        value = [value] if not isinstance(value, list) else value
    elif isinstance(value, Mapping):
        raise PlannerError(f"spec file {path}: {_key(param)} is a table; write one value or a list")
    elif isinstance(value, list):  # a choice list: the flag's comma-separated text
        value = ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in value)
    flag = "--" + _key(param).replace("_", "-")
    if isinstance(value, bool) and not param.is_flag:
        raise PlannerError(f"spec file {path}: {_key(param)} = {str(value).lower()} is a boolean; write the value "
                           f"{flag} takes")
    try:
        return param.process_value(ctx, value)
    except typer.BadParameter as exc:
        raise PlannerError(f"spec file {path}: {_key(param)} = {value!r}: {exc.message.rstrip('.')}; write it as "
                           f"{flag} takes it") from None


def merge_spec_file(path: str | Path, ctx: typer.Context, values: dict, exclude: tuple[str, ...] = ()) -> dict:
    """The command's ``values`` with the spec file's where a flag was not given on the command line."""
    file_values = spec_file_values(path, ctx, exclude)
    given = given_flags(ctx, values)
    return {**values, **{k: v for k, v in file_values.items() if k not in given}}
