/**
 * Result waits in numbers, on a replica whose rescan is ten minutes (only a hint
 * answers a wait early): abandoned waits leave no database connection busy and no watch that
 * keeps later waits from being woken; many waiters of one task on another replica are all
 * answered by one change; a reply to a settle or cancel is never followed by a stale read.
 */
import { describe, expect, it } from 'vitest';
import { sleep, until } from './test/harness.js';
import { replicaPair } from './test/replicas.js';
import {
  call,
  claimNext,
  HINTS_ONLY_ENV,
  settleBody,
  submitTask,
  TASKS_BASE,
  taskBody,
  WAIT_MS,
} from './test/wire.js';

const PROMPT_MS = 5_000;
const pair = replicaPair('result_wait_load', { env: HINTS_ONLY_ENV });

async function activeStoreBackends(): Promise<number> {
  const [row] = await pair.sql<{ n: number }[]>`
    select count(*)::int as n from pg_stat_activity
    where datname = current_database() and application_name = 'ledgence-store'
      and state <> 'idle' and pid <> pg_backend_pid()`;
  return row?.n ?? -1;
}

describe('result waits in numbers', () => {
  it('300 waits abandoned by their clients: no busy connection left, and a later wait is still woken by a hint', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 30; i += 1)
      ids.push(await submitTask(pair.a.url, taskBody(`abandon-${i}`, 'abandon')));
    const controllers: AbortController[] = [];
    const waits: Promise<unknown>[] = [];
    for (let i = 0; i < 300; i += 1) {
      const controller = new AbortController();
      controllers.push(controller);
      waits.push(
        fetch(`${pair.b.url}${TASKS_BASE}/tasks/${ids[i % ids.length]}/result?wait_ms=${WAIT_MS}`, {
          signal: controller.signal,
        }).catch((e: unknown) => e),
      );
    }
    await sleep(1_000);
    for (const c of controllers) c.abort();
    await Promise.all(waits);
    await until(async () => (await activeStoreBackends()) === 0, 10_000, 'no busy store backend');
    // The abandoned waits' tasks: each cancel wakes nobody, and harms nothing.
    for (const id of ids.slice(0, 5))
      await call(pair.a.url, `${TASKS_BASE}/tasks/${id}/cancel`, {});
    // A new wait on one of the same tasks' siblings is woken promptly.
    const id = ids[10] as string;
    const started = performance.now();
    const waiting = call<{ outcome: { state: string } }>(
      pair.b.url,
      `${TASKS_BASE}/tasks/${id}/result?wait_ms=${WAIT_MS}`,
    );
    await sleep(300);
    await call(pair.a.url, `${TASKS_BASE}/tasks/${id}/cancel`, {});
    const reply = await waiting;
    expect(reply.body.outcome.state).toBe('cancelled');
    expect(performance.now() - started).toBeLessThan(PROMPT_MS);
  }, 120_000);

  it('200 waiters of one task on B are all answered by its settle through A, each with the terminal view', async () => {
    const id = await submitTask(pair.a.url, taskBody('many-b', 'many-b'));
    const assignment = await claimNext(pair.a.url, 'many-b');
    const waits = Array.from({ length: 200 }, () =>
      call<{ status: { state: string }; outcome: { state: string; output?: unknown } }>(
        pair.b.url,
        `${TASKS_BASE}/tasks/${id}/result?wait_ms=${WAIT_MS}`,
      ),
    );
    // Under the 1 s lease the claim holds (no heartbeat here).
    await sleep(400);
    const started = performance.now();
    const settled = await call<{ task_state: string }>(
      pair.a.url,
      '/v1/worker/settle',
      settleBody(assignment, { kind: 'success', output: { n: 1 } }),
    );
    expect(settled.body.task_state).toBe('succeeded');
    const replies = await Promise.all(waits);
    expect(performance.now() - started).toBeLessThan(PROMPT_MS * 2);
    const views = new Set(
      replies.map(
        (r) => `${r.status}/${r.body.outcome.state}/${JSON.stringify(r.body.outcome.output)}`,
      ),
    );
    expect([...views]).toEqual(['200/succeeded/{"n":1}']);
  }, 120_000);

  it('a read right after a settle or cancel reply (on the other replica) never shows the state before it', async () => {
    const stale: string[] = [];
    for (let i = 0; i < 20; i += 1) {
      const queue = `ryw-${i}`;
      const id = await submitTask(pair.a.url, taskBody(queue, queue));
      const assignment = await claimNext(pair.a.url, queue);
      const settled = await call<{ task_state: string }>(
        pair.a.url,
        '/v1/worker/settle',
        settleBody(assignment, { kind: 'success', output: i }),
      );
      const read = await call<{ outcome: { state: string } }>(
        pair.b.url,
        `${TASKS_BASE}/tasks/${id}/result`,
      );
      if (read.body.outcome.state !== settled.body.task_state)
        stale.push(`settle ${i}: ${read.body.outcome.state}`);
      const other = await submitTask(pair.a.url, taskBody(`${queue}-c`, `${queue}-c`));
      await call(pair.a.url, `${TASKS_BASE}/tasks/${other}/cancel`, {});
      const after = await call<{ outcome: { state: string } }>(
        pair.b.url,
        `${TASKS_BASE}/tasks/${other}/result?wait_ms=0`,
      );
      if (after.body.outcome.state !== 'cancelled')
        stale.push(`cancel ${i}: ${after.body.outcome.state}`);
    }
    expect(stale).toEqual([]);
  }, 120_000);
});
