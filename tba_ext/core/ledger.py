"""The trajectory ledger: where each trajectory the trainer took from the searchers went. No verl import.

Each trajectory read from the searchers' output gets an id (``new_id``) and is, at any time, in exactly one place:
in the replay store, evicted from it (under the rule that removed it), or dropped before it was stored (with the
reason). Training is recorded beside that: the optimizer updates that used it. ``check`` closes the books against
the store: nothing read and left unaccounted, and the store holding exactly the ids the ledger calls stored.

Two bytes per id (its place, whether it was trained on) and 16 per use: a million trajectories trained on twice each
take ~34 MB.
"""

from __future__ import annotations

from array import array

import numpy as np

UNACCOUNTED, STORED = 0, 1
EVICTION_RULES = (
    "per_prompt_capacity",  # the prompt held more than per_prompt_capacity trajectories: its oldest left
    "capacity",  # the store held more than capacity trajectories: the oldest version's oldest left
    "capacity_bytes",  # the store held more than capacity_bytes
    "staleness",  # older than max_staleness updates at a sample
    "max_replays",  # drawn max_replays times
    "duplicate",  # the same response tokens arrived again for the prompt: the newest copy is kept
)
DROP_REASONS = (
    "nonfinite_reward",  # a NaN / inf reward (max_nonfinite_frac stops the run when too many are)
    "unknown_version",  # served by a searcher without a weight version: its staleness cannot be counted
    # finished, but its group evicted by verl's own buffer before the store read it:
    "verl_stale",  # older than trainer.v1.sampler.max_off_policy_threshold
    "verl_filter_groups",  # DAPO's algorithm.filter_groups (no reward variance in the group)
    "verl_failed_group",  # a group some of whose samples failed
    "crash",  # read, then lost with a trainer killed mid-append to the journal (tba_ext.core.journal)
)
PLACES = ("unaccounted", "stored", *(f"evicted/{r}" for r in EVICTION_RULES), *(f"dropped/{r}" for r in DROP_REASONS))
_CODE = {name: code for code, name in enumerate(PLACES)}
# where a trajectory the store served can be: still stored, or evicted by the very draw that served it (max_replays)
_SERVABLE = frozenset(code for code, name in enumerate(PLACES) if name == "stored" or name.startswith("evicted/"))


class LedgerError(RuntimeError):
    pass


