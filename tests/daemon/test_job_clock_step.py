"""`job_show` says a job is `finished` (its last version in force on every node) only once the
true time has passed that version's Tu + CSmax, even when the answering node's wall clock has
just stepped forward (an NTP step, chaos fault `skew_leader`; until its peers prove the offset
and it fences itself).

`metastore job wait` (and `metastore sql` on an ALTER that starts a job) follows `job_show`
until `waiting_for.reason` is `finished` and then tells the user the change is in force on
every node. Judged by a clock that had just jumped 2 s ahead, the node said so at once, and a
read at now on a node with a right clock still showed the version before the job's last step
(the DDL reply had the same fault and was fixed with metastore/daemon/clock_steps.py: the node
vouches only for the clock as it read before a recent step)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hlc import physical_ms
from metastore.daemon.node import FAULT_CLOCK_OFFSET_FILE_ENV
from tests.daemon.harness import RawClient, metastore_cluster
from tests.daemon.test_ddl_clock_step import _wait_for_clock_ahead

pytestmark = pytest.mark.slow

# A long DD, so the step and the reads fit well inside the last version's activation window
# whatever the machine's load.
DD_MS = 1_500
CS_MAX_MS = 100
STEP_MS = 2_000
WAIT_S = 30.0


def _job(client: RawClient, job_id: int) -> dict[str, object]:
    reply = client.call("job_show", job_id=job_id)
    assert reply["ok"], reply
    result = reply["result"]
    assert isinstance(result, dict)
    return result


def test_a_clock_stepped_forward_does_not_make_a_job_look_finished_early(tmp_path: Path) -> None:
    clock_file = tmp_path / "clock-offset"
    with metastore_cluster(tmp_path / "c", 1, dd_ms=DD_MS, cs_max_ms=CS_MAX_MS) as c:
        c.start(1, env={FAULT_CLOCK_OFFSET_FILE_ENV: str(clock_file)})
        c.wait_ready()
        admin = c.client(1)
        try:
            for sql in ("CREATE NAMESPACE s", "CREATE TABLE s.t (a INT, b INT)"):
                assert admin.call("ddl", sql=sql, timeout_ms=30_000)["ok"]
            started = admin.call("ddl", sql="ALTER TABLE s.t DROP COLUMN b", timeout_ms=30_000)
            assert started["ok"], started
            job_id = int(started["result"]["job_id"])
            # The worker publishes the last step (dropped) as soon as write-only is active; the
            # job has then succeeded, and its last version activates DD later.
            deadline = time.monotonic() + WAIT_S
            while (job := _job(admin, job_id))["status"] != "succeeded":
                assert time.monotonic() < deadline, f"the job did not end: {job}"
                time.sleep(0.05)
            versions = job["versions"]
            assert isinstance(versions, list)
            history = admin.call("history", table="s.t")
            assert history["ok"], history
            last = next(v for v in history["result"]["versions"] if v["version"] == versions[-1])
            in_force_ms = physical_ms(int(last["tu"])) + CS_MAX_MS
            clock_file.write_text(f"{STEP_MS}\n")
            _wait_for_clock_ahead(c, 1, STEP_MS // 2)
            job = _job(admin, job_id)
            asked_ms = time.time() * 1000  # this process's clock is the true one
            waiting = job["waiting_for"]
            assert isinstance(waiting, dict)
            assert asked_ms < in_force_ms, "too slow to test: the version is in force already"
            assert waiting["reason"] == "activation", (
                f"job_show said {waiting['reason']!r} {in_force_ms - asked_ms:.0f} ms before "
                f"its last version's Tu + CSmax: {waiting}"
            )
            # It does get there, once the true time has passed Tu + CSmax.
            while (job := _job(admin, job_id))["waiting_for"]["reason"] != "finished":  # type: ignore[index]
                assert time.monotonic() < deadline, f"the job never finished: {job}"
                time.sleep(0.05)
            assert time.time() * 1000 >= in_force_ms
        finally:
            admin.close()
