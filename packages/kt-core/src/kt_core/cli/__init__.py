"""The `kt` command.

kt-core owns the script and three commands that need nothing but the runtime: `kt version`,
`kt doctor`, `kt backends` (plain text, no third-party imports, so they also work in a
minimal deployment). Every other command (`kt run`, `kt convert`, `kt bench`, ...) belongs to
the application package `kt`, found through the entry point group `kt.cli`: kt-core never
imports it, and without it those commands say what to install.

An application entry point names a module with COMMANDS ({name: one-line help}) and
main(argv) -> exit code.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "kt.cli"
CORE_COMMANDS = {
    "version": "versions of kt-core, its plugin ABI, Python, torch and the installed backends",
    "doctor": "what this host offers kt, and the settings kt recommends for it",
    "backends": "every discovered backend and variant, its score, and why it won or lost",
}


def _application():
    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    return found[0].load() if found else None


def _usage(app) -> str:
    lines = ["usage: kt COMMAND [OPTIONS]   (kt COMMAND --help for a command's options)", "",
             "kt: run the routed experts of Mixture-of-Experts models on the CPU.", "", "commands:"]
    commands = {**CORE_COMMANDS, **(app.COMMANDS if app else {})}
    width = max(map(len, commands))
    lines += [f"  {name:<{width}}  {text}" for name, text in commands.items()]
    if app is None:
        lines += ["", "The application's commands (run, chat, convert, bench, demo, config) come with the kt package: "
                  "pip install kt"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    app = _application()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage(app))
        return 0 if argv else 2
    command = argv[0]
    if command in CORE_COMMANDS:
        from .core_commands import run

        return run(command, argv[1:])
    if app is not None and command in app.COMMANDS:
        return app.main(argv)
    print(f"kt: no command {command!r}. " + ("" if app else "kt-core alone has version, doctor and backends; the "
          "other commands come with the kt application: pip install kt. ") + "kt --help lists the commands.",
          file=sys.stderr)
    return 2
