# One entry point for everything. Each target installs what it needs into .venv itself.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
# `make test` runs the suite in TEST_WORKERS processes (pytest-xdist), whole files to a worker
# so a module's cluster or Spark session stays in one process: most tests wait on real daemons
# or Spark rather than compute (one process: 15 min on 2 cores, 6 min of it CPU; two: 8 min).
TEST_WORKERS ?= 2
PYTEST_ARGS ?= -n $(TEST_WORKERS) --dist loadfile

.PHONY: install install-bench test check fmt demo chaos bench bench-raft bench-catalog bench-gc bench-scale bench-spark bench-tls bench-snapmem bench-wal bench-raft-latency bench-ddl bench-apply bench-gc-pause bench-loop-stall sim upgrade-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install-bench: install
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'

## check: lint, format check, typing (strict on the core packages hlc, raft, metastore)
check: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy hlc raft metastore cli spark_bridge bench

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## test: the whole suite (lint + types + every test). This is what CI runs.
test: check
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## sim: the seeded Raft simulation with more seeds than make test runs (EXTENDED_SEEDS: also
## with power losses and stale replays; tests/raft/simulation.py)
SEEDS ?= 5000
EXTENDED_SEEDS ?= $(SEEDS)
sim: install
	$(BIN)/python -m pytest tests/raft/test_simulation.py --sim-seeds=$(SEEDS) --sim-extended-seeds=$(EXTENDED_SEEDS) -q

## chaos: seeded fault schedules against real daemons (docs/chaos.md); make chaos SEEDS=1,2 DURATION=120
## (FAULTS=process|network|overlap|client|member|all picks the family of faults, or one fault alone, e.g. FAULTS=skew_leader; all by default;
## TLS=1 runs the nodes with mutual TLS between peers and TLS on the client ports)
DURATION ?= 60
FAULTS ?= all
TLS ?= 0
CHAOS_SEED_LIST = $(if $(filter command line environment,$(origin SEEDS)),$(SEEDS),1,2,3)
chaos: install
	CHAOS_SEEDS=$(CHAOS_SEED_LIST) CHAOS_DURATION_S=$(DURATION) CHAOS_FAULTS=$(FAULTS) CHAOS_TLS=$(TLS) $(BIN)/python -m pytest tests/chaos -q -s

## upgrade-check: a rolling upgrade from the release FROM (a git revision, e.g. FROM=10532c2) to
## this tree on real daemons: answers compared on every node after each step (README, "Rolling
## upgrades"; tests/upgrade/upgrade_check.py). Not part of make test: a shallow clone lacks FROM
upgrade-check: install
	@test -n "$(FROM)" || { echo "usage: make upgrade-check FROM=<git revision>, e.g. FROM=10532c2" >&2; exit 2; }
	$(BIN)/python -m tests.upgrade.upgrade_check --from "$(FROM)" $(UPGRADE_ARGS)

## bench: bench-raft, bench-catalog and bench-spark; each prints a table and writes JSON under bench/results/
bench: bench-raft bench-catalog bench-spark

## bench-raft: our engine against pysyncobj, same workload, same run
bench-raft: install-bench
	$(BIN)/python -m bench.bench_raft

## bench-catalog: schema reads/s, read latency, safe-time waits and DDL latency of the daemon;
## then its lease section: lease churn, heartbeat cost, DDL latency with leases held
bench-catalog: install
	$(BIN)/python -m bench.bench_catalog
	$(BIN)/python -m bench.bench_leases
	$(BIN)/python -m bench.bench_gc

## bench-gc: protect+release latency and throughput, files deleted/s, snapshot size after GC
bench-gc: install
	$(BIN)/python -m bench.bench_gc

## bench-scale: one table to 1M files in commits of 1,000: commit latency, RSS, snapshot take and
## install, files and planning at 1M (BENCH_ARGS=--quick: 100k files)
bench-scale: install
	$(BIN)/python -m bench.bench_scale $(BENCH_ARGS)

## bench-snapmem: heap of the leader and a follower while a large snapshot is sent and installed,
## in copies of the state (BENCH_ARGS=--state-mb 512)
bench-snapmem: install
	$(BIN)/python -m bench.bench_snapshot_memory $(BENCH_ARGS)

## bench-raft-latency: lone-proposal latency, ours and pysyncobj interleaved round by round (BENCH_ARGS)
bench-raft-latency: install-bench
	$(BIN)/python -m bench.bench_raft_latency $(BENCH_ARGS)

## bench-wal: one synced WAL append in 3 processes at once, zeros written ahead or not (BENCH_ARGS)
bench-wal: install
	$(BIN)/python -m bench.bench_wal_sync $(BENCH_ARGS)

## bench-ddl: CPU one DDL statement costs the node that parses it, up to the costliest the limits allow (BENCH_ARGS)
bench-ddl: install
	$(BIN)/python -m bench.bench_ddl_parse $(BENCH_ARGS)

## bench-apply: time one node's event loop spends applying the largest commit, into tables of
## 0, 100k and 1M files (adds and overwrites; in-process, no cluster) (BENCH_ARGS=--profile)
bench-apply: install
	$(BIN)/python -m bench.bench_apply $(BENCH_ARGS)

## bench-gc-pause: the garbage collector's pauses while one table grows to 1M files (in-process),
## its default settings against the node process's frozen heap (BENCH_ARGS=--quick)
bench-gc-pause: install
	$(BIN)/python -m bench.bench_gc_pause $(BENCH_ARGS)

## bench-loop-stall: the worst event-loop turn of a snapshot (on the loop, view + thread), the
## refreeze after it and the largest overwrite, at the loose-entry bound (BENCH_ARGS=--quick)
bench-loop-stall: install
	$(BIN)/python -m bench.bench_loop_stall $(BENCH_ARGS)

## bench-spark: the bridge's per-micro-batch overhead vs plain foreachBatch; commits/s
bench-spark: install
	$(BIN)/python -m bench.bench_spark

## bench-tls: commit latency and connection setup with and without TLS, same run (BENCH_ARGS)
bench-tls: install
	$(BIN)/python -m bench.bench_tls $(BENCH_ARGS)

## demo: a local 3-node cluster feeding a Spark Structured Streaming pipeline (about a minute)
demo: install
	$(BIN)/python -m spark_bridge.demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
