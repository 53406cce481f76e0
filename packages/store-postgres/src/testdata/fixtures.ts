/**
 * Shared pieces of the store's int tests: a migrated database per file, a store whose clock a
 * test can move forward, and command builders.
 */
import type {
  AcquireCommand,
  Assignment,
  LeaseOwner,
  RenewCommand,
  Scope,
  SettleCommand,
  SubmitCommand,
  SubmitTask,
} from '@ledgence/contracts';
import { ContractError } from '@ledgence/contracts';
import { type LifecycleConfig, lifecycleConfig } from '@ledgence/core';
import postgres from 'postgres';
import { createPostgresTaskStore, type PostgresTaskStore } from '../store.js';
import type { TestDatabase } from '../testing/database.js';
import { createMigratedTestDatabase } from '../testing/migrated.js';

/** The scope every test uses unless it tests scoping. */
export const SCOPE: Scope = { tenant_id: 'acme', namespace: 'prod' };

/** Every table of the store, each keyed by `(tenant_id, namespace, …)`: what a scope's dump reads. */
export const SCOPED_TABLES = [
  'tasks',
  'task_payloads',
  'attempts',
  'worker_sessions',
  'consumer_cursors',
  'task_history',
  'concurrency_keys',
  'completion_subscriptions',
  'completion_deliveries',
  'retention_policies',
] as const;

/** Short leases so expiry tests move the clock by seconds, not minutes. */
export const CONFIG: LifecycleConfig = lifecycleConfig({
  leaseDurationMs: 2_000,
  cleanupGraceMs: 1_000,
  leaseSafetyMarginMs: 500,
  sessionValidityMs: 60_000,
});

/** A migrated database and stores on it sharing one movable clock. */
export interface Harness {
  db: TestDatabase;
  store: PostgresTaskStore;
  /** Another store (its own pool) on the same database and clock. */
  makeStore(max?: number): PostgresTaskStore;
  /** A plain client for assertions and setup. */
  sql: postgres.Sql;
  advance(ms: number): void;
  /** Resolves once at least `n` statements of this database wait for a lock. */
  untilLockWaits(n?: number): Promise<void>;
  close(): Promise<void>;
}

/** Creates the harness; call `close()` in `afterAll`. */
export async function harness(prefix: string, config: LifecycleConfig = CONFIG): Promise<Harness> {
  const db = await createMigratedTestDatabase(prefix);
  let offset = 0;
  const stores: PostgresTaskStore[] = [];
  const makeStore = (max = 4) => {
    const store = createPostgresTaskStore({
      url: db.url,
      config,
      max,
      clockOffsetMs: () => offset,
    });
    stores.push(store);
    return store;
  };
  const store = makeStore();
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  return {
    db,
    store,
    makeStore,
    sql,
    advance: (ms) => {
      offset += ms;
    },
    untilLockWaits: async (n = 1) => {
      for (;;) {
        const [row] = await sql`select count(*)::int as n from pg_stat_activity
          where datname = current_database() and wait_event_type = 'Lock'`;
        if (Number(row?.n) >= n) return;
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    },
    close: async () => {
      await Promise.all(stores.map((s) => s.close()));
      await sql.end();
      await db.drop();
    },
  };
}

/** A submit command with test defaults. */
export function submitCommand(key: string, input: Partial<SubmitTask> = {}): SubmitCommand {
  return {
    idempotency_key: key,
    input: {
      tenant_id: SCOPE.tenant_id,
      namespace: SCOPE.namespace,
      queue: 'q',
      program: { name: 'prog' },
      data: { key },
      ...input,
    },
  };
}

/** A poll of one slot. */
export function acquireCommand(
  session: string,
  consumer: number,
  sequence: number,
  queue = 'q',
  scope: Scope = SCOPE,
): AcquireCommand {
  return { scope, queue, worker_session_id: session, consumer_id: consumer, sequence };
}

/**
 * Submits the task `key` to a queue of its own (`claimed-<key>`, unless `input` names one) and
 * claims it with a new one-slot session: its assignment, not yet granted dispatch.
 */
export async function claimedTask(
  h: Pick<Harness, 'store'>,
  key: string,
  input: Partial<SubmitTask> = {},
): Promise<Assignment> {
  const queue = input.queue ?? `claimed-${key}`;
  await h.store.submit(submitCommand(key, { ...input, queue }));
  const session = await h.store.openSession({ scope: SCOPE, queue, concurrency: 1 });
  const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, queue), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned') throw new Error(`not assigned: ${reply.disposition}`);
  return reply.assignment;
}

/** A renewal of an assignment's lease. */
export function renewCommand(
  owner: LeaseOwner,
  sequence: number,
  intent: RenewCommand['intent'] = 'keep_alive',
): RenewCommand {
  return { owner, sequence, intent };
}

/** A successful, confirmed settlement of an assignment. */
export function successCommand(
  assignment: Assignment,
  operationId: string,
  output: unknown = { ok: true },
  quiescence: SettleCommand['quiescence'] = 'confirmed',
): SettleCommand {
  const owner = assignment.lease.owner;
  return {
    owner,
    operation_id: operationId,
    report: {
      kind: 'completed',
      report: {
        context: { identity: { task_id: owner.task_id, attempt_id: owner.attempt_id } },
        outcome: { kind: 'success', output },
      },
    },
    quiescence,
    processing_trace: null,
  };
}

/** An execution failure settlement. */
export function failureCommand(
  assignment: Assignment,
  operationId: string,
  retryable = true,
): SettleCommand {
  return {
    owner: assignment.lease.owner,
    operation_id: operationId,
    report: { kind: 'failed', report: { kind: 'crashed', message: 'boom', retryable } },
    quiescence: 'confirmed',
    processing_trace: null,
  };
}

/**
 * `'ok'` when the promise fulfils, else the code of the ContractError it rejects with. Any other
 * rejection is rethrown: a store that fails with a non-contract error has a bug the test must show.
 */
export async function outcomeCode(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
    return 'ok';
  } catch (error) {
    if (error instanceof ContractError) return error.code;
    throw error;
  }
}
