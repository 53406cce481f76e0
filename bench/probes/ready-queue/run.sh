#!/bin/bash
# The ready-queue probe (bench/README.md, "A ready-queue table, simulated"): PostgreSQL's own
# time for the write set of 20 000 task lifecycles (claim, dispatch renewal, settle; batches of
# BATCH, each step its own transaction) in the current schema (design a) and with a ready-queue
# table and an insert-only terminal table in place of `tasks_acquire` and `tasks_retention`
# (design b). Everything runs inside PostgreSQL (PL/pgSQL procedures in drain.sql), so the
# numbers are the executor's and the storage's, without a server or a driver.
#
# Usage: PGHOST=127.0.0.1 PGPORT=5432 PGUSER=postgres PGPASSWORD=... bench/probes/ready-queue/run.sh [BATCH]
# Creates (and drops first) the databases probe_ready_a and probe_ready_b on that server.
set -euo pipefail
# Stop at the first SQL error, and keep PostgreSQL's notices (a dropped database that did not
# exist, a truncated identifier) off the output.
export PSQL_OPTS="-X -v ON_ERROR_STOP=1" PGOPTIONS="-c client_min_messages=warning"
here=$(cd "$(dirname "$0")" && pwd)
migrations="$here/../../../packages/store-postgres/drizzle"
batch=${1:-32}
for design in a b; do
  db=probe_ready_$design
  psql $PSQL_OPTS -q -d postgres -c "drop database if exists $db" -c "create database $db"
  for m in "$migrations"/0*.sql; do psql $PSQL_OPTS -q -d "$db" -f "$m" >/dev/null; done
  if [ "$design" = b ]; then psql $PSQL_OPTS -q -d "$db" -f "$here/design-b.sql"; fi
  psql $PSQL_OPTS -q -d "$db" -f "$here/drain.sql"
done
run() {
  local design=$1 round=$2 db=probe_ready_$1
  psql $PSQL_OPTS -qAt -d "$db" -c "call sim_submit('$design', 20000, $round)"
  psql $PSQL_OPTS -qAt -d "$db" -c "vacuum analyze" -c "checkpoint"
  psql $PSQL_OPTS -qAt -d "$db" <<SQL
set synchronous_commit = off;
select pg_current_wal_lsn() as l0 \gset
select extract(epoch from clock_timestamp()) as t0 \gset
call sim_drain('$design', $batch);
select extract(epoch from clock_timestamp()) as t1 \gset
select pg_current_wal_lsn() as l1 \gset
select 'design $design, batch $batch, round $round: '
  || round(((:t1 - :t0) * 1000000 / 20000)::numeric, 1) || ' µs per task, WAL '
  || round(pg_wal_lsn_diff(:'l1', :'l0') / 20000) || ' B per task';
SQL
}
# Alternating; each round adds 20 000 tasks to those the rounds before left (as a running
# system keeps its terminal tasks and their history), and round 1 is the warm-up: until a drain
# has filled `attempts`, the planner works from the statistics of an empty table.
for round in 1 2 3 4; do
  if [ "$round" = 1 ]; then echo "-- round 1 (warm-up)"; else echo "-- round $round"; fi
  run a "$round"
  run b "$round"
done
