"""Where a pipeline's stages live: global stage ``s`` on pipeline rank ``r`` as its model
chunk ``c``, and back.

``p`` pipeline ranks hold ``v`` model chunks each, ``p·v`` global stages in model order.
Two styles, as ``torch.distributed.pipelining._utils.generate_stage_to_rank_mapping``
names them:

* ``loop`` (GPipe, 1F1B, interleaved 1F1B, ZB-H1/H2, custom orders): stage ``s`` on
  rank ``s % p`` as chunk ``s // p``; the model loops over the ranks ``v`` times.
* ``v`` (ZB-V, DualPipeV): the chunks zig-zag. Chunk ``c`` covers stages ``c·p …
  c·p + p − 1`` on ranks ``0 … p − 1`` when ``c`` is even and on ``p − 1 … 0`` when odd,
  so the stages either side of a turn share a rank and hand over without a send, and
  with two chunks the first and the last stage (the embedding and the loss) are both
  on rank 0.

Every module that needs a stage's rank or a rank's stages asks a :class:`Placement`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from simulator.common.vocabulary import PLACEMENT_STYLES, V_SHAPED_SCHEDULES

__all__ = ["Placement", "placement_style"]


def placement_style(schedule: str) -> str:
    """The placement a schedule runs on: ``v`` for the V-shaped schedules, else ``loop``."""
    return "v" if schedule in V_SHAPED_SCHEDULES else "loop"


@dataclass(frozen=True)
class Placement:
    """``ranks`` pipeline ranks of ``chunks`` model chunks each, placed in ``style``."""

    ranks: int
    chunks: int = 1
    style: str = "loop"

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.chunks < 1:
            raise ValueError(
                f"placement needs ranks and chunks ≥ 1, not {self.ranks}, {self.chunks}"
            )
        if self.style not in PLACEMENT_STYLES:
            raise ValueError(f"placement style {self.style!r} is not one of {PLACEMENT_STYLES}")

    @property
    def stages(self) -> int:
        """Global stages, ``ranks × chunks``."""
        return self.ranks * self.chunks

    def chunk_of(self, stage: int) -> int:
        """The model chunk global ``stage`` is on its rank."""
        return stage // self.ranks

    def rank_of(self, stage: int) -> int:
        """The pipeline rank that holds global ``stage``."""
        position = stage % self.ranks
        if self.style == "v" and self.chunk_of(stage) % 2:
            return self.ranks - 1 - position
        return position

    def stage_of(self, rank: int, chunk: int) -> int:
        """The global stage that is model chunk ``chunk`` of pipeline ``rank``."""
        position = self.ranks - 1 - rank if self.style == "v" and chunk % 2 else rank
        return chunk * self.ranks + position

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The global stages ``rank`` holds, in chunk order."""
        return self._stages_of[rank]

    @cached_property
    def _stages_of(self) -> tuple[tuple[int, ...], ...]:
        return tuple(
            tuple(self.stage_of(rank, chunk) for chunk in range(self.chunks))
            for rank in range(self.ranks)
        )

    def same_rank(self, stage: int, other: int) -> bool:
        """Whether two global stages live on one rank (their hand-over needs no send)."""
        return self.rank_of(stage) == self.rank_of(other)
