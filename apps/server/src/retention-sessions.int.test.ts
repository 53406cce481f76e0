/**
 * The retention loop reaches every namespace with expired worker sessions, not only those that
 * hold terminal tasks: an idle namespace, or one whose terminal tasks retention already removed,
 * still has its sessions (and their consumer cursors) collected once they expired longer ago than
 * its retention (DESIGN §1 "bounded everything").
 */
import type { Scope } from '@ledgence/contracts';
import { lifecycleConfig } from '@ledgence/core';
import { submitCommand } from '@ledgence/core/testing';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { createMigratedTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import pino from 'pino';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { collectRetention } from './maintenance.js';

const DAY = 86_400_000;

let db: TestDatabase;
let store: PostgresTaskStore;
let sql: postgres.Sql;
let offset = 0;
const logger = pino({ level: 'silent' });

beforeAll(async () => {
  db = await createMigratedTestDatabase('retention_sessions');
  store = createPostgresTaskStore({
    url: db.url,
    config: lifecycleConfig({ terminalRetentionMs: 7 * DAY }),
    clockOffsetMs: () => offset,
  });
  sql = postgres(db.url, { max: 3, onnotice: () => {} });
});
afterAll(async () => {
  await store.close();
  await sql.end();
  await db.drop();
});

async function sessionExists(sessionId: string): Promise<boolean> {
  const [row] = await sql`
    select count(*)::int as n from worker_sessions where session_id = ${sessionId}`;
  return Number(row?.n) === 1;
}

async function taskExists(scope: Scope, taskId: string): Promise<boolean> {
  const [row] = await sql`
    select count(*)::int as n from tasks
    where tenant_id = ${scope.tenant_id} and namespace = ${scope.namespace} and task_id = ${taskId}`;
  return Number(row?.n) === 1;
}

async function terminalTask(scope: Scope, key: string): Promise<string> {
  const { snapshot } = await store.submit(submitCommand(scope, { idempotency_key: key }));
  expect(await store.cancel(scope, snapshot.task_id)).toBe('cancelled');
  return snapshot.task_id;
}

describe('the retention loop and expired sessions', () => {
  it('collects expired sessions of a namespace that holds no terminal task', async () => {
    const idle: Scope = { tenant_id: 'acme', namespace: 'idle' };
    const session = await store.openSession({ scope: idle, queue: 'q', concurrency: 1 });
    // A namespace with terminal tasks, so the walk has something to visit.
    const busy: Scope = { tenant_id: 'acme', namespace: 'busy' };
    const busySession = await store.openSession({ scope: busy, queue: 'q', concurrency: 1 });
    await terminalTask(busy, 'busy-1');

    offset += 8 * DAY; // both sessions expired more than the 7-day retention ago
    await collectRetention({ store, logger });

    expect(await sessionExists(busySession.id)).toBe(false);
    // Reached although its namespace holds no terminal task.
    expect(await sessionExists(session.id)).toBe(false);
  });

  it('collects the expired sessions of a namespace whose terminal tasks were already removed', async () => {
    const drained: Scope = { tenant_id: 'acme', namespace: 'drained' };
    const taskId = await terminalTask(drained, 'drained-1');
    offset += 7 * DAY + 60_000;
    // A worker opens a session now; it expires 5 minutes later.
    const session = await store.openSession({ scope: drained, queue: 'q', concurrency: 1 });
    await collectRetention({ store, logger });
    expect(await taskExists(drained, taskId)).toBe(false);
    expect(await sessionExists(session.id)).toBe(true); // not expired long enough: kept, rightly

    offset += 8 * DAY; // now it expired more than the retention ago
    await collectRetention({ store, logger });
    expect(await sessionExists(session.id)).toBe(false);
  });
});
