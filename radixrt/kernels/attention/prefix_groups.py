"""PrefixGroups: which decode rows of a step share a cached prefix, for shared-prefix (cascade) attention.

A *group* is a set of decode rows (batch rows with one new token) whose requests hold the same KV pages
for the token range ``[start, end)``: in radixrt, the pages of a radix-tree node path that every member
matched. Groups nest: a level-``l+1`` group covers a range right after its level-``l`` group's range,
and all its members belong to that one level-``l`` group (a tree path below a shared node). Per row,
what no group covers, ``[suffix_start, kv_len)``, is attended by the row alone.

The attention of a row is then the exact log-sum-exp merge of its groups' partial attentions and its
suffix's (Hydragen, arXiv 2402.05099; FlashInfer's multi-level cascade and ``merge_state``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefixGroups:
    """Shared-prefix groups of one step (plain Python lists; the backend's ``plan`` turns them into
    index tensors once per step).

    Attributes:
        rows: per group, its member rows: batch indices (into ``AttentionMetadata``'s requests) of decode
            rows (``q_len == 1``), each row at most once per level.
        starts: per group, the first shared token position (tokens); the end of the enclosing group, or 0.
        ends: per group, one past the last shared token (tokens); below every member's ``kv_len``.
        pages: per group, the page ids holding tokens ``[starts[g] // P * P, ends[g])``, in order,
            i.e. ``page_table[starts[g] // P : ceil(ends[g] / P)]`` of any member.
        levels: per group, its nesting depth (0 for a group that starts at token 0).
        suffix_starts: per batch row, the first token the row attends alone: the end of its deepest
            group, 0 for a row in no group (extend rows included).
    """

    rows: list[list[int]]
    starts: list[int]
    ends: list[int]
    pages: list[list[int]]
    levels: list[int]
    suffix_starts: list[int]

    @property
    def num_groups(self) -> int:
        return len(self.rows)

    @property
    def num_levels(self) -> int:
        return max(self.levels) + 1 if self.levels else 0

    def validate(self, kv_lens: list[int], q_lens: list[int], page_size: int) -> None:
        """Check the groups against a batch's lengths (a debugging aid and the tests' guard).

        Raises:
            ValueError: naming the field: list lengths that differ, an empty group, a member that is not a
                decode row or is listed twice in a level, a range that is empty, reaches a member's
                ``kv_len`` or does not chain to the member's previous level, too few pages, or a
                ``suffix_starts`` entry that is not the end of the row's deepest group.
        """
        n = len(self.rows)
        for name, values in (
            ("starts", self.starts),
            ("ends", self.ends),
            ("pages", self.pages),
            ("levels", self.levels),
        ):
            if len(values) != n:
                raise ValueError(f"PrefixGroups.{name} has {len(values)} entries for {n} groups")
        if len(self.suffix_starts) != len(kv_lens):
            raise ValueError(
                f"PrefixGroups.suffix_starts has {len(self.suffix_starts)} entries for {len(kv_lens)} rows"
            )
        chain: dict[int, list[tuple[int, int, int]]] = {}  # row -> [(level, start, end)]
        for g in range(n):
            s, e, members = self.starts[g], self.ends[g], self.rows[g]
            if not members:
                raise ValueError(f"PrefixGroups.rows[{g}] is empty")
            if not 0 <= s < e:
                raise ValueError(f"PrefixGroups.starts/ends[{g}] = {s}, {e} is not a non-empty range")
            for r in members:
                if not 0 <= r < len(kv_lens) or q_lens[r] != 1:
                    raise ValueError(f"PrefixGroups.rows[{g}] holds {r}, not a decode row of the batch")
                if e >= kv_lens[r]:
                    raise ValueError(f"PrefixGroups.ends[{g}] = {e} reaches row {r}'s kv_len {kv_lens[r]}")
                chain.setdefault(r, []).append((self.levels[g], s, e))
            need = -(-e // page_size) - s // page_size
            if len(self.pages[g]) != need:
                raise ValueError(f"PrefixGroups.pages[{g}] has {len(self.pages[g])} pages, [{s}, {e}) needs {need}")
        for r in range(len(kv_lens)):
            links = sorted(chain.get(r, []))
            prev_end = 0
            for depth, (lvl, s, e) in enumerate(links):
                if lvl != depth or s != prev_end:
                    raise ValueError(f"PrefixGroups.levels/starts: row {r}'s groups do not chain from token 0")
                prev_end = e
            if self.suffix_starts[r] != prev_end:
                raise ValueError(f"PrefixGroups.suffix_starts[{r}] = {self.suffix_starts[r]}, expected {prev_end}")
