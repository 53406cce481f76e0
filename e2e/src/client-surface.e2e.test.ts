/**
 * The Client's less-travelled answers against the real server process — not_found
 * for every per-task read and control call on a missing id, the redeliver rule of DESIGN §8 while
 * a delivery is in progress, idempotency-key convergence across the client's spellings of one
 * task (program shorthand, absent data) and within one batch, and an origin trace compared as
 * part of the command (DESIGN §5).
 */
import { Client, ProblemError, silentLogger } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { NAMESPACE, Stack, TENANT } from './test/harness.js';

const stack = new Stack('client_surface');
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  server = await stack.start({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: {
        url: 'http://127.0.0.1:9/hook',
        secret: `whsec_${Buffer.alloc(32, 7).toString('base64')}`,
        timeout_ms: 500,
      },
    }),
  });
});
afterAll(async () => {
  await stack.close();
});

function clientOf(): Client {
  return new Client({
    url: server.url,
    tenant: TENANT,
    namespace: NAMESPACE,
    logger: silentLogger,
    retries: 1,
  });
}

/** What a call rejected with, as `code/reason/status` of a ProblemError (anything else fails). */
async function problemOf(call: Promise<unknown>): Promise<string> {
  try {
    await call;
  } catch (error) {
    expect(error).toBeInstanceOf(ProblemError);
    const e = error as ProblemError;
    expect(e.retryable).toBe(false);
    return `${e.code}/${e.reason ?? '-'}/${e.status}`;
  }
  throw new Error('the call resolved');
}

describe('Client', () => {
  it('answers not_found (404, not retried) for every per-task call on a missing id', async () => {
    const c = clientOf();
    const task = await c.submit({ queue: 'q-cs-nf', program: 'p' });
    const walk = async () => {
      for await (const _ of c.history('tsk_missing')) {
        // nothing expected
      }
    };
    expect(await problemOf(walk())).toBe('not_found/-/404');
    expect(await problemOf(c.status('tsk_missing'))).toBe('not_found/-/404');
    expect(await problemOf(c.result('tsk_missing', { waitMs: 500 }))).toBe('not_found/-/404');
    expect(await problemOf(c.snapshot('tsk_missing'))).toBe('not_found/-/404');
    expect(await problemOf(c.subscriptions('tsk_missing'))).toBe('not_found/-/404');
    expect(await problemOf(c.cancel('tsk_missing'))).toBe('not_found/-/404');
    expect(await problemOf(c.attempt(task.task_id, 'att_missing'))).toBe('not_found/-/404');
    expect(await problemOf(c.redeliver('sub_missing', 1))).toBe('not_found/-/404');
    expect(await problemOf(c.subscribe('tsk_missing', { destination: 'billing' }))).toBe(
      'not_found/-/404',
    );
    expect(await problemOf(c.subscribe(task.task_id, { destination: 'nope' }))).toBe(
      'invalid_input/unknown_destination/400',
    );
  });

  it('redeliver of a generation still in progress is 409, and the subscription is unchanged', async () => {
    const c = clientOf();
    const task = await c.submit({ queue: 'q-cs-rd', program: 'p' });
    const sub = await c.subscribe(task.task_id, { destination: 'billing' });
    expect(sub.state).toBe('waiting');
    expect(await problemOf(c.redeliver(sub.id, 1))).toBe('conflict/generation_in_progress/409');
    const [after] = await c.subscriptions(task.task_id);
    expect(after).toEqual(sub);
  });

  it('one key converges across the spellings the client expands alike, and within one batch', async () => {
    const c = clientOf();
    const a = await c.submit({ queue: 'q-cs-key', program: 'p' }, { idempotencyKey: 'cs-1' });
    const b = await c.submit(
      { queue: 'q-cs-key', program: { name: 'p' }, data: null },
      { idempotencyKey: 'cs-1' },
    );
    expect(b.task_id).toBe(a.task_id);
    const batch = await c.submitBatch([
      { queue: 'q-cs-key', program: 'p', idempotencyKey: 'cs-2' },
      { queue: 'q-cs-key', program: 'p', idempotencyKey: 'cs-2' },
      { queue: 'q-cs-key', program: 'p', data: 1, idempotencyKey: 'cs-2' },
    ]);
    const [first, second, third] = batch;
    if (first === undefined || first instanceof Error) throw first ?? new Error('no answer');
    if (second === undefined || second instanceof Error) throw second ?? new Error('no answer');
    expect(second.task_id).toBe(first.task_id);
    expect(third).toBeInstanceOf(ProblemError);
    expect((third as ProblemError).code).toBe('conflict');
    expect((third as ProblemError).reason).toBe('idempotency_key_reused');
    expect((third as ProblemError).message).toContain(first.task_id);
  });

  it('an origin trace is part of the compared command: another trace under a used key is 409', async () => {
    // DESIGN §5: "Same key and same canonical command → the existing task"; the SubmitCommand
    // carries origin_trace. (README "Idempotency keys" says "the whole task is compared" and
    // recommends work-derived keys for jobs replayed from a queue: each replay's trace differs.)
    const c = clientOf();
    const t1 = { traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' };
    const t2 = { traceparent: '00-0af7651916cd43dd8448eb211c80319d-b7ad6b7169203331-01' };
    const input = { queue: 'q-cs-trace', program: 'p' };
    const a = await c.submit(input, { idempotencyKey: 'cs-trace', originTrace: t1 });
    const again = await c.submit(input, { idempotencyKey: 'cs-trace', originTrace: t1 });
    expect(again.task_id).toBe(a.task_id);
    expect(await problemOf(c.submit(input, { idempotencyKey: 'cs-trace', originTrace: t2 }))).toBe(
      'conflict/idempotency_key_reused/409',
    );
    expect(await problemOf(c.submit(input, { idempotencyKey: 'cs-trace' }))).toBe(
      'conflict/idempotency_key_reused/409',
    );
  });
});
