/**
 * The retention loop over the real PostgreSQL store: it walks every namespace,
 * applies each namespace's own policy, removes in bounded transactions and
 * reports each one; store time is moved with the store's test clock offset.
 * And the statistics loop, on a database of its own that nobody analyzed.
 */
import { MIN_RETENTION_MS, type RetentionProgress, type Scope } from '@ledgence/contracts';
import { lifecycleConfig } from '@ledgence/core';
import { submitCommand } from '@ledgence/core/testing';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { createMigratedTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { collectRetention, startRetentionLoop, startStatisticsLoop } from './maintenance.js';

const DAY = 86_400_000;
const SHORT: Scope = { tenant_id: 'acme', namespace: 'short' };
const DEFAULT: Scope = { tenant_id: 'acme', namespace: 'default' };
const OTHER_TENANT: Scope = { tenant_id: 'beta', namespace: 'short' };

let db: TestDatabase;
let store: PostgresTaskStore;
let sql: postgres.Sql;
let offset = 0;

beforeAll(async () => {
  db = await createMigratedTestDatabase('retention_loop');
  store = createPostgresTaskStore({
    url: db.url,
    config: lifecycleConfig({ terminalRetentionMs: 7 * DAY }),
    clockOffsetMs: () => offset,
  });
  sql = postgres(db.url, { max: 1, onnotice: () => {} });
});
afterAll(async () => {
  await store.close();
  await sql.end();
  await db.drop();
});

/** Submits `n` tasks in `scope` and cancels them: terminal at once, never claimed. */
async function terminalTasks(scope: Scope, n: number, prefix: string): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i += 1) {
    const { snapshot } = await store.submit(
      submitCommand(scope, { idempotency_key: `${prefix}-${i}` }),
    );
    expect(await store.cancel(scope, snapshot.task_id)).toBe('cancelled');
    ids.push(snapshot.task_id);
  }
  return ids;
}

async function exists(scope: Scope, taskId: string): Promise<boolean> {
  try {
    await store.status(scope, taskId);
    return true;
  } catch {
    return false;
  }
}

/** A pino logger that keeps its lines, to read what the loop logged. */
function capturingLogger() {
  const lines: Record<string, unknown>[] = [];
  const logger = pino(
    { level: 'info' },
    { write: (line: string) => lines.push(JSON.parse(line) as Record<string, unknown>) },
  );
  return { logger, lines };
}

