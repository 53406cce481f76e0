/**
 * What a retention round costs when most namespaces have nothing due: a
 * deployment with thousands of namespaces, each holding young terminal tasks, must not run a
 * collection transaction per namespace every round on every replica. The round's transactions
 * are counted as the store really sends them (each begins with BEGIN, seen through postgres.js
 * `debug`), over the real PostgreSQL store and the server's own retention walk.
 */
import { MIN_RETENTION_MS, type Scope } from '@ledgence/contracts';
import { lifecycleConfig } from '@ledgence/core';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { createMigratedTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { collectRetention } from './maintenance.js';

const DAY = 86_400_000;
/** Namespaces holding only young terminal tasks: nothing due in any of them. */
const YOUNG_NAMESPACES = 600;

let db: TestDatabase;
let client: postgres.Sql;
let sql: postgres.Sql;
let store: PostgresTaskStore;
let offset = 0;
let statements: string[] = [];

beforeAll(async () => {
  db = await createMigratedTestDatabase('retention_due');
  sql = postgres(db.url, { max: 1, onnotice: () => {} });
  client = postgres(db.url, {
    max: 2,
    onnotice: () => {},
    debug: (_connection, query) => {
      statements.push(query.trim().split(/\s+/)[0]?.toLowerCase() ?? '');
    },
  });
  store = createPostgresTaskStore({
    sql: client,
    config: lifecycleConfig({ terminalRetentionMs: 7 * DAY }),
    clockOffsetMs: () => offset,
  });
}, 60_000);
afterAll(async () => {
  await client.end();
  await sql.end();
  await db.drop();
});

/** Store time now (the store's clock plus the test offset). */
async function storeNow(): Promise<number> {
  const [row] = await sql`select (extract(epoch from clock_timestamp()) * 1000)::bigint as now`;
  return Number(row?.now) + offset;
}

/** `count` cancelled tasks terminal at `terminalAt` in each of `namespaces` of `tenant`. */
async function terminalTasks(
  tenant: string,
  namespaces: readonly string[],
  terminalAt: number,
  count = 1,
): Promise<void> {
  await sql`
    insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
      input, queue, program, retry, timeout_ms, priority, labels, state, submitted_at,
      available_at, terminal_at, attempt_count, dispatch_count, outcome, history_sequence)
    select ${tenant}, ns, 'tsk_' || ns || '_' || g, 'run_' || ns || '_' || g, 'k-' || g, 'x',
      '{}', 'q', '{"name":"p"}', '{"max_attempts":3,"delay_ms":1000}', 300000, 0, '{}',
      'cancelled', ${terminalAt}::bigint - 10, ${terminalAt}::bigint - 10, ${terminalAt}::bigint,
      0, 0, '{"state":"cancelled"}', 2
    from unnest(${namespaces as string[]}::text[]) as ns, generate_series(1, ${count}) as g`;
  await sql`
    insert into task_payloads (tenant_id, namespace, task_id, data)
    select tenant_id, namespace, task_id, '{}' from tasks
    where tenant_id = ${tenant} and namespace = any(${namespaces as string[]}::text[])
    on conflict do nothing`;
}

async function taskCount(scope: Scope): Promise<number> {
  const [row] = await sql`
    select count(*)::int as n from tasks
    where tenant_id = ${scope.tenant_id} and namespace = ${scope.namespace}`;
  return Number(row?.n);
}

/** Runs one retention round; answers the tasks it removed and the transactions it began. */
async function round(): Promise<{ removed: number; transactions: number }> {
  statements = [];
  const removed = await collectRetention({ store, logger: pino({ level: 'silent' }) });
  return { removed, transactions: statements.filter((s) => s === 'begin').length };
}

describe('a retention round with nothing due', () => {
  it(`runs a handful of transactions, not one per namespace (${YOUNG_NAMESPACES} namespaces of young terminal tasks)`, async () => {
    const now = await storeNow();
    const names = Array.from(
      { length: YOUNG_NAMESPACES },
      (_, i) => `young_${String(i).padStart(5, '0')}`,
    );
    await terminalTasks('many', names, now - 60_000, 3);
    // One namespace with a short policy (so the floor rule is also in play), its tasks young.
    const short: Scope = { tenant_id: 'many', namespace: 'short_policy' };
    await store.setRetentionPolicy(short, { retention_ms: MIN_RETENTION_MS });
    await terminalTasks('many', [short.namespace], now - 60_000);

    const idle = await round();
    expect(idle.removed).toBe(0);
    // The walk pages over 100 namespaces at a time: at most a few read transactions in all.
    expect(idle.transactions).toBeLessThanOrEqual(10);
    expect(await taskCount({ tenant_id: 'many', namespace: 'young_00000' })).toBe(3);
  });

  it('still collects every namespace with something due, among many with nothing due', async () => {
    const now = await storeNow();
    // Due by the default (7 days), by its own short policy, and by the floor of a policy
    // lengthened after the tasks were already retiring (migration 0003).
    const old: Scope = { tenant_id: 'many', namespace: 'young_00300_old' };
    await terminalTasks('many', [old.namespace], now - 8 * DAY, 2);
    const short: Scope = { tenant_id: 'many', namespace: 'short_policy' };
    const floored: Scope = { tenant_id: 'many', namespace: 'zz_floored' };
    await store.setRetentionPolicy(floored, { retention_ms: MIN_RETENTION_MS });
    await terminalTasks('many', [floored.namespace], now - 2 * MIN_RETENTION_MS);
    await store.setRetentionPolicy(floored, { retention_ms: 30 * DAY });
    // A namespace whose only garbage is an expired session (worker_sessions_retention).
    const sessions: Scope = { tenant_id: 'zz_sessions', namespace: 'only' };
    await store.setRetentionPolicy(sessions, { retention_ms: MIN_RETENTION_MS });
    await store.openSession({ scope: sessions, queue: 'q', concurrency: 1 });
    // Two hours on: the short policy's task (a minute old at the start) and the session are
    // past their hour; the default namespaces' tasks are well within 7 days.
    offset += 2 * MIN_RETENTION_MS;

    const collected = await round();
    expect(await taskCount(old)).toBe(0);
    expect(await taskCount(short)).toBe(0);
    expect(await taskCount(floored)).toBe(0);
    const [left] = await sql`
      select count(*)::int as n from worker_sessions where tenant_id = ${sessions.tenant_id}`;
    expect(Number(left?.n)).toBe(0);
    expect(collected.removed).toBe(2 + 1 + 1);
    expect(await taskCount({ tenant_id: 'many', namespace: 'young_00000' })).toBe(3);
    expect(collected.transactions).toBeLessThanOrEqual(10 + 4);
  });
});
