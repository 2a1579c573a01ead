"""What every optimization pass reports: whether it ran and what it changed."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PassReport:
    """One line of the build report per pass (and per target for kernel passes)."""

    name: str
    status: str                    # "applied" | "disabled" | "not implemented"
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"pass": self.name, "status": self.status, "summary": self.summary,
                "seconds": round(self.seconds, 3), **({"details": self.details} if self.details else {})}
