"""The company a sample may keep in its pack.

Most conversations pack with anything: varlen attention keeps them apart. A few models hear
the rest of their call elsewhere: Phi-4-multimodal's audio encoder reads the padding of the
call's longest clip, and its audio projection is the vision-speech one whenever the call holds
image pixels (``tests/test_phi4_couplings.py``). Such a conversation (``APART``) is exact only
beside conversations without media (``PLAIN``), so those fill the rest of its pack::

    capacity 10    APART a=6    PLAIN p=3 q=2 r=4    ANY m=5 (an image)

    unit [a, r]:   | a a a a a a | r r r r |   costed as the capacity: it packs alone
    the rest:      p, q, m pack as before

:func:`units` groups a buffer that way; the algorithms then pack the units (``select_packs``,
``pack`` and ``pack_stream`` take ``company=``), so the loader, the tools and the benchmarks
run one rule.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from energon_packing.packing.carry import Selection

__all__ = ["Company", "Units", "check_company", "group"]


class Company(enum.IntEnum):
    """Whom a sample may share its pack with."""

    #: anything except an ``APART`` sample
    ANY = 0
    #: no media: anything, and it may fill an ``APART`` sample's pack
    PLAIN = 1
    #: only ``PLAIN`` samples (its model hears the rest of its call)
    APART = 2


@dataclass(kw_only=True, slots=True)
class Units:
    """A buffer grouped into units: each ``APART`` sample with the ``PLAIN`` samples that fill
    its pack, every other sample alone. ``lengths`` is what the algorithms pack: the capacity
    for a unit holding an ``APART`` sample (it packs alone), the sample's length otherwise."""

    members: list[list[int]]
    lengths: list[int]
    #: tokens of the buffer's ``PLAIN`` samples, and the room its ``APART`` samples leave
    plain: int = 0
    room: int = 0

    @property
    def sizes(self) -> list[int]:
        """Samples in each unit."""
        return [len(unit) for unit in self.members]

    def volumes(self, lengths: Sequence[int]) -> list[int]:
        """What each unit holds: the sum of its samples' lengths."""
        return [sum(lengths[i] for i in unit) for unit in self.members]

    def carry_loads(self, lengths: Sequence[int]) -> list[int]:
        """What the carry rule weighs each unit by. Where the buffer's text could fill at least
        half the room its clips' packs leave, a unit weighs what it holds: one that text has
        not filled yet waits for more, as an under-full pack does. Where text is scarcer, it
        weighs the capacity and leaves at once: carrying would only take the budget from
        under-full text packs (``benchmarks/company.py``, buffer 256: with 20 % clips at
        C=4096, 5,848 packs weighing the capacity always, 5,755 so; with 60 % clips, 12,902
        weighing what they hold always, 12,816 so)."""
        if 2 * self.plain >= self.room:
            return self.volumes(lengths)
        return self.lengths

    def counts(self, carry_counts: Sequence[int]) -> list[int]:
        """A unit has waited as long as its longest-waiting member."""
        return [max(carry_counts[i] for i in unit) for unit in self.members]

    def expand_groups(self, groups: list[list[int]]) -> list[list[int]]:
        return [[i for u in g for i in self.members[u]] for g in groups]

    def expand(self, selection: Selection) -> Selection:
        """A selection over the units as one over the samples."""
        return Selection(
            packs=self.expand_groups(selection.packs),
            carried=[i for u in selection.carried for i in self.members[u]],
            waste=selection.waste,
        )


def check_company(company: Sequence[int], count: int) -> list[Company]:
    if len(company) != count:
        raise ValueError(f"company has {len(company)} entries for {count} lengths")
    try:
        return [Company(c) for c in company]
    except ValueError:
        bad = next(c for c in company if c not in set(Company))
        raise ValueError(
            f"company entry {bad!r} is none of {', '.join(f'{c.name}={c.value}' for c in Company)}"
        ) from None


def group(
    lengths: Sequence[int],
    capacity: int,
    company: Sequence[int],
    *,
    max_per_pack: int | None = None,
) -> Units | None:
    """``PLAIN`` samples into the packs of ``APART`` ones, best fit, longest first (ties: the
    earlier sample); ``None`` where the buffer holds no ``APART`` sample (nothing to group).

    Deterministic in the buffer's content and order, so a restored loader groups alike. Units
    come in the order of their first sample; a unit lists its ``APART`` sample first.
    """
    kinds = check_company(company, len(lengths))
    apart = [i for i, kind in enumerate(kinds) if kind is Company.APART]
    if not apart:
        return None
    per_pack = max_per_pack or len(lengths)
    filled: dict[int, list[int]] = {i: [i] for i in apart}
    # (room left, APART sample), for units that may take another member
    rooms = sorted((capacity - lengths[i], i) for i in apart if per_pack > 1)
    taken: set[int] = set()
    plain = sorted(
        (i for i, kind in enumerate(kinds) if kind is Company.PLAIN),
        key=lambda i: (-lengths[i], i),
    )
    for i in plain:
        if not rooms:
            break
        at = bisect.bisect_left(rooms, (lengths[i], -1))  # the tightest room that holds it
        if at == len(rooms):
            continue
        room, owner = rooms.pop(at)
        filled[owner].append(i)
        taken.add(i)
        if len(filled[owner]) < per_pack and room - lengths[i] > 0:
            bisect.insort(rooms, (room - lengths[i], owner))
    members = [filled.get(i, [i]) for i in range(len(lengths)) if i not in taken]
    return Units(
        plain=sum(lengths[i] for i in plain),
        room=sum(capacity - lengths[i] for i in apart),
        members=members,
        lengths=[capacity if m[0] in filled else lengths[m[0]] for m in members],
    )
