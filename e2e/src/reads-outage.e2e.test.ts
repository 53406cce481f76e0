/**
 * The Client's reads across a database outage (README "PostgreSQL goes away":
 * store-backed requests answer 503 `unavailable`, the server serves again once the database is
 * back; packages/worker/README.md: the Client retries `unavailable` within its `retries`, the
 * result wait bounds the whole call). A real server process whose PostgreSQL sits behind a TCP
 * proxy that resets every connection while "down".
 */
import { type PgProxy, startPgProxy } from '@ledgence/store-postgres/testing';
import { Client, ProblemError, silentLogger } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { NAMESPACE, Stack, shortWorker, TENANT, until } from './test/harness.js';

const stack = new Stack('r46d_outage');
let proxy: PgProxy;
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  proxy = await startPgProxy(stack.databaseUrl);
  server = await stack.start({ DATABASE_URL: proxy.url, LEDGENCE_LONG_POLL_WAIT_MS: '10000' });
}, 120_000);
afterAll(async () => {
  await stack.close();
  await proxy?.close();
});

function clientOf(retries: number): Client {
  return new Client({
    url: server.url,
    tenant: TENANT,
    namespace: NAMESPACE,
    logger: silentLogger,
    retries,
    backoff: { baseMs: 20, maxMs: 200 },
  });
}

async function ready(): Promise<void> {
  await until(
    async () => (await fetch(`${server.url}/readyz`).catch(() => ({ status: 0 }))).status === 200,
    60_000,
    'ready again',
  );
}

describe('Client reads across a database outage', () => {
  it('a result wait whose retries outlast the outage answers the terminal outcome settled after it', async () => {
    await ready();
    const c = clientOf(1_000);
    const queue = 'r46d-outage-wait';
    const task = await c.submit({ queue, program: 'echo', data: 42 });
    const waiting = c.result(task.task_id, { waitMs: 30_000 });
    const refusedBefore = proxy.refusedAt.length;
    proxy.refuse(true);
    try {
      // The outage lasts until the server has tried (and failed) to reconnect a few times.
      await until(() => proxy.refusedAt.length >= refusedBefore + 5, 30_000, 'refusals');
    } finally {
      proxy.refuse(false);
    }
    await ready();
    const worker = shortWorker(server.url, queue);
    worker.register('echo', async (data) => data);
    const running = worker.run();
    try {
      const result = await waiting;
      expect(result.outcome).toEqual({ state: 'succeeded', output: 42 });
      expect(result.status.state).toBe('succeeded');
    } finally {
      await worker.stop();
      await running;
    }
  }, 90_000);

  it('without retries, a read during the outage is a ProblemError `unavailable` (503, retryable), never another error', async () => {
    await ready();
    const c = clientOf(0);
    const task = await c.submit({ queue: 'r46d-outage-none', program: 'p' });
    proxy.refuse(true);
    let errors: unknown[];
    try {
      errors = await Promise.all([
        c.result(task.task_id, { waitMs: 5_000 }).catch((e: unknown) => e),
        c.result(task.task_id).catch((e: unknown) => e),
        c.status(task.task_id).catch((e: unknown) => e),
        c.snapshot(task.task_id).catch((e: unknown) => e),
        (async () => {
          for await (const _ of c.history(task.task_id)) {
            // no page expected
          }
        })().catch((e: unknown) => e),
        (async () => {
          for await (const _ of c.list({ queue: 'r46d-outage-none' })) {
            // no page expected
          }
        })().catch((e: unknown) => e),
      ]);
    } finally {
      proxy.refuse(false);
    }
    for (const e of errors) {
      expect(e).toBeInstanceOf(ProblemError);
      const p = e as ProblemError;
      expect({ code: p.code, retryable: p.retryable, status: p.toJSON().status }).toEqual({
        code: 'unavailable',
        retryable: true,
        status: 503,
      });
    }
    await ready();
    expect((await c.result(task.task_id)).outcome).toEqual({ state: 'pending' });
  }, 90_000);

  it('a list walk cut by the outage resumes from its last cursor: no task twice, none missed', async () => {
    await ready();
    const c = clientOf(0);
    const labels = { walk: 'r46d-outage' };
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const batch = await c.submitBatch(
        Array.from({ length: 7 }, (_, k) => ({
          queue: 'r46d-outage-list',
          program: 'p',
          data: [i, k],
          labels,
        })),
      );
      for (const t of batch) {
        if (t instanceof Error) throw t;
        ids.push(t.task_id);
      }
    }
    const seen: string[] = [];
    let cursor: string | undefined;
    let cut = false;
    for (;;) {
      let failed = false;
      try {
        for await (const page of c.list({ labels, limit: 4, cursor })) {
          seen.push(...page.tasks.map((t) => t.task_id));
          if (page.next_cursor === undefined) {
            cursor = undefined;
            break;
          }
          cursor = page.next_cursor;
          if (!cut && seen.length >= 8) {
            cut = true;
            proxy.refuse(true);
          }
        }
      } catch (error) {
        expect(error).toBeInstanceOf(ProblemError);
        expect((error as ProblemError).code).toBe('unavailable');
        failed = true;
        proxy.refuse(false);
        await ready();
      }
      if (!failed) break;
    }
    expect(cut).toBe(true);
    expect(seen.length).toBe(new Set(seen).size);
    expect([...seen].sort()).toEqual([...ids].sort());
  }, 90_000);
});
