"""A Dockerfile read into stages of instructions (comments dropped, continuations joined), so
that tests check what the builder runs rather than what a comment says."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Stage", "dockerfile_stages"]


@dataclass(frozen=True)
class Stage:
    """One ``FROM`` stage: its name and its instructions, continuation lines joined."""

    name: str
    instructions: tuple[tuple[str, str], ...]

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def dockerfile_stages(text: str) -> dict[str, Stage]:
    """The stages of a Dockerfile by name (``AS name``, else their index)."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: dict[str, Stage] = {}
    name, body = "", []
    for instruction in logical:
        keyword, _, rest = instruction.strip().partition(" ")
        if keyword.upper() == "FROM":
            if name:
                stages[name] = Stage(name, tuple(body))
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            body = []
        elif name:
            body.append((keyword.upper(), rest.strip()))
    stages[name] = Stage(name, tuple(body))
    return stages
