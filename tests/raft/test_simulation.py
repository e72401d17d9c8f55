"""The seeded simulation of the Raft core (see `tests/raft/simulation.py` for what it checks).

One test per seed: `make test` runs `--sim-seeds` (default 500) seeds from `--sim-seed-start`
(default 0); `make sim SEEDS=5000` runs more. A failing seed prints the command that replays it.
The other tests here show that the checker does catch broken states, and that a failure report
carries the seed, the replay command and the trace.
"""

from __future__ import annotations

import dataclasses

import pytest

from raft.core.memnet import Applied, MemDisk, MemNode
from raft.core.ready import CoreConfig, Role
from raft.core.types import ConfState, Entry, EntryKind, HardState
from tests.raft.simulation import (
    Checker,
    InvariantViolation,
    SimParams,
    Simulation,
    SimulationFailure,
    replay_command,
    run_seed,
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    start = int(metafunc.config.getoption("--sim-seed-start"))
    if "sim_seed" in metafunc.fixturenames:
        count = int(metafunc.config.getoption("--sim-seeds"))
        metafunc.parametrize("sim_seed", range(start, start + count), ids=lambda s: f"seed{s}")
    if "sim_extended_seed" in metafunc.fixturenames:
        count = int(metafunc.config.getoption("--sim-extended-seeds"))
        metafunc.parametrize(
            "sim_extended_seed", range(start, start + count), ids=lambda s: f"seed{s}"
        )


def test_seed(sim_seed: int) -> None:
    run_seed(sim_seed)


def test_extended_seed(sim_extended_seed: int) -> None:
    """The same seed with the extended faults: power losses and stale replays."""
    run_seed(sim_extended_seed, extended=True)


# ---- the simulation itself ----------------------------------------------------------------


def test_same_seed_same_run() -> None:
    first, second = run_seed(11), run_seed(11)
    assert first == second
    assert first.committed > 0


def test_seeds_cover_both_cluster_sizes_and_faults() -> None:
    """A few seeds must actually exercise what the simulation claims to: elections, commits,
    acknowledged proposals, crashes, snapshots and membership changes."""
    totals: dict[str, int] = {}
    sizes = set()
    for seed in range(40):
        sizes.add(SimParams.for_seed(seed).nodes)
        for key, value in run_seed(seed).stats.items():
            totals[key] = totals.get(key, 0) + value
    assert sizes == {3, 5}
    for key in ("acked", "crashes", "crash_before_persist", "snapshots_installed"):
        assert totals.get(key, 0) > 0, key
    assert totals.get("conf_changes", 0) > 0
    assert totals.get("leader_self_removals", 0) > 0
    assert totals.get("removals_to_one_voter", 0) > 0
    assert totals.get("reads_served", 0) > 0


class _Sabotaged(Simulation):
    """Breaks election safety at one step, as a buggy core would."""

    def step(self) -> set[int]:
        touched = super().step()
        if self.step_no == 120:
            a, b = self.nodes[1].core, self.nodes[2].core
            b.term = a.term = max(a.term, b.term)
            a.role = b.role = Role.LEADER
            touched |= {1, 2}
        return touched


def test_failure_report_names_seed_replay_command_and_trace() -> None:
    sim = _Sabotaged(SimParams.for_seed(5))
    with pytest.raises(SimulationFailure) as info:
        sim.run()
    text = str(info.value)
    assert "seed 5" in text
    assert "election safety" in text
    assert replay_command(5) in text
    assert "--sim-seeds=1 --sim-seed-start=5 -x" in text
    assert "--sim-seeds=0 --sim-extended-seeds=1 --sim-seed-start=5 -x" in replay_command(
        5, extended=True
    )
    assert text.count("\n    ") >= 20  # the trace of the last events
    assert info.value.seed == 5


# ---- the checker catches each kind of broken state -----------------------------------------


def _node(node_id: int, disk: MemDisk | None = None) -> MemNode:
    return MemNode(CoreConfig(node_id=node_id), ConfState(voters=(1, 2, 3)), seed=1, disk=disk)


def _disk(*entries: tuple[int, int, int, bytes], commit: int = 0) -> MemDisk:
    log = [Entry(index=i, term=t, tm=tm, kind=EntryKind.NORMAL, data=d) for i, t, tm, d in entries]
    term = log[-1].term if log else 0
    return MemDisk(hard_state=HardState(term=term, commit=commit), entries=log)


def test_checker_catches_different_entries_at_same_index_and_term() -> None:
    checker = Checker()
    checker.check_node(_node(1, _disk((1, 1, 10, b"a"), (2, 1, 20, b"b"))))
    with pytest.raises(InvariantViolation, match="log matching"):
        checker.check_node(_node(2, _disk((1, 1, 10, b"a"), (2, 1, 20, b"X"))))


def test_checker_catches_different_prefix_under_same_index_and_term() -> None:
    checker = Checker()
    checker.check_node(_node(1, _disk((1, 1, 10, b"a"), (2, 2, 20, b"b"))))
    with pytest.raises(InvariantViolation, match="log matching"):
        # Same entry 2/2, but it follows 1/2 here and 1/1 there.
        checker.check_node(_node(2, _disk((1, 2, 10, b"z"), (2, 2, 20, b"b"))))


def test_checker_catches_two_commits_of_one_index() -> None:
    checker = Checker()
    checker.check_node(_node(1, _disk((1, 1, 10, b"a"), commit=1)))
    with pytest.raises(InvariantViolation, match="state-machine safety"):
        checker.check_node(_node(2, _disk((1, 2, 10, b"b"), commit=1)))


def test_checker_catches_two_leaders_in_one_term() -> None:
    checker = Checker()
    nodes = [_node(1), _node(2)]
    for n in nodes:
        n.core.term = 3
        n.core.role = Role.LEADER
    with pytest.raises(InvariantViolation, match="election safety"):
        checker.check_leaders(nodes)


def test_checker_catches_leader_missing_a_committed_entry() -> None:
    checker = Checker()
    checker.check_node(_node(1, _disk((1, 1, 10, b"a"), commit=1)))
    leader = _node(2, _disk())
    leader.core.term = 2
    leader.core.role = Role.LEADER
    with pytest.raises(InvariantViolation, match="leader completeness"):
        checker.check_leaders([leader])


def test_checker_catches_diverging_state_machines() -> None:
    checker = Checker()
    a = _node(1, _disk((1, 1, 10, b"a"), commit=1))
    b = _node(2, _disk((1, 1, 10, b"a"), commit=1))
    for n in (a, b):
        n.handle_ready()  # both apply entry 1
    b.applied[0] = Applied(index=1, term=1, tm=10, data=b"not what was committed")
    checker.check_node(a)
    with pytest.raises(InvariantViolation, match="state-machine safety"):
        checker.check_node(b)


def test_checker_catches_safe_time_going_back() -> None:
    checker = Checker()
    node = _node(1, _disk((1, 1, 10, b"a"), commit=1))
    node.handle_ready()  # applies entry 1: safe time 10
    checker.check_node(node)
    node.crash()  # restarted, but not yet replayed: safe time is the snapshot's (0)
    with pytest.raises(InvariantViolation, match="safe time"):
        checker.check_node(node)


def test_checker_catches_lost_acknowledged_proposal() -> None:
    checker = Checker()
    node = _node(1, _disk((1, 1, 10, b"a"), commit=1))
    node.handle_ready()
    checker.check_node(node)
    checker.acknowledge(node, 1, 1, b"a")
    checker.state_machine_caught_up(node)
    node.applied = []  # a state machine that forgot it
    with pytest.raises(InvariantViolation, match="acknowledged proposal lost"):
        checker._check_acks_on(node)


def test_seed_621_a_stale_answer_of_a_higher_term_ended_a_followers_lease() -> None:
    """A follower in its leader's lease took the term of a stale rejection of its own earlier
    pre-vote, dropped its leader, and granted the next pre-vote at once (the check-quorum lease
    check; tests/raft/test_core_lease.py has the unit case)."""
    run_seed(621)


def test_extended_seeds_50_and_57_a_capped_heartbeat_made_a_node_ready_after_a_power_loss() -> None:
    """A follower whose last acknowledgement was lost learnt the commit index from an empty
    append and applied it; a power loss took that commit index (written without fsync), and the
    first message after its restart was a heartbeat, whose commit is capped at the leader's
    stale match for it: it reported caught up at an older safe time than it had served
    (tests/raft/test_restart_readiness.py has the unit case)."""
    for seed in (50, 57):
        params = dataclasses.replace(
            SimParams.for_seed(seed, extended=True), early_apply=False, one_way_cuts=False
        )
        assert Simulation(params).run().stats.get("power_losses", 0) > 0


def test_seed_79_a_crash_after_an_early_apply_made_a_node_ready_below_what_it_served() -> None:
    """No power loss needed: the driver applies committed entries already durable before a
    Ready's write and serves at that safe time during it; a kill -9 before the write restarts
    the node with the commit index before it, and a capped heartbeat made it ready there."""
    params = dataclasses.replace(
        SimParams.for_seed(79, extended=True),
        power_loss=False,
        stale_replays=False,
        one_way_cuts=False,
    )
    assert Simulation(params).run().stats.get("early_apply_crashes", 0) > 0


def test_the_served_safe_time_check_catches_a_core_that_forgets_its_log_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raft.core.raft import RaftCore

    built = RaftCore.__init__

    def forgetful(self: RaftCore, *args: object, **kwargs: object) -> None:
        built(self, *args, **kwargs)  # type: ignore[arg-type]
        self._start_last_index = 0

    monkeypatch.setattr(RaftCore, "__init__", forgetful)
    params = dataclasses.replace(
        SimParams.for_seed(50, extended=True), early_apply=False, one_way_cuts=False
    )
    with pytest.raises(SimulationFailure, match="served safe time monotonic"):
        Simulation(params).run()


def test_convergence_needs_every_member_ready_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restarted node that never reports caught up again is a liveness failure, even when
    its log converged (a readiness rule that waits for what never comes)."""
    from raft.core.raft import RaftCore

    built = RaftCore.__init__

    def never_ready_after_restart(self: RaftCore, *args: object, **kwargs: object) -> None:
        built(self, *args, **kwargs)  # type: ignore[arg-type]
        if self.log.last_index() > 0:
            self._start_last_index = 1 << 40

    monkeypatch.setattr(RaftCore, "__init__", never_ready_after_restart)
    with pytest.raises(SimulationFailure, match="liveness"):
        run_seed(2)


def test_the_snapshot_check_catches_a_core_that_adopts_an_older_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A background snapshot finished after a newer one (a leader's, or a later own one) must
    not replace it. Only the background-snapshot fault reaches this: classic compactions are
    atomic (seeds 0-199 pass with this broken core)."""
    from raft.core.raft import RaftCore
    from raft.core.types import Snapshot

    compact = RaftCore.compact_log

    def adopts_any(self: RaftCore, snapshot: Snapshot, *, keep_entries: int = 0) -> None:
        self.snapshot = snapshot  # the guard against an older snapshot is gone
        if snapshot.meta.index - keep_entries > self.log.snapshot.index:
            compact(self, snapshot, keep_entries=keep_entries)

    monkeypatch.setattr(RaftCore, "compact_log", adopts_any)
    with pytest.raises(SimulationFailure, match="snapshot coverage"):
        run_seed(14, extended=True)


def test_extended_faults_happen_and_classic_seeds_keep_their_schedule() -> None:
    totals: dict[str, int] = {}
    for seed in range(20):
        for key, value in run_seed(seed, extended=True).stats.items():
            totals[key] = totals.get(key, 0) + value
    assert totals.get("power_losses", 0) > 0
    assert totals.get("stale_replays", 0) > 0
    assert totals.get("early_apply_crashes", 0) > 0
    assert totals.get("one_way_cuts", 0) > 0
    assert totals.get("background_snapshots", 0) > 0
    assert not SimParams.for_seed(3).extended
    assert "power_losses" not in run_seed(3).stats


def test_checker_catches_served_safe_time_going_back() -> None:
    """A node that reported caught up at safe time S must not report caught up below S later
    (after a power loss its raw safe time may go back; what it serves may not)."""
    checker = Checker()
    node = _node(1, _disk((1, 1, 10, b"a"), (2, 1, 20, b"b"), commit=2))
    node.handle_ready()
    node.core.leader = 2
    node.core.term = 1
    node.core._catch_up_floor = 0
    assert node.core.caught_up()
    checker.check_node(node)
    node.disk.hard_state = HardState(term=1, commit=1)  # the power loss
    node.crash()
    node.handle_ready()
    checker.forget_safe_time(node)
    checker.check_node(node)  # not caught up: nothing served, nothing to check
    node.core.leader = 2
    node.core._catch_up_floor = 0
    node.core._start_last_index = 0  # a core that forgets what it had before its restart
    assert node.core.caught_up() and node.core.applied_tm == 10
    with pytest.raises(InvariantViolation, match="served safe time monotonic"):
        checker.check_node(node)


def test_the_lease_check_catches_a_core_that_votes_within_its_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raft.core.raft import RaftCore

    monkeypatch.setattr(RaftCore, "_in_lease", lambda self: False)
    assert SimParams.for_seed(5).check_quorum
    with pytest.raises(SimulationFailure, match="check-quorum lease"):
        run_seed(5)