describe('retention loop', () => {
  it('applies each namespace its own policy, in bounded transactions, and logs progress', async () => {
    await store.setRetentionPolicy(SHORT, { retention_ms: MIN_RETENTION_MS });
    const short = await terminalTasks(SHORT, 7, 'short');
    const otherTenant = await terminalTasks(OTHER_TENANT, 2, 'other');
    const kept = await terminalTasks(DEFAULT, 3, 'default');
    const { snapshot: live } = await store.submit(
      submitCommand(DEFAULT, { idempotency_key: 'live' }),
    );

    offset += MIN_RETENTION_MS + 60_000;
    const progress: [Scope, RetentionProgress][] = [];
    const { logger, lines } = capturingLogger();
    const removed = await collectRetention({
      store,
      logger,
      batchSize: 3,
      onProgress: (scope, p) => progress.push([scope, p]),
    });

    // Only `acme/short` has a one-hour policy; `beta/short` and `acme/default` keep 7 days.
    expect(removed).toBe(7);
    for (const id of short) expect(await exists(SHORT, id)).toBe(false);
    for (const id of otherTenant) expect(await exists(OTHER_TENANT, id)).toBe(true);
    for (const id of kept) expect(await exists(DEFAULT, id)).toBe(true);
    expect(await exists(DEFAULT, live.task_id)).toBe(true);
    const shortPasses = progress.filter(([s]) => s.tenant_id === 'acme' && s.namespace === 'short');
    expect(shortPasses.map(([, p]) => p.tasks_removed)).toEqual([3, 3, 1]);
    expect(progress.every(([, p]) => p.tasks_removed <= 3)).toBe(true);
    expect(lines.filter((l) => l.msg === 'retention removed retired records')).toEqual([
      expect.objectContaining({ tenant_id: 'acme', namespace: 'short', tasks: 7, transactions: 3 }),
    ]);

    // A week later the server default retires the rest; the live task stays.
    offset += 7 * DAY;
    expect(await collectRetention({ store, logger })).toBe(5);
    expect(await exists(DEFAULT, live.task_id)).toBe(true);
  });

  it('runs rounds until stopped, every replica at once without double counting', async () => {
    const scope: Scope = { tenant_id: 'acme', namespace: 'looped' };
    await store.setRetentionPolicy(scope, { retention_ms: MIN_RETENTION_MS });
    const ids = await terminalTasks(scope, 10, 'looped');
    offset += MIN_RETENTION_MS + 60_000;
    const removedBy = [0, 0];
    const logger = pino({ level: 'silent' });
    const loops = [0, 1].map((replica) =>
      startRetentionLoop({
        store,
        intervalMs: 10,
        logger,
        batchSize: 2,
        onProgress: (_, p) => {
          removedBy[replica] = (removedBy[replica] ?? 0) + p.tasks_removed;
        },
      }),
    );
    const end = Date.now() + 30_000;
    while ((await Promise.all(ids.map((id) => exists(scope, id)))).some(Boolean)) {
      if (Date.now() > end) throw new Error('the loops did not collect within 30 s');
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await Promise.all(loops.map((loop) => loop.stop()));
    // SKIP LOCKED shares the work; each task is counted by exactly one replica.
    expect((removedBy[0] ?? 0) + (removedBy[1] ?? 0)).toBe(10);
  });

  it('goes on past a namespace whose collection fails, and collects it in a later round', async () => {
    const blocked: Scope = { tenant_id: 'block', namespace: 'a_blocked' };
    const later: Scope = { tenant_id: 'block', namespace: 'b_later' };
    const [blockedTask] = await terminalTasks(blocked, 1, 'blocked');
    const [laterTask] = await terminalTasks(later, 1, 'later');
    offset += 8 * DAY;

    // Another transaction holds a row of the blocked namespace's retired task (one history
    // row) for longer than the collection's lock_timeout.
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let locked!: () => void;
    const isLocked = new Promise<void>((resolve) => {
      locked = resolve;
    });
    const holder = sql.begin(async (tx) => {
      await tx`
        select 1 from task_history
        where tenant_id = ${blocked.tenant_id} and namespace = ${blocked.namespace}
          and task_id = ${blockedTask as string}
        order by sequence limit 1 for update`;
      locked();
      await released;
    });
    await isLocked;
    const { logger, lines } = capturingLogger();
    try {
      // The walk visits `block/a_blocked` first; `block/b_later` must not wait with it.
      expect(await collectRetention({ store, logger })).toBeGreaterThanOrEqual(1);
    } finally {
      release();
      await holder;
    }
    expect(await exists(blocked, blockedTask as string)).toBe(true);
    expect(await exists(later, laterTask as string)).toBe(false);
    const failures = lines.filter(
      (l) => l.msg === 'retention of a namespace failed; retrying it next round',
    );
    expect(failures).toEqual([
      expect.objectContaining({ level: 40, tenant_id: 'block', namespace: 'a_blocked' }),
    ]);

    // Once the row is released, the next round collects the namespace that failed.
    await collectRetention({ store, logger });
    expect(await exists(blocked, blockedTask as string)).toBe(false);
  });
});

describe('statistics loop', () => {
  it('analyzes the tables that got rows and logs them once', async () => {
    const fresh = await createMigratedTestDatabase('statistics_loop');
    const freshStore = createPostgresTaskStore({ url: fresh.url });
    const reltuples = async (table: string) => {
      const [row] = await freshStore.sql<{ reltuples: number }[]>`
        select reltuples from pg_class
        where relname = ${table} and relnamespace = current_schema()::regnamespace`;
      return row?.reltuples;
    };
    const { logger, lines } = capturingLogger();
    const loop = startStatisticsLoop({
      analyze: () => freshStore.analyzeGrowingTables(),
      intervalMs: 20,
      logger,
    });
    try {
      await new Promise((resolve) => setTimeout(resolve, 100));
      // Rounds ran, but no table holds rows: nothing analyzed, nothing logged.
      expect(await reltuples('tasks')).toBe(-1);
      expect(lines).toEqual([]);

      await freshStore.submit(submitCommand(DEFAULT, { idempotency_key: 'first' }));
      await expect.poll(() => reltuples('tasks'), { timeout: 10_000 }).toBeGreaterThan(0);
      await new Promise((resolve) => setTimeout(resolve, 100));
      const logged = lines.filter((line) => Array.isArray(line.tables));
      expect(logged).toHaveLength(1);
      expect(logged[0]?.tables).toEqual(expect.arrayContaining(['task_payloads', 'tasks']));
      // Tables still without rows keep waiting for theirs.
      expect(await reltuples('attempts')).toBe(-1);
    } finally {
      await loop.stop();
      await freshStore.close();
      await fresh.drop();
    }
  });
});
