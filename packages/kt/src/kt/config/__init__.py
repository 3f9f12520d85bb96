"""User-level defaults for kt's commands, in YAML (`~/.config/kt/config.yaml`, or $KT_CONFIG):

    run:
      kt_method: INT4
      port: 8080
    bench:
      threads: [1, 2]

A key is COMMAND.OPTION, OPTION the command's flag without its dashes (`--kt-method` ->
kt_method). `kt run`, `kt bench` and `kt convert` read these as their defaults (a flag on the
command line wins); `kt config get/set/unset/list/path` edit them, checking each key and value
against the command's own option. Bad YAML is a one-line error naming the file and the line.
"""

from __future__ import annotations

import os
from pathlib import Path

from kt_core.errors import KTError

COMMANDS = ("run", "bench", "convert")


def config_path() -> Path:
    explicit = os.environ.get("KT_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "kt" / "config.yaml"


def load(path: Path | None = None) -> dict[str, dict]:
    """{command: {option: value}}; {} when the file does not exist."""
    import yaml

    path = path or config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise KTError(f"cannot read the kt config {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise KTError(f"the kt config {path}{where} is not valid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise KTError(f"the kt config {path} should map commands ({', '.join(COMMANDS)}) to their options, found "
                      f"{type(data).__name__ if not isinstance(data, dict) else 'a command that is not a mapping'}")
    unknown = sorted(set(data) - set(COMMANDS))
    if unknown:
        raise KTError(f"the kt config {path} has settings for {', '.join(unknown)}; only {', '.join(COMMANDS)} read one")
    return data


def save(data: dict[str, dict], path: Path | None = None) -> Path:
    """Written whole to a temporary file, then renamed over the old one: never half-written."""
    import yaml

    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(yaml.safe_dump({k: v for k, v in data.items() if v}, sort_keys=True))
    os.replace(tmp, path)
    return path


def split_key(key: str) -> tuple[str, str]:
    command, _, option = key.partition(".")
    if command not in COMMANDS or not option:
        raise KTError(f"config keys are COMMAND.OPTION with COMMAND one of {', '.join(COMMANDS)} (e.g. run.kt_method); "
                      f"got {key!r}")
    return command, option.replace("-", "_")
