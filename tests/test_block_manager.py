"Property-based tests of the block manager: random operation sequences, invariants after each step."

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minillm.core.block_manager import BlockManager, Sequence

BLOCK = 4
# Few distinct prompts built from few distinct blocks, so prefixes are shared and hit often.
PIECES = [[i] * BLOCK for i in range(3)] + [[7, 8, 9, 10], [7, 8, 9, 11]]


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(4, 24), caching=st.booleans())
    def setup(self, num_blocks, caching):
        self.bm = BlockManager(num_blocks, BLOCK, enable_prefix_caching=caching)
        self.live: list[Sequence] = []
        self.next_id = 0

    @rule(
        pieces=st.lists(st.sampled_from(range(len(PIECES))), min_size=1, max_size=5),
        tail=st.integers(0, BLOCK),
    )
    def admit(self, pieces, tail):
        "A new sequence: prefix lookup, then blocks for the rest of its prompt, computed in one go."
        tokens = [t for p in pieces for t in PIECES[p]] + list(range(100, 100 + tail))
        seq = Sequence(self.next_id, tokens)
        self.next_id += 1
        hit = seq.num_computed_tokens = self.bm.match_prefix(seq)
        assert hit % BLOCK == 0 and hit < len(tokens)
        for i, block_id in enumerate(seq.block_table):  # a hit holds exactly the right tokens
            assert self.bm.blocks[block_id].token_ids == tuple(tokens[i * BLOCK : (i + 1) * BLOCK])
        if not self.bm.can_allocate(seq, len(seq) - hit):
            self.bm.free(seq)
            return
        before = set(b for s in self.live for b in s.block_table)
        self.bm.allocate(seq, len(seq) - hit)
        fresh = seq.block_table[
            len(seq.block_table) - (self.bm.blocks_needed(len(seq)) - hit // BLOCK) :
        ]
        assert not before & set(fresh), "a block in use was handed out again"
        seq.num_computed_tokens = len(seq)
        self.bm.cache_blocks(seq)
        self.live.append(seq)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), token=st.integers(0, 3))
    def append_token(self, i, token):
        "A decode step: one more token, maybe one more block."
        seq = self.live[i % len(self.live)]
        seq.token_ids.append(token)
        if self.bm.can_allocate(seq, 1):
            self.bm.allocate(seq, 1)
            seq.num_computed_tokens += 1
            self.bm.cache_blocks(seq)
        else:  # out of blocks: preempt it, as the scheduler would
            self.bm.free(seq)
            seq.num_computed_tokens = 0
            self.live.remove(seq)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def finish(self, i):
        seq = self.live.pop(i % len(self.live))
        self.bm.free(seq)
        assert not seq.block_table and not seq.block_hashes

    @invariant()
    def ref_counts_equal_users(self):
        if not hasattr(self, "bm"):
            return
        users = Counter(b for s in self.live for b in s.block_table)
        for blk in self.bm.blocks:
            assert blk.ref_count == users[blk.block_id]

    @invariant()
    def no_block_lost(self):
        if not hasattr(self, "bm"):
            return
        free = set(self.bm.empty) | set(self.bm.cached_free)
        used = {b for s in self.live for b in s.block_table}
        assert len(free) == self.bm.num_free_blocks and not free & used
        assert free | used == set(range(self.bm.num_blocks))

    @invariant()
    def hash_index_is_consistent(self):
        if not hasattr(self, "bm"):
            return
        for h, block_id in self.bm.hash_to_block.items():
            assert self.bm.blocks[block_id].hash == h
        for block_id in self.bm.cached_free:
            assert self.bm.blocks[block_id].hash is not None

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for seq in self.live:
            self.bm.free(seq)
        assert self.bm.num_free_blocks == self.bm.num_blocks  # nothing leaks


TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def test_lru_eviction_order():
    bm = BlockManager(6, BLOCK)
    old, new = Sequence(0, [1] * 8), Sequence(1, [2] * 8)
    for s in (old, new):
        bm.match_prefix(s)
        bm.allocate(s, 8)
        s.num_computed_tokens = 8
        bm.cache_blocks(s)
    old_blocks, new_blocks = old.block_table[:2], new.block_table[:2]
    bm.free(old)
    bm.free(new)
    taker = Sequence(2, [5] * 12)
    bm.allocate(taker, 8)
    taker.num_computed_tokens = 8  # 2 blocks: the 2 empty ones go first
    assert not set(taker.block_table) & set(old_blocks + new_blocks)
    bm.allocate(taker, 4)  # one more: evicts the least recently used, old's tail
    assert taker.block_table[-1] == old_blocks[1]
    assert bm.match_prefix(Sequence(3, [2] * 9)) == 8  # new's prefix is still cached


def test_full_prompt_hit_recomputes_last_block():
    bm = BlockManager(8, BLOCK)
    a = Sequence(0, list(range(8)))
    bm.match_prefix(a)
    bm.allocate(a, 8)
    a.num_computed_tokens = 8
    bm.cache_blocks(a)
    b = Sequence(1, list(range(8)))
    assert bm.match_prefix(b) == 4 and b.block_table == a.block_table[:1]
