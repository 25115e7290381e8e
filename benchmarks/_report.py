"""Writing a benchmark's section into docs/benchmarks.md, replacing the old one."""

from __future__ import annotations

import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

__all__ = ["machine_line", "write_section"]


def machine_line(packages: tuple[str, ...] = ("msgspec",)) -> str:
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in packages)
    cpu = platform.processor() or platform.machine()
    return (f"{os.cpu_count()} cores ({cpu}), Python {sys.version.split()[0]}, {platform.system()} "
            f"{platform.release()}; {versions}")


def write_section(path: Path, heading: str, body: str) -> None:
    """Replace the section `## {heading}` (up to the next `## `) or append it."""
    intro = "# Benchmarks\n\nFigures measured on this project's machine; each section names its command.\n"
    text = path.read_text() if path.exists() else intro
    section = f"## {heading}\n\n{body.rstrip()}\n"
    pattern = re.compile(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    path.write_text(text)
