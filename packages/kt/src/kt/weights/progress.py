"""The per-layer progress bar of `kt convert` and its packing step."""

from __future__ import annotations


def layer_progress(what: str, total: int, done: int):
    """A started rich progress bar counting layers, and its task: (bar, task)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task):
            return Text(f"{task.speed:.2f} layers/s" if task.speed else "- layers/s")

    bar = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TextColumn("layers"), Rate(),
                   TimeRemainingColumn())
    task = bar.add_task("convert", total=total, completed=done)
    bar.start()
    return bar, task
