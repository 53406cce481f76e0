/**
 * Micro-benchmark behind the "no property added after a spread" rule of the hot paths
 * (bench/README.md, "Objects built by spread"): builds the same 22-field attempt record from a
 * database row three ways, in one process run, and prints ns per record.
 *
 *   pnpm --filter @ledgence/bench micro:spread
 *
 * On Node 20 (V8 11.3) an object literal that adds properties after a spread takes V8's slow
 * path for every added property; a spread that only overrides existing properties does not.
 */
import { performance } from 'node:perf_hooks';

type Row = Record<string, unknown>;

const num = (value: unknown): number => (typeof value === 'number' ? value : Number(value));

/** A row as postgres.js returns it: bigint columns as strings. */
const row: Row = {
  tenant_id: 'acme',
  namespace: 'prod',
  task_id: 'tsk_01JDZ8Q8Q5V1W2X3Y4Z5A6B7C8',
  attempt_id: 'att_01JDZ8Q8Q5V1W2X3Y4Z5A6B7C9',
  lease_id: 'lse_01JDZ8Q8Q5V1W2X3Y4Z5A6B7CA',
  generation: 1,
  worker_session_id: 'ses_01JDZ8Q8Q5V1W2X3Y4Z5A6B7CB',
  consumer_id: 7,
  ordinal: 1,
  state: 'succeeded',
  claimed_at: '1764480000000',
  deadline: '1764480300000',
  authority_deadline: '1764480300000',
  lease_expires_at: '1764480030000',
  renew_sequence: '1',
  last_renewal: null,
  dispatch_allowed: true,
  quiescence: 'confirmed',
  settlement: null,
  settlement_digest: 'sha256:0',
  pending: null,
  finished_at: '1764480001000',
};

function identityOf(r: Row) {
  return {
    tenant_id: String(r.tenant_id),
    namespace: String(r.namespace),
    task_id: String(r.task_id),
    attempt_id: String(r.attempt_id),
    lease_id: String(r.lease_id),
    generation: num(r.generation),
    worker_session_id: String(r.worker_session_id),
    consumer_id: num(r.consumer_id),
  };
}

const builders: Record<string, (r: Row) => Record<string, unknown>> = {
  /** The shape `attemptFromDb` had: 8 fields, spread, then 14 added. */
  'spread, then 14 fields added': (r) => ({
    ...identityOf(r),
    ordinal: num(r.ordinal),
    state: r.state,
    claimed_at: num(r.claimed_at),
    deadline: num(r.deadline),
    authority_deadline: num(r.authority_deadline),
    lease_expires_at: num(r.lease_expires_at),
    renew_sequence: num(r.renew_sequence),
    last_renewal: r.last_renewal,
    dispatch_allowed: Boolean(r.dispatch_allowed),
    quiescence: r.quiescence,
    settlement: r.settlement,
    settlement_digest: r.settlement_digest,
    pending: r.pending,
    finished_at: num(r.finished_at),
  }),
  /** What it is now: every field spelled out. */
  'every field spelled out': (r) => {
    const identity = identityOf(r);
    return {
      tenant_id: identity.tenant_id,
      namespace: identity.namespace,
      task_id: identity.task_id,
      attempt_id: identity.attempt_id,
      lease_id: identity.lease_id,
      generation: identity.generation,
      worker_session_id: identity.worker_session_id,
      consumer_id: identity.consumer_id,
      ordinal: num(r.ordinal),
      state: r.state,
      claimed_at: num(r.claimed_at),
      deadline: num(r.deadline),
      authority_deadline: num(r.authority_deadline),
      lease_expires_at: num(r.lease_expires_at),
      renew_sequence: num(r.renew_sequence),
      last_renewal: r.last_renewal,
      dispatch_allowed: Boolean(r.dispatch_allowed),
      quiescence: r.quiescence,
      settlement: r.settlement,
      settlement_digest: r.settlement_digest,
      pending: r.pending,
      finished_at: num(r.finished_at),
    };
  },
  /** A transition's shape (`{ ...attempt, state, … }`): a spread that only overrides. */
  'spread, then 3 fields overridden': (r) => ({
    ...r,
    ordinal: num(r.ordinal),
    claimed_at: num(r.claimed_at),
    finished_at: num(r.finished_at),
  }),
  /** The same three fields added to a fresh 8-field object. */
  'spread, then 3 fields added': (r) => ({
    ...identityOf(r),
    ordinal: num(r.ordinal),
    claimed_at: num(r.claimed_at),
    finished_at: num(r.finished_at),
  }),
};

const CALLS = 200_000;
const ROUNDS = 5;

function nsPerCall(build: (r: Row) => Record<string, unknown>): number {
  let keep = 0;
  const started = performance.now();
  for (let i = 0; i < CALLS; i++) keep += num(build(row).consumer_id);
  const elapsed = performance.now() - started;
  if (keep === 0) throw new Error('unreachable: keeps the calls from being optimised away');
  return (elapsed * 1e6) / CALLS;
}

const results = new Map<string, number[]>();
for (let round = 0; round < ROUNDS; round++) {
  for (const [name, build] of Object.entries(builders)) {
    results.set(name, [...(results.get(name) ?? []), nsPerCall(build)]);
  }
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
console.log(`Node ${process.version} (V8 ${process.versions.v8}), ${CALLS} records × ${ROUNDS}`);
console.log('| builder | ns per record (median) |');
console.log('| --- | --- |');
for (const [name, xs] of results) console.log(`| ${name} | ${median(xs).toFixed(0)} |`);
