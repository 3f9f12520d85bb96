"""The `kt` command line (Typer + Rich)."""

from .app import app, main

__all__ = ["app", "main"]
