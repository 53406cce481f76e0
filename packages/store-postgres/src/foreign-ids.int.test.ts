/**
 * Foreign ids against the PostgreSQL store (DESIGN §6: "a task that exists in another tenant is
 * indistinguishable from one that does not"). Every store operation that takes an id is called
 * from another tenant and from another namespace of the same tenant, once with the victim's real
 * ids and once with ids that exist nowhere: the two must fail with the same error (code, reason,
 * path, and message once the id it quotes is set aside), and the whole database, every scope of
 * it, must come out byte for byte as it went in. The HTTP edge replaces a message quoting the id
 * by a fixed sentence, so a store message that said anything more about a foreign row would
 * reach the client unscrubbed; this is where such a difference would begin.
 *
 * scope-collision.int.test.ts covers the other direction (operations that succeed in one scope
 * never touch colliding rows of another); tenancy.int.test.ts in apps/server covers the status
 * codes over HTTP.
 */
import type {
  Assignment,
  LeaseOwner,
  RetentionPolicy,
  RetentionPreview,
  Scope,
  SettleCommand,
} from '@ledgence/contracts';
import { ContractError, MIN_RETENTION_MS } from '@ledgence/contracts';
import { type ItemResult, lifecycleConfig } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireCommand,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  SCOPED_TABLES,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

const VICTIM: Scope = SCOPE;
const OTHER_TENANT: Scope = { tenant_id: 'intruder', namespace: SCOPE.namespace };
const OTHER_NAMESPACE: Scope = { tenant_id: SCOPE.tenant_id, namespace: 'intruder-ns' };

// Leases and sessions that outlive the probes, so a foreign renew or extension that slipped
// through would succeed (and show in the dump) instead of failing for a reason of its own.
const LONG = lifecycleConfig({
  leaseDurationMs: 600_000,
  cleanupGraceMs: 600_000,
  sessionValidityMs: 600_000,
});

/** The ids a caller names: the victim's real ones, or ones that exist nowhere. */
interface Ids {
  task: string;
  queuedTask: string;
  terminalTask: string;
  attempt: string;
  session: string;
  subscription: string;
  owner: LeaseOwner;
}

/**
 * How an operation ended, comparable across the two id sets: the error's code, reason and path,
 * and its message with every id of `ids` replaced by its role, so a message may quote the id it
 * was given but must say nothing else about it.
 */
type Outcome =
  | { ok: true; value: unknown }
  | { ok: false; code: string; reason?: string; path?: string; message: string };

function describeError(error: unknown, ids: Ids): Outcome {
  if (!(error instanceof ContractError)) throw error;
  let message = error.message;
  for (const [role, id] of Object.entries(idRoles(ids))) message = message.split(id).join(role);
  const outcome: Outcome = { ok: false, code: error.code, message };
  if (error.reason !== undefined) outcome.reason = error.reason;
  if (error.path !== undefined) outcome.path = error.path;
  return outcome;
}

function idRoles(ids: Ids): Record<string, string> {
  return {
    '<task>': ids.task,
    '<queued>': ids.queuedTask,
    '<terminal>': ids.terminalTask,
    '<attempt>': ids.attempt,
    '<session>': ids.session,
    '<subscription>': ids.subscription,
    '<lease>': ids.owner.lease_id,
    '<owner-session>': ids.owner.worker_session_id,
  };
}

async function outcome(promise: Promise<unknown>, ids: Ids): Promise<Outcome> {
  try {
    return { ok: true, value: await promise };
  } catch (error) {
    return describeError(error, ids);
  }
}

function itemOutcomes(results: readonly ItemResult<unknown>[], ids: Ids): Outcome[] {
  return results.map((result) =>
    result.ok ? { ok: true, value: result.value } : describeError(result.error, ids),
  );
}

function settleOf(owner: LeaseOwner, operationId: string): SettleCommand {
  return {
    owner,
    operation_id: operationId,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output: { by: 'intruder' } },
      },
    },
    quiescence: 'confirmed',
    processing_trace: null,
  };
}

let h: Harness;
let real: Ids;

