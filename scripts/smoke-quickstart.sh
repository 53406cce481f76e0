#!/usr/bin/env bash
# The README's quick start, as a user runs it: `pnpm start` with no configuration (embedded
# PostgreSQL in a fresh folder), then the example worker and client. Fails unless /healthz
# answers, the client prints three succeeded tasks, and the server stops on SIGTERM.
set -uo pipefail
cd "$(dirname "$0")/.."
data=$(mktemp -d)
# As root, PostgreSQL runs as the postgres user, which must be able to enter the folder.
chmod 755 "$data"
port=${SMOKE_PORT:-18080}
log="$data/server.log"
url="http://127.0.0.1:$port"

# setsid: one process group for pnpm, its shell and the server, so cleanup reaches all three.
LEDGENCE_DATA_DIR="$data/pg" PORT=$port setsid pnpm start >"$log" 2>&1 &
group=$!
cleanup() {
  kill -TERM -- "-$group" 2>/dev/null
  for _ in $(seq 1 40); do kill -0 -- "-$group" 2>/dev/null || break; sleep 0.25; done
  kill -KILL -- "-$group" 2>/dev/null
  rm -rf "$data"
}
trap cleanup EXIT

for _ in $(seq 1 240); do
  curl -fsS -m 1 "$url/healthz" >/dev/null 2>&1 && break
  kill -0 "$group" 2>/dev/null || { echo "pnpm start exited early:"; tail -20 "$log"; exit 1; }
  sleep 0.5
done
if ! curl -fsS -m 2 "$url/healthz"; then echo "no /healthz answer:"; tail -20 "$log"; exit 1; fi
echo
grep -v '^{' "$log" | grep -E 'listening|database|mode' || true

LEDGENCE_URL=$url timeout 60 node examples/quickstart/worker.mjs >"$data/worker.log" 2>&1 &
worker=$!
out=$(LEDGENCE_URL=$url timeout 60 node examples/quickstart/client.mjs)
status=$?
kill -INT "$worker" 2>/dev/null
wait "$worker" 2>/dev/null
echo "$out"
succeeded=$(grep -c '"state":"succeeded"' <<<"$out")
if [ $status -ne 0 ] || [ "$succeeded" -ne 3 ]; then
  echo "the quick start client did not see three succeeded tasks (exit $status)"
  tail -20 "$data/worker.log"
  exit 1
fi
echo "quick start ok: /healthz answered and 3 tasks succeeded"
