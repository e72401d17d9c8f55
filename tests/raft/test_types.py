from raft.core.types import ConfState, Entry, EntryKind


def test_members_union_of_voters_and_learners_sorted() -> None:
    conf = ConfState(voters=(3, 1), learners=(2,))
    assert conf.members() == (1, 2, 3)


def test_entry_size_counts_payload() -> None:
    small = Entry(term=1, index=1, tm=5, kind=EntryKind.NORMAL, data=b"x")
    big = Entry(term=1, index=2, tm=6, kind=EntryKind.NORMAL, data=b"x" * 100)
    assert big.size_bytes() - small.size_bytes() == 99
