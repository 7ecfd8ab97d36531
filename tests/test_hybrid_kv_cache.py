"""Chapter 15's hybrid block manager: random operation sequences against its invariants (no block
lost or shared wrongly, nothing inside any request's window freed, prefix hits exact), and the
engine's pool on a long Gemma-shaped request."""

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minillm.core.block_manager import Sequence
from minillm.core.hybrid_kv_cache import NULL_BLOCK, HybridBlockManager, kv_cache_groups
from minillm.utils import cdiv

BLOCK = 4
PIECES = [[i] * BLOCK for i in range(3)] + [[7, 8, 9, 10], [7, 8, 9, 11]]


def test_groups_have_one_size_full_attention_first():
    gemma = [512] * 5 + [None]
    assert kv_cache_groups(gemma * 3) == [
        [5, 11, 17],
        [0, 1, 2],
        [3, 4, 6],
        [7, 8, 9],
        [10, 12, 13],
        [14, 15, 16],
    ]
    assert kv_cache_groups(gemma) == [[5], [0], [1], [2], [3], [4]]
    assert kv_cache_groups([None] * 4) == [[0, 1, 2, 3]]
    assert kv_cache_groups([None, 8, 8, 8, 8, None, 8]) == [[0, 5], [1, 2], [3, 4], [6]]


class HybridMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(6, 40),
        caching=st.booleans(),
        window=st.integers(1, 13),
        chunk=st.integers(1, 12),
    )
    def setup(self, num_blocks, caching, window, chunk):
        windows = [None, window, window]
        self.bm = HybridBlockManager(num_blocks, BLOCK, caching, windows, chunk)
        self.live: list[Sequence] = []
        self.next_id = 0

    def tables(self, seq):
        return [seq.block_table, *seq.group_tables]

    def step(self, seq: Sequence, n: int) -> bool:
        "Blocks for n more tokens and their computation, or the sequence preempted."
        if not self.bm.can_allocate(seq, n):
            self.bm.free(seq)
            seq.num_computed_tokens = 0
            return False
        self.bm.allocate(seq, n)
        for g, table in enumerate(self.tables(seq)):  # every position a query reads is there
            first = self.bm.skipped_blocks(g, seq.num_computed_tokens)
            assert NULL_BLOCK not in table[first:]
            assert len(table) == cdiv(seq.num_computed_tokens + n, BLOCK)
        held = sum(b != NULL_BLOCK for t in self.tables(seq) for b in t)
        assert held <= self.bm.peak_blocks(seq.num_computed_tokens + n)  # what `check` admits
        seq.num_computed_tokens += n
        self.bm.cache_blocks(seq)
        return True

    @rule(
        pieces=st.lists(st.sampled_from(range(len(PIECES))), min_size=1, max_size=6),
        tail=st.integers(0, BLOCK),
    )
    def admit(self, pieces, tail):
        "A new sequence: prefix lookup, then its prompt in chunks."
        tokens = [t for p in pieces for t in PIECES[p]] + list(range(100, 100 + tail))
        seq = Sequence(self.next_id, tokens)
        self.next_id += 1
        hit = seq.num_computed_tokens = self.bm.match_prefix(seq)
        assert hit % BLOCK == 0 and hit < len(tokens)
        for table in self.tables(seq):  # a hit holds exactly the right tokens, or nothing
            for i, block_id in enumerate(table):
                held = self.bm.blocks[block_id].token_ids
                assert block_id == NULL_BLOCK or held == tuple(tokens[i * BLOCK : (i + 1) * BLOCK])
        while seq.num_computed_tokens < len(seq):
            n = min(self.bm.max_chunk, len(seq) - seq.num_computed_tokens)
            if not self.step(seq, n):
                return
        self.live.append(seq)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), token=st.integers(0, 3))
    def append_token(self, i, token):
        seq = self.live[i % len(self.live)]
        seq.token_ids.append(token)
        if not self.step(seq, 1):
            self.live.remove(seq)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def finish(self, i):
        seq = self.live.pop(i % len(self.live))
        self.bm.free(seq)
        assert not seq.block_table and not seq.group_tables and not seq.block_hashes

    def users(self) -> Counter:
        return Counter(b for s in self.live for t in self.tables(s) for b in t if b != NULL_BLOCK)

    @invariant()
    def ref_counts_equal_users(self):
        if hasattr(self, "bm"):
            users = self.users()
            for blk in self.bm.blocks[1:]:
                assert blk.ref_count == users[blk.block_id]
            assert self.bm.blocks[NULL_BLOCK].ref_count == 1

    @invariant()
    def no_block_lost(self):
        if hasattr(self, "bm"):
            free = set(self.bm.empty) | set(self.bm.cached_free)
            used = set(self.users())
            assert len(free) == self.bm.num_free_blocks and not free & used
            assert free | used == set(range(1, self.bm.num_blocks + 1))

    @invariant()
    def hash_index_is_consistent(self):
        if hasattr(self, "bm"):
            for key, block_id in self.bm.hash_to_block.items():
                assert self.bm.blocks[block_id].hash == key
            for block_id in self.bm.cached_free:
                assert self.bm.blocks[block_id].hash is not None

    def teardown(self):
        if hasattr(self, "bm"):
            for seq in self.live:
                self.bm.free(seq)
            assert self.bm.num_free_blocks == self.bm.num_blocks  # nothing leaks


TestHybridBlockManager = HybridMachine.TestCase
TestHybridBlockManager.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
