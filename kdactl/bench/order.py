"""The counterbalanced (ABBA) schedule in which candidates are timed.

One round runs every candidate in order and then in reverse (A B C C B A), so that a drift in the
machine's speed over a round hits every candidate equally, and no candidate always follows the same
neighbour. Each appearance in the schedule is one block of ``block_size`` timed iterations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MAX_ROUNDS = 4


@dataclass(frozen=True)
class Plan:
    rounds: int  # ABBA rounds; each candidate appears twice per round
    block_size: int  # timed iterations per appearance

    @property
    def iterations(self) -> int:
        """Timed iterations per candidate (at least what was asked for)."""
        return 2 * self.rounds * self.block_size

    def to_json(self) -> dict:
        return {"rounds": self.rounds, "block_size": self.block_size, "iterations_per_candidate": self.iterations}


def plan(iters: int) -> Plan:
    """Split ``iters`` timed iterations per candidate into ABBA rounds of equal blocks."""
    if iters < 2:
        raise ValueError(f"iters must be at least 2 (one ABBA round), got {iters}")
    rounds = min(MAX_ROUNDS, iters // 2)
    return Plan(rounds, math.ceil(iters / (2 * rounds)))


def abba(names: Sequence[str], rounds: int) -> list[str]:
    """Forward then reverse, ``rounds`` times: [A, B, B, A] for two names and one round."""
    names = list(names)
    return [n for _ in range(rounds) for n in (*names, *reversed(names))]
