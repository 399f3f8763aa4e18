"""NudgePort in memory: remembers each nudge (fleet time, hint); ``fail`` makes every send raise."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.kernel.errors import StewardError


@dataclass
class RecordingNudger:
    """Each nudge as (fleet time, hint); a set ``fail`` is raised by every send instead."""

    sent: list[tuple[float, str]] = field(default_factory=list)
    fail: StewardError | None = None

    def nudge_at(self, when: float, *, hint: str) -> None:
        if self.fail is not None:
            raise self.fail
        self.sent.append((when, hint))
