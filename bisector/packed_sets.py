"""Sets of candidate names stored as bit masks: what a search remembers of every plan it asked.

A search keeps each plan it asked (the strategy's memo, the oracle's verdicts and history) for its whole length. As
frozensets of names those cost 16–32 bytes per member (a hash table of pointers): a diffuse search of a
1200-node chain, 3399 plans of ~1100 FP32 nodes each, held ~300 MB of them, 4.5× the memory of one inference of
the model (docs/benchmarks.md, "Scale, twentieth round"). As one bit per candidate the same plans take 150 bytes
each. `PackedSet` is such a mask that reads as an immutable set of names (``in``, iteration, ``len``, comparisons
and hashing as a frozenset of the same names, the frozenset methods), so that a verdict's ``fp32`` can be one;
`SetMemo` is a dict keyed by such masks that is asked with any set of names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping, Set
from operator import itemgetter
from typing import Any

import numpy as np


class Universe:
    """The names a mask's bits stand for, in a fixed order (a search's candidates)."""

    __slots__ = ("names", "index")

    def __init__(self, names: Iterable[str]):
        self.names = tuple(names)
        self.index = {n: i for i, n in enumerate(self.names)}

    def mask(self, members: Iterable[str]) -> bytes | None:
        """The bit mask of `members` (big-endian bit order within each byte, as ``np.packbits``); None where one
        of them is not in the universe."""
        members = members if isinstance(members, (set, frozenset, PackedSet, list, tuple)) else list(members)
        bits = np.zeros(len(self.names), dtype=bool)
        if len(members):
            try:  # the index lookups in C (a plan of 1100 names: ~2x a list comprehension)
                idx = itemgetter(*members)(self.index) if len(members) > 1 else [self.index[next(iter(members))]]
            except (KeyError, TypeError):  # a name from elsewhere (or not a name): not packable
                return None
            bits[list(idx) if isinstance(idx, tuple) else idx] = True
        return np.packbits(bits).tobytes()

    def pack(self, members: Iterable[str]) -> "PackedSet | frozenset[str]":
        """`members` as a PackedSet, or as a frozenset where one of them is not in the universe."""
        if isinstance(members, PackedSet) and members.universe is self:
            return members
        members = members if isinstance(members, (set, frozenset)) else frozenset(members)
        mask = self.mask(members)
        return frozenset(members) if mask is None else PackedSet(self, mask, len(members))

    def members(self, mask: bytes) -> list[str]:
        """The names of the bits set in `mask`, in universe order."""
        bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), count=len(self.names))
        names = self.names
        return [names[i] for i in np.flatnonzero(bits).tolist()]


class PackedSet(Set):
    """An immutable set of a universe's names held as a bit mask. Equal to, and hashed as, the frozenset of the
    same names (so either finds the other in a dict); set operations return frozensets."""

    __slots__ = ("universe", "mask", "_len", "_hash_value")

    def __init__(self, universe: Universe, mask: bytes, length: int):
        self.universe, self.mask, self._len = universe, mask, length
        self._hash_value: int | None = None

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        return iter(self.universe.members(self.mask))

    def __contains__(self, name: object) -> bool:
        i = self.universe.index.get(name) if isinstance(name, str) else None
        return i is not None and bool(self.mask[i >> 3] & (0x80 >> (i & 7)))

    def __hash__(self) -> int:
        if self._hash_value is None:
            self._hash_value = hash(frozenset(self))  # the frozenset's own hash: the two find each other in a dict
        return self._hash_value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedSet) and other.universe is self.universe:
            return self.mask == other.mask
        return super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> frozenset:
        return frozenset(it)

    def __reduce__(self):  # pickled (to a worker process, a journal) as the frozenset it stands for
        return frozenset, (tuple(self),)

    def __repr__(self) -> str:
        return f"PackedSet({sorted(self)!r})"

    # frozenset's methods (the Set mixin gives the operators)
    def union(self, *others: Iterable[str]) -> frozenset:
        return frozenset(self).union(*others)

    def intersection(self, *others: Iterable[str]) -> frozenset:
        return frozenset(self).intersection(*others)

    def difference(self, *others: Iterable[str]) -> frozenset:
        return frozenset(self).difference(*others)

    def symmetric_difference(self, other: Iterable[str]) -> frozenset:
        return frozenset(self).symmetric_difference(other)

    def issubset(self, other: Iterable[str]) -> bool:
        return frozenset(self).issubset(other)

    def issuperset(self, other: Iterable[str]) -> bool:
        return all(x in self for x in other)

    def copy(self) -> "PackedSet":
        return self


class SetMemo(MutableMapping):
    """A dict from sets of names to values whose keys are held as bit masks over `universe` (names outside it:
    as frozensets). Asked and filled with any set of names; iterates the keys as PackedSets/frozensets."""

    def __init__(self, universe: Universe | Iterable[str]):
        self.universe = universe if isinstance(universe, Universe) else Universe(universe)
        self._data: dict[bytes | frozenset, Any] = {}

    def _key(self, members: Iterable[str]) -> bytes | frozenset:
        if isinstance(members, PackedSet) and members.universe is self.universe:
            return members.mask
        members = members if isinstance(members, (set, frozenset, PackedSet)) else frozenset(members)
        mask = self.universe.mask(members)
        return frozenset(members) if mask is None else mask

    def key(self, members: Iterable[str]) -> bytes | frozenset:
        """The memo's key for `members` (their mask), for `get_key`/`set_key`: one packing per set asked."""
        return self._key(members)

    def get_key(self, key: bytes | frozenset, default: Any = None) -> Any:
        return self._data.get(key, default)

    def set_key(self, key: bytes | frozenset, value: Any) -> None:
        self._data[key] = value

    def packed(self, key: bytes | frozenset, size: int) -> "PackedSet | frozenset":
        """The set a `key` of `size` members stands for."""
        return PackedSet(self.universe, key, size) if isinstance(key, bytes) else key

    def __getitem__(self, members: Iterable[str]) -> Any:
        return self._data[self._key(members)]

    def __setitem__(self, members: Iterable[str], value: Any) -> None:
        self._data[self._key(members)] = value

    def __delitem__(self, members: Iterable[str]) -> None:
        del self._data[self._key(members)]

    def __contains__(self, members: object) -> bool:
        try:
            return self._key(members) in self._data  # type: ignore[arg-type]
        except TypeError:
            return False

    def __iter__(self) -> Iterator[PackedSet | frozenset]:
        for key in self._data:
            if isinstance(key, bytes):
                n = int(np.unpackbits(np.frombuffer(key, dtype=np.uint8)).sum())
                yield PackedSet(self.universe, key, n)
            else:
                yield key

    def __len__(self) -> int:
        return len(self._data)