beforeAll(async () => {
  h = await harness('foreign_ids', LONG);
  // The victim's namespace holds every kind of row: a leased task with a subscription, a queued
  // task, a terminal task whose delivery is due, a session with a cursor, a retention policy.
  const session = await h.store.openSession({ scope: VICTIM, queue: 'q', concurrency: 2 });
  const leased = await h.store.submit(
    submitCommand('leased', { concurrency_key: 'ck', concurrency_limit: 2 }),
  );
  const done = await h.store.submit(submitCommand('done'));
  const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1), { recordEmpty: true });
  const { reply: second } = await h.store.acquire(acquireCommand(session.id, 1, 1), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned' || second.disposition !== 'assigned') {
    throw new Error('setup: both tasks should have been assigned');
  }
  const assignment: Assignment = reply.assignment;
  expect(assignment.lease.owner.task_id).toBe(leased.snapshot.task_id);
  expect(second.assignment.lease.owner.task_id).toBe(done.snapshot.task_id);
  await h.store.settle(successCommand(second.assignment, 'done-op'));
  const terminalTask = done.snapshot.task_id;
  const queued = await h.store.submit(submitCommand('queued'));
  const subscription = await h.store.subscribe(VICTIM, leased.snapshot.task_id, {
    subscription_key: 'sk',
    destination: 'billing',
  });
  await h.store.subscribe(VICTIM, terminalTask, { subscription_key: 'sk', destination: 'billing' });
  await h.store.setRetentionPolicy(VICTIM, { retention_ms: MIN_RETENTION_MS });
  real = {
    task: leased.snapshot.task_id,
    queuedTask: queued.snapshot.task_id,
    terminalTask,
    attempt: assignment.lease.owner.attempt_id,
    session: session.id,
    subscription: subscription.subscription.id,
    owner: assignment.lease.owner,
  };
}, 120_000);

afterAll(() => h?.close());

/** Every row of every table, of every scope, as text (exact comparison). */
async function dumpAll(): Promise<Record<string, string[]>> {
  const out: Record<string, string[]> = {};
  for (const table of SCOPED_TABLES) {
    const rows = await h.sql.unsafe(`select to_jsonb(x)::text as r from ${table} x order by 1`);
    out[table] = rows.map((row) => String(row.r));
  }
  return out;
}

/** Ids of the same kinds that no scope holds. */
function missingIds(scope: Scope): Ids {
  return {
    task: 'tsk_missing_000000000000000000000001',
    queuedTask: 'tsk_missing_000000000000000000000002',
    terminalTask: 'tsk_missing_000000000000000000000003',
    attempt: 'att_missing_000000000000000000000001',
    session: 'ses_missing_000000000000000000000001',
    subscription: 'sub_missing_000000000000000000000001',
    owner: {
      ...real.owner,
      scope,
      task_id: 'tsk_missing_000000000000000000000001',
      attempt_id: 'att_missing_000000000000000000000001',
      lease_id: 'lea_missing_000000000000000000000001',
      worker_session_id: 'ses_missing_000000000000000000000001',
    },
  };
}

/** The victim's ids, named from `scope` (the owner re-scoped, as a forged command would be). */
function foreignIds(scope: Scope): Ids {
  return { ...real, owner: { ...real.owner, scope } };
}

/** Every id-taking operation of the store, called from `scope` with `ids`. */
async function probe(scope: Scope, ids: Ids): Promise<Record<string, unknown>> {
  const o = (promise: Promise<unknown>) => outcome(promise, ids);
  const poll = { ...acquireCommand(ids.session, 0, 1), scope };
  return {
    status: await o(h.store.status(scope, ids.task)),
    result: await o(h.store.result(scope, ids.task)),
    inspect: await o(h.store.inspect(scope, ids.task)),
    inspectQueued: await o(h.store.inspect(scope, ids.queuedTask)),
    inspectAttempt: await o(h.store.inspectAttempt(scope, ids.task, ids.attempt)),
    history: await o(h.store.history(scope, ids.task, 0)),
    inspectTerminal: await o(h.store.inspect(scope, ids.terminalTask)),
    historyQueued: await o(h.store.history(scope, ids.queuedTask, 1)),
    listSubscriptions: await o(h.store.listSubscriptions(scope, ids.task)),
    listTerminalSubscriptions: await o(h.store.listSubscriptions(scope, ids.terminalTask)),
    subscribe: await o(
      h.store.subscribe(scope, ids.task, { subscription_key: 'sk', destination: 'billing' }),
    ),
    redeliver: await o(h.store.redeliver(scope, ids.subscription, { generation: 1 })),
    cancel: await o(h.store.cancel(scope, ids.task)),
    cancelQueued: await o(h.store.cancel(scope, ids.queuedTask)),
    cancelTerminal: await o(h.store.cancel(scope, ids.terminalTask)),
    extendSession: await o(h.store.extendSession(scope, ids.session)),
    acquire: await o(h.store.acquire(poll, { recordEmpty: true })),
    acquireProbe: await o(h.store.acquire(poll, { recordEmpty: false })),
    acquireBatch: itemOutcomes(
      await h.store.acquireBatch([poll, { ...poll, consumer_id: 1 }], { recordEmpty: true }),
      ids,
    ),
    renew: await o(h.store.renew(renewCommand(ids.owner, 1, 'dispatch'))),
    renewBatch: itemOutcomes(await h.store.renewBatch([renewCommand(ids.owner, 1)]), ids),
    settle: await o(h.store.settle(settleOf(ids.owner, 'intruder-op'))),
    settleBatch: itemOutcomes(
      await h.store.settleBatch([settleOf(ids.owner, 'intruder-batch')]),
      ids,
    ),
    confirmQuiescence: await o(h.store.confirmQuiescence(ids.owner)),
  };
}