class TrajectoryLedger:
    def __init__(self):
        self._place = bytearray()  # per id: its index in PLACES
        self._trained = bytearray()  # per id: 1 once an update used it
        self._uses = array("q")  # flat (id, update) pairs
        # ids per place and ids trained on, kept as they change: ``counts`` costs the same at any number of ids
        self._tally = [0] * len(PLACES)
        self._trained_ids = 0

    def __len__(self) -> int:
        return len(self._place)

    def new_id(self) -> int:
        """An id for a trajectory just read from the searchers' output; unaccounted until stored or dropped."""
        self._place.append(UNACCOUNTED)
        self._trained.append(0)
        self._tally[UNACCOUNTED] += 1
        return len(self._place) - 1

    def stored(self, trajectory_id: int) -> None:
        self._move(trajectory_id, UNACCOUNTED, STORED)

    def evicted(self, trajectory_id: int, rule: str) -> None:
        self._move(trajectory_id, STORED, _CODE[f"evicted/{rule}"])

    def dropped(self, trajectory_id: int, reason: str) -> None:
        self._move(trajectory_id, UNACCOUNTED, _CODE[f"dropped/{reason}"])

    def trained(self, trajectory_ids, update: int) -> None:
        """``trajectory_ids`` were served to the optimizer update ``update`` (counted from 1)."""
        for trajectory_id in trajectory_ids:
            if self._place[trajectory_id] not in _SERVABLE:
                raise LedgerError(f"trajectory {trajectory_id} trained on while {self.place(trajectory_id)}")
            self._trained_ids += not self._trained[trajectory_id]
            self._trained[trajectory_id] = 1
            self._uses.extend((trajectory_id, update))

    def _move(self, trajectory_id: int, source: int, target: int) -> None:
        if not 0 <= trajectory_id < len(self._place):
            raise LedgerError(f"trajectory id {trajectory_id} was never issued (ledger holds {len(self._place)})")
        if self._place[trajectory_id] != source:
            raise LedgerError(
                f"trajectory {trajectory_id} is {PLACES[self._place[trajectory_id]]}, cannot become {PLACES[target]}"
            )
        self._place[trajectory_id] = target
        self._tally[source] -= 1
        self._tally[target] += 1

    def place(self, trajectory_id: int) -> str:
        return PLACES[self._place[trajectory_id]]

    def updates_of(self, trajectory_id: int) -> list[int]:
        """The updates that trained on ``trajectory_id``, in order."""
        pairs = np.frombuffer(self._uses, dtype=np.int64).reshape(-1, 2)
        return pairs[pairs[:, 0] == trajectory_id, 1].tolist()

    def counts(self) -> dict[str, int]:
        """How many ids are in each place (every place listed, 0 included), ``ids`` in all, ``uses`` (trajectory,
        update) pairs served and ``trained_ids`` distinct trajectories trained on. Kept as counters: O(1) in the
        number of ids (``recount`` derives them from the per-id records)."""
        places = dict(zip(PLACES, self._tally))
        return {"ids": len(self._place), **places, "uses": len(self._uses) // 2, "trained_ids": self._trained_ids}

    def recount(self) -> dict[str, int]:
        """``counts`` from the per-id records (what the counters must equal)."""
        places = {name: self._place.count(code) for code, name in enumerate(PLACES)}
        trained = len(self._trained) - self._trained.count(0)
        return {"ids": len(self._place), **places, "uses": len(self._uses) // 2, "trained_ids": trained}

    def check(self, stored_ids) -> None:
        """Raises ``LedgerError`` unless every id is stored, evicted or dropped, and ``stored_ids`` (the ids the
        replay store holds) are exactly the ids the ledger calls stored."""
        unaccounted = [i for i, code in enumerate(self._place) if code == UNACCOUNTED]
        if unaccounted:
            raise LedgerError(f"{len(unaccounted)} trajectories read but never stored or dropped: {unaccounted[:10]}")
        stored = {i for i, code in enumerate(self._place) if code == STORED}
        held = set(stored_ids)
        if held != stored:
            gone, extra = sorted(stored - held), sorted(held - stored)
            raise LedgerError(
                f"the store lost {len(gone)} trajectories without an eviction ({gone[:10]}) and holds {len(extra)} "
                f"the ledger does not call stored ({extra[:10]})"
            )

    def state_dict(self) -> dict:
        return {
            "places": list(PLACES),
            "place": bytes(self._place),
            "trained": bytes(self._trained),
            "uses": self._uses.tobytes(),
        }

    def load_state_dict(self, state: dict) -> None:
        unknown = [name for name in state["places"] if name not in _CODE]
        if unknown:  # a place this tba-ext does not know: its trajectories could not be accounted for
            raise LedgerError(f"the saved ledger has places {unknown} this tba-ext does not know ({list(PLACES)})")
        # saved codes -> this version's (a version that added places numbers them differently)
        table = bytes(_CODE[name] for name in state["places"]).ljust(256, b"\0")
        self._place = bytearray(bytes(state["place"]).translate(table))
        self._trained = bytearray(state["trained"])
        self._uses = array("q")
        self._uses.frombytes(state["uses"])
        counted = self.recount()
        self._tally = [counted[name] for name in PLACES]
        self._trained_ids = counted["trained_ids"]


def unbalanced(counts: dict[str, int], store_size: int) -> str | None:
    """What is wrong with a ledger's ``counts`` against a store holding ``store_size`` trajectories, or None: the
    books close when every id is in one place, none unaccounted, and the stored ones are the store's."""
    placed = sum(counts[name] for name in PLACES)
    if placed != counts["ids"]:
        return f"{counts['ids']} ids but {placed} in places"
    if counts["unaccounted"]:
        return f"{counts['unaccounted']} trajectories read but never stored or dropped"
    if counts["stored"] != store_size:
        return f"the ledger calls {counts['stored']} stored, the store holds {store_size}"
    return None
