/**
 * `GET {scope}/tasks/{id}/result?wait_ms=` against a real server process with a
 * 20 s long-poll maximum: a client that goes away ends the server's wait (DESIGN §5 "A client
 * disconnect ends the wait"), waits on a missing or foreign task answer 404 at once rather than
 * after the wait, and many waiters of one task are all answered by its one terminal transition.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack, sleep, until } from './test/harness.js';
import { call, submitTask, TASKS_BASE, taskBody } from './test/wire.js';

const stack = new Stack('result_wait');
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  server = await stack.start({ LEDGENCE_LONG_POLL_WAIT_MS: '20000' });
});
afterAll(() => stack.close());

/** The count and sum of the result route's request-duration histogram. */
async function resultRouteServed(): Promise<{ count: number; sum: number }> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  let count = 0;
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith('ledgence_http_request_duration_seconds_')) continue;
    if (!/route="[^"]*\/result"/.test(line)) continue;
    const value = Number(line.slice(line.lastIndexOf(' ') + 1));
    if (line.startsWith('ledgence_http_request_duration_seconds_count')) count += value;
    if (line.startsWith('ledgence_http_request_duration_seconds_sum')) sum += value;
  }
  return { count, sum };
}

describe('result waits on a real server', () => {
  it('a client that disconnects mid-wait ends the server-side wait well before wait_ms', async () => {
    const id = await submitTask(server.url, taskBody('disconnect', 'nobody'));
    const before = await resultRouteServed();
    const controllers = Array.from({ length: 5 }, () => new AbortController());
    const waits = controllers.map((c) =>
      fetch(`${server.url}${TASKS_BASE}/tasks/${id}/result?wait_ms=20000`, {
        signal: c.signal,
      }).catch((e: unknown) => e),
    );
    await sleep(300);
    for (const c of controllers) c.abort();
    await Promise.all(waits);
    const started = Date.now();
    // A bound with slack for a loaded machine, far below the 20 s each asked for.
    await until(async () => (await resultRouteServed()).count >= before.count + 5, 10_000);
    expect(Date.now() - started).toBeLessThan(10_000);
    const after = await resultRouteServed();
    expect(after.sum - before.sum).toBeLessThan(5 * 10);
  }, 60_000);

  it('a missing task and one of another namespace answer 404 at once, not after wait_ms', async () => {
    const other = '/v1/tenants/acme/namespaces/elsewhere';
    const foreign = await call<{ task_id: string }>(server.url, `${other}/tasks`, {
      idempotency_key: 'foreign',
      input: {
        tenant_id: 'acme',
        namespace: 'elsewhere',
        queue: 'q',
        program: { name: 'p' },
        data: null,
      },
    });
    expect(foreign.status).toBe(201);
    for (const id of ['tsk_missing', foreign.body.task_id]) {
      const started = Date.now();
      const reply = await call<{ code: string }>(
        server.url,
        `${TASKS_BASE}/tasks/${id}/result?wait_ms=20000`,
      );
      expect([id, reply.status, reply.body.code]).toEqual([id, 404, 'not_found']);
      expect(Date.now() - started).toBeLessThan(10_000);
    }
  }, 60_000);

  it('fifty waiters of one task are all answered by its cancel, with the same terminal view', async () => {
    const id = await submitTask(server.url, taskBody('many', 'nobody'));
    const waits = Array.from({ length: 50 }, () =>
      call<{ status: { state: string; terminal_at: number }; outcome: { state: string } }>(
        server.url,
        `${TASKS_BASE}/tasks/${id}/result?wait_ms=20000`,
      ),
    );
    await sleep(300);
    const started = Date.now();
    expect((await call(server.url, `${TASKS_BASE}/tasks/${id}/cancel`, {})).status).toBe(200);
    const replies = await Promise.all(waits);
    expect(Date.now() - started).toBeLessThan(10_000);
    const views = new Set(
      replies.map(
        (r) =>
          `${r.status}/${r.body.status.state}/${r.body.outcome.state}/${r.body.status.terminal_at}`,
      ),
    );
    expect(views.size).toBe(1);
    expect([...views][0]).toMatch(/^200\/cancelled\/cancelled\/\d+$/);
  }, 60_000);
});
