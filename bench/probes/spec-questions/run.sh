#!/bin/bash
# The spec-questions probe (bench/README.md, "The two spec questions, measured"): what the two
# protocol changes issue 7 left to the people steering the project would be worth, measured
# with prototypes that are not part of Ledgence:
#   1. the dispatch grant made by the claim itself (against DESIGN §4.1 "Fresh authority"): the
#      SDK then starts the handler without a dispatch renewal — one HTTP leg and one transaction
#      less per task;
#   2. a wave's settlements and the same slots' next polls in one request (a route DESIGN §6
#      does not have): one HTTP leg less per wave, in two transactions or in one.
# It checks out the commit the prototype was written against into a temporary worktree, applies
# prototype.patch there (never to this checkout), builds it, and runs
#   - the benchmark's own strict and batched drains and pickups idle and under load (Ledgence
#     only, the real SDK), with the grant at claim off and on, alternating, PAIRS times;
#   - wave.mjs, a 32-slot strict drain over raw HTTP in 3 requests per wave (today's protocol),
#     2 (settle + next poll in one request, two transactions) and 2 in one transaction, with the
#     grant off and on, alternating, PAIRS times.
# SKIP_BENCH=1 runs only the wave part (a quick check that the probe still works).
#
# Usage: DATABASE_URL=postgres://… bench/probes/spec-questions/run.sh [PAIRS] [TASKS]
# Needs pnpm on PATH (as `pnpm bench` does), curl, and ~30 min for the defaults (2, 20 000).
# The server named by DATABASE_URL gets the databases bench_* (the benchmark's) and probe_waves.
set -euo pipefail
: "${DATABASE_URL:?set DATABASE_URL to a PostgreSQL server this probe may create databases on}"
command -v pnpm >/dev/null || { echo "pnpm is not on PATH (the README's setup installs it)" >&2; exit 1; }
pairs=${1:-2}
tasks=${2:-20000}
base=4bdef809b7872a679515a98e914db97cdc070ff6
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
tree=$(mktemp -d /tmp/ledgence-spec-probe.XXXXXX)
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
  git -C "$repo" worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
}
trap cleanup EXIT
echo "worktree $tree at $base, with prototype.patch"
git -C "$repo" worktree add --detach --quiet "$tree" "$base"
git -C "$tree" apply "$here/prototype.patch"
(cd "$tree" && pnpm install --frozen-lockfile --silent && pnpm build >/dev/null)

for pair in $(seq 1 "$pairs"); do
  [ "${SKIP_BENCH:-0}" = 1 ] && break
  for grant in 0 1; do
    echo "== benchmark, grant at claim $grant (pair $pair)"
    (cd "$tree" && LEDGENCE_PROTO_GRANT_AT_CLAIM=$grant pnpm --silent --filter @ledgence/bench bench \
      -- --only strict,batched,pickup,pickupload --systems ledgence --reps 1 2>&1 |
      grep -E '^\[.{8}\] (rep [0-9]+/[0-9]+ · |  ledgence:)' | sed -E 's/^\[.{8}\] +//')
  done
done

db_url=$(node -e 'const u = new URL(process.argv[1]); u.pathname = "/probe_waves"; console.log(u.href)' "$DATABASE_URL")
node --input-type=module -e '
  const url = new URL(process.argv[1]);
  const { default: postgres } = await import(process.argv[2]);
  const sql = postgres(url.href, { onnotice: () => {} });
  await sql`drop database if exists probe_waves`;
  await sql`create database probe_waves`;
  await sql.end();
' "$DATABASE_URL" "$tree/packages/store-postgres/node_modules/postgres/src/index.js"
port=18790
for pair in $(seq 1 "$pairs"); do
  for grant in 0 1; do
    for mode in 3 2 1; do
      LEDGENCE_PROTO_GRANT_AT_CLAIM=$grant LEDGENCE_LOG_LEVEL=warn DATABASE_URL=$db_url PORT=$port \
        node "$tree/apps/server/dist/main.js" >/dev/null 2>&1 &
      server=$!
      for _ in $(seq 1 150); do
        curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
        kill -0 "$server" 2>/dev/null || { echo "the prototype server exited" >&2; exit 1; }
        sleep 0.2
      done
      printf 'waves, grant at claim %s: ' "$grant"
      node "$here/wave.mjs" "http://127.0.0.1:$port" "$mode" "$tasks" "$server"
      kill "$server"
      wait "$server" 2>/dev/null || true
      server=
    done
  done
done
