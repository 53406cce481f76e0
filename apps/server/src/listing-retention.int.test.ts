/**
 * A task list walked while retention removes tasks between its pages (the task the
 * cursor points at included), and every read of a removed task (DESIGN §4 "Task cursors … carry the
 * TaskPosition", README "A removed task is gone: its status, result, history … answer 404").
 */
import {
  type Scope,
  type TaskPage,
  type TaskSnapshot,
  TERMINAL_RETENTION_MS,
} from '@ledgence/contracts';
import { createTaskService } from '@ledgence/core';
import { submitCommand } from '@ledgence/core/testing';
import { createHttpApp } from '@ledgence/http';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { createMigratedTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const TENANT = 'acme';
const KEY = 'acme-key-lr-retention-0123456789';
let offset = 0;
let db: TestDatabase;
let store: PostgresTaskStore;
let app: ReturnType<typeof createHttpApp>;

beforeAll(async () => {
  db = await createMigratedTestDatabase('lr_list_retention');
  store = createPostgresTaskStore({ url: db.url, max: 4, clockOffsetMs: () => offset });
  app = createHttpApp({
    service: createTaskService({ store }),
    auth: { keys: [{ key: KEY, tenant: TENANT, namespaces: ['*'], roles: ['client', 'worker'] }] },
  });
});
afterAll(async () => {
  await store?.close();
  await db?.drop();
});

async function call<T>(path: string, json?: unknown): Promise<{ status: number; body: T }> {
  const headers: Record<string, string> = { authorization: `Bearer ${KEY}` };
  let body: string | undefined;
  if (json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(json);
  }
  const res = await app.request(path, {
    method: body === undefined ? 'GET' : 'POST',
    headers,
    body,
  });
  return { status: res.status, body: (await res.json()) as T };
}

const tasksPath = (scope: Scope) =>
  `/v1/tenants/${scope.tenant_id}/namespaces/${scope.namespace}/tasks`;

describe('a walk while retention removes tasks', () => {
  it('lists every live task once, in order, even when the cursor task was removed', async () => {
    const scope: Scope = { tenant_id: TENANT, namespace: 'lr_walk' };
    const created: TaskSnapshot[] = [];
    for (let i = 0; i < 18; i++) {
      const reply = await call<TaskSnapshot>(
        tasksPath(scope),
        submitCommand(scope, { queue: 'q' }),
      );
      expect(reply.status).toBe(201);
      created.push(reply.body);
    }
    // Every third task is cancelled (terminal, retirable); the rest stay queued (never removed).
    const victims = created.filter((_, i) => i % 3 !== 1).filter((_, i) => i % 2 === 0);
    for (const v of victims) {
      expect((await call(`${tasksPath(scope)}/${v.task_id}/cancel`, {})).status).toBe(200);
    }
    const victimIds = new Set(victims.map((t) => t.task_id));
    const live = created.filter((t) => !victimIds.has(t.task_id));
    const newestFirst = [...live]
      .sort((a, b) =>
        a.submitted_at !== b.submitted_at
          ? b.submitted_at - a.submitted_at
          : Buffer.compare(Buffer.from(b.task_id), Buffer.from(a.task_id)),
      )
      .map((t) => t.task_id);

    const first = await call<TaskPage>(`${tasksPath(scope)}?limit=4`);
    expect(first.status).toBe(200);
    const seen = first.body.tasks.map((t) => t.task_id);
    // The cursor's own task is a victim, whatever it is.
    const lastOfPage = first.body.tasks.at(-1)?.task_id as string;
    if (!victimIds.has(lastOfPage)) {
      expect((await call(`${tasksPath(scope)}/${lastOfPage}/cancel`, {})).status).toBe(200);
      victimIds.add(lastOfPage);
    }
    offset += TERMINAL_RETENTION_MS + 1;
    const progress = await store.collectRetired(scope);
    expect(progress.tasks_removed).toBe(victimIds.size);

    let cursor = first.body.next_cursor;
    while (cursor !== undefined) {
      const page = await call<TaskPage>(`${tasksPath(scope)}?limit=3&cursor=${cursor}`);
      expect(page.status).toBe(200);
      seen.push(...page.body.tasks.map((t) => t.task_id));
      cursor = page.body.next_cursor;
    }
    expect(new Set(seen).size).toBe(seen.length);
    const liveSeen = seen.filter((id) => !victimIds.has(id));
    expect(liveSeen).toEqual(newestFirst.filter((id) => !victimIds.has(id)));

    // Every read of a removed task is 404 not_found, as for an id that never existed.
    for (const id of victimIds) {
      for (const suffix of [
        '',
        '/result',
        '/result?wait_ms=50',
        '/snapshot',
        '/history',
        '/history?after_sequence=1',
        '/completion-subscriptions',
        '/attempts/att_x',
      ]) {
        const reply = await call<{ code: string }>(`${tasksPath(scope)}/${id}${suffix}`);
        expect([suffix, reply.status, reply.body.code]).toEqual([suffix, 404, 'not_found']);
      }
      const cancel = await call<{ code: string }>(`${tasksPath(scope)}/${id}/cancel`, {});
      expect([cancel.status, cancel.body.code]).toEqual([404, 'not_found']);
    }
  });
});

describe('history paged by after_sequence while it grows', () => {
  it('the pages a reader takes between transitions join into the whole history, gapless, none twice', async () => {
    const scope: Scope = { tenant_id: TENANT, namespace: 'lr_history' };
    const queue = 'hq';
    const { snapshot } = await store.submit(
      submitCommand(scope, { queue, retry: { max_attempts: 60, delay_ms: 0 } }),
    );
    const taskId = snapshot.task_id;
    const session = await store.openSession({ scope, queue, concurrency: 1 });
    const read: number[] = [];
    let after = 0;
    const readSome = async () => {
      for (;;) {
        const page = await call<{ sequence: number }[]>(
          `${tasksPath(scope)}/${taskId}/history?after_sequence=${after}`,
        );
        expect(page.status).toBe(200);
        expect(page.body.length).toBeLessThanOrEqual(100);
        read.push(...page.body.map((e) => e.sequence));
        const last = page.body.at(-1);
        if (last === undefined) return;
        after = last.sequence;
        if (page.body.length < 100) return;
      }
    };
    let sequence = 0;
    for (let n = 0; n < 60; n++) {
      sequence += 1;
      const { reply } = await store.acquire(
        { scope, queue, worker_session_id: session.id, consumer_id: 0, sequence },
        { recordEmpty: true },
      );
      if (reply.disposition !== 'assigned') throw new Error(`not assigned: ${reply.disposition}`);
      const owner = reply.assignment.lease.owner;
      const [, authority] = await Promise.all([
        readSome(),
        store.renew({ owner, sequence: 1, intent: 'dispatch' }),
      ]);
      expect(authority.dispatch_allowed).toBe(true);
      await Promise.all([
        readSome(),
        store.settle({
          owner,
          operation_id: `op-${n}`,
          report: { kind: 'failed', report: { kind: 'crashed', message: 'boom', retryable: true } },
          quiescence: 'confirmed',
          processing_trace: null,
        }),
      ]);
    }
    await readSome();
    const whole: number[] = [];
    let from = 0;
    for (;;) {
      const page = await store.history(scope, taskId, from);
      whole.push(...page.map((e) => e.sequence));
      if (page.length < 100) break;
      from = page.at(-1)?.sequence as number;
    }
    expect(whole.length).toBeGreaterThan(200);
    expect(whole).toEqual(Array.from({ length: whole.length }, (_, i) => i + 1));
    expect(read).toEqual(whole);
    expect((await store.status(scope, taskId)).state).toBe('failed');
  });
});