describe('ids of another tenant or namespace', () => {
  for (const [name, scope] of [
    ['another tenant, same namespace name', OTHER_TENANT],
    ['another namespace of the same tenant', OTHER_NAMESPACE],
  ] as const) {
    it(`${name}: every operation answers the victim's ids as missing ones and writes nothing`, async () => {
      const before = await dumpAll();
      const foreign = await probe(scope, foreignIds(scope));
      const missing = await probe(scope, missingIds(scope));
      expect(foreign).toEqual(missing);
      // Not vacuous: the task routes are not_found, the session ones session_not_found, and the
      // lease owner's commands fail, whatever the code.
      for (const op of ['status', 'inspect', 'inspectAttempt', 'history', 'cancel', 'subscribe']) {
        expect([op, (foreign[op] as Outcome).ok]).toEqual([op, false]);
        expect([op, (foreign[op] as { code: string }).code]).toEqual([op, 'not_found']);
      }
      expect(foreign.redeliver).toMatchObject({ ok: false, code: 'not_found' });
      expect(foreign.extendSession).toMatchObject({ ok: false, code: 'session_not_found' });
      expect(foreign.acquire).toMatchObject({ ok: false, code: 'session_not_found' });
      for (const op of ['renew', 'settle', 'confirmQuiescence']) {
        expect([op, (foreign[op] as Outcome).ok]).toEqual([op, false]);
      }
      expect(await dumpAll()).toEqual(before);
      // The victim's lease is still its owner's.
      const renewed = await h.store.renew(renewCommand(real.owner, 1, 'keep_alive'));
      expect(renewed.renew_sequence).toBe(1);
    });
  }

  it("a task of the intruder's own with the victim's attempt id answers like a missing attempt", async () => {
    const own = await h.store.submit(
      submitCommand('intruder-own', { tenant_id: OTHER_TENANT.tenant_id }),
    );
    const before = await dumpAll();
    const ids = missingIds(OTHER_TENANT);
    const foreign = await outcome(
      h.store.inspectAttempt(OTHER_TENANT, own.snapshot.task_id, real.attempt),
      { ...ids, attempt: real.attempt },
    );
    const missing = await outcome(
      h.store.inspectAttempt(OTHER_TENANT, own.snapshot.task_id, ids.attempt),
      ids,
    );
    expect(foreign).toEqual(missing);
    expect(foreign).toMatchObject({ ok: false, code: 'not_found' });
    expect(await dumpAll()).toEqual(before);
  });
});

describe('retention of another scope', () => {
  it("reads the caller's own policy and candidates only, and collects nothing of the victim's", async () => {
    // The victim's terminal task becomes a retention candidate of its namespace.
    h.advance(MIN_RETENTION_MS + 1_000);
    const victimPreview: RetentionPreview = await h.store.previewRetention(VICTIM);
    // Not vacuous: the victim's namespace has a candidate (its terminal task) and its own policy.
    expect(victimPreview.candidates).toBeGreaterThan(0);
    expect(victimPreview.retention_ms).toBe(MIN_RETENTION_MS);
    const defaults: RetentionPolicy = await h.store.retentionPolicy({
      tenant_id: 'nobody',
      namespace: 'nowhere',
    });
    expect(defaults.retention_ms).not.toBe(MIN_RETENTION_MS);
    const before = await dumpAll();
    for (const scope of [OTHER_TENANT, OTHER_NAMESPACE]) {
      expect(await h.store.retentionPolicy(scope)).toEqual(defaults);
      const preview = await h.store.previewRetention(scope);
      expect([preview.candidates, preview.oldest_terminal_at, preview.truncated]).toEqual([
        0,
        undefined,
        false,
      ]);
      expect(preview.retention_ms).toBe(defaults.retention_ms);
    }
    expect(await dumpAll()).toEqual(before);
    // Collection in the other scopes, even under a policy that retires everything, leaves the
    // victim's rows alone.
    for (const scope of [OTHER_TENANT, OTHER_NAMESPACE]) {
      await h.store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
      await h.store.collectRetired(scope);
    }
    const victimRows = async () => {
      const out: Record<string, string[]> = {};
      for (const table of SCOPED_TABLES) {
        const rows = await h.sql.unsafe(
          `select to_jsonb(x)::text as r from ${table} x
           where tenant_id = $1 and namespace = $2 order by 1`,
          [VICTIM.tenant_id, VICTIM.namespace],
        );
        out[table] = rows.map((row) => String(row.r));
      }
      return out;
    };
    const victimBefore = Object.fromEntries(
      Object.entries(before).map(([table, rows]) => [
        table,
        rows.filter((r) => {
          const row = JSON.parse(r) as Scope;
          return row.tenant_id === VICTIM.tenant_id && row.namespace === VICTIM.namespace;
        }),
      ]),
    );
    expect(await victimRows()).toEqual(victimBefore);
    expect((await h.store.status(VICTIM, real.terminalTask)).state).toBe('succeeded');
  });
});
