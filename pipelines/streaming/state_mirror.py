"""A worker's decoded copy of a key's bag states, checked against the runner's.

A stateful stage reads its whole state on every element; through the Fn API
that is a round trip to the runner carrying every byte of it (Prism hands the
SDK no cache tokens, so Beam's own state cache cannot keep it), then an IPC
decode of every chunk. The mirror keeps the decoded chunks in the worker
instead, and every change goes to both: the runner's bag (still the truth)
and the mirror.

Why it cannot serve stale state: each change also writes a fresh random
token to a ``ReadModifyWriteState`` of the key, and the mirror keeps the
token of its copy. A read whose token differs (another worker changed the
key, a failed bundle's changes were never committed, a new job) rebuilds the
copy from the bags. A token is never reused, so no two copies share one.

Memory: at most ``budget_bytes`` of chunks per stage and worker; the keys
least recently used go first (they are read from the runner again when next
needed).
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
from apache_beam.coders import VarIntCoder
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

DEFAULT_BUDGET_BYTES: Final = 1 << 30
TOKEN: Final = ReadModifyWriteStateSpec("mirror_token", VarIntCoder())
"""The state spec of the token: a stage that mirrors its bags declares it."""

_CHANGING: Final = -1
"""The token of a copy being changed or rebuilt: never the runner's (tokens
are non-negative), so a change that fails half-way is never served."""

Chunk = tuple[Any, pa.Table]
"""A bag element and its decoded table."""


@dataclass
class _Copy:
    token: int
    bags: dict[str, list[Chunk]] = field(default_factory=dict)
    nbytes: int = 0


class StateMirror:
    """The mirrors of one stage in this worker (shared by its DoFn instances).

    Args:
        decode: a bag element -> its table.
        size: a bag element -> its size in bytes (what the budget counts).
        budget_bytes: how much the copies may hold in all.
    """

    def __init__(
        self,
        decode: Callable[[Any], pa.Table],
        size: Callable[[Any], int],
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
    ) -> None:
        self._decode = decode
        self._size = size
        self._budget = budget_bytes
        self._copies: OrderedDict[Any, _Copy] = OrderedDict()
        self._lock = threading.Lock()
        self._held = 0
        self._counted: dict[Any, int] = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def open(self, key: Any, token: Any, bags: Mapping[str, Any]) -> MirroredState:
        """The key's state, from the copy when its token is the runner's."""
        current = token.read()
        with self._lock:
            copy = self._copies.get(key)
            if copy is not None and current is not None and copy.token == current:
                self._copies.move_to_end(key)
                self.hits += 1
                return MirroredState(self, key, token, bags, copy)
            self._copies.pop(key, None)
            self._held -= self._counted.pop(key, 0)
            self.misses += 1
        copy = _Copy(token=_CHANGING)
        for name, bag in bags.items():
            elements = list(bag.read())
            copy.bags[name] = [(e, self._decode(e)) for e in elements]
            copy.nbytes += sum(self._size(e) for e in elements)
        return MirroredState(self, key, token, bags, copy)

    def _keep(self, key: Any, copy: _Copy) -> None:
        with self._lock:
            # A copy changes in place: what it held is what was counted.
            self._held += copy.nbytes - self._counted.get(key, 0)
            self._counted[key] = copy.nbytes
            self._copies[key] = copy
            self._copies.move_to_end(key)
            while self._held > self._budget and len(self._copies) > 1:
                evicted, _ = self._copies.popitem(last=False)
                self._held -= self._counted.pop(evicted)
                self.evictions += 1


class MirroredState:
    """One key's bags during one call: read from the copy, changed in both."""

    def __init__(
        self,
        mirror: StateMirror,
        key: Any,
        token: Any,
        bags: Mapping[str, Any],
        copy: _Copy,
    ) -> None:
        self._mirror, self._key, self._token = mirror, key, token
        self._bags, self._copy = bags, copy

    def chunks(self, bag: str) -> list[Chunk]:
        """The bag's elements with their tables, in the order they were added."""
        return list(self._copy.bags[bag])

    def tables(self, bag: str) -> list[pa.Table]:
        """The bag's tables, in the order they were added."""
        return [table for _, table in self._copy.bags[bag]]

    def add(self, bag: str, element: Any, table: pa.Table | None = None) -> None:
        """Append to the bag (``table``: the element decoded, when at hand)."""
        self._copy.token = _CHANGING
        self._bags[bag].add(element)
        self._hold(bag, element, table)
        self._changed()

    def replace(self, bag: str, chunks: list[tuple[Any, pa.Table | None]]) -> None:
        """Clear the bag, then add these elements (each with its table or None)."""
        self._copy.token = _CHANGING
        state = self._bags[bag]
        state.clear()
        self._copy.nbytes -= sum(self._mirror._size(e) for e, _ in self._copy.bags[bag])
        self._copy.bags[bag] = []
        for element, table in chunks:
            state.add(element)
            self._hold(bag, element, table)
        self._changed()

    def _hold(self, bag: str, element: Any, table: pa.Table | None) -> None:
        decoded = self._mirror._decode(element) if table is None else table
        self._copy.bags[bag].append((element, decoded))
        self._copy.nbytes += self._mirror._size(element)

    def _changed(self) -> None:
        self._copy.token = random.getrandbits(62)
        self._token.write(self._copy.token)
        self._mirror._keep(self._key, self._copy)
