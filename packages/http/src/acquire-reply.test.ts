/**
 * An `acquire:batch` reply is bounded (ACQUIRE_BATCH_REPLY_MAX_BYTES): every item within the
 * limits — at most MAX_SESSION_CONCURRENCY commands, each assignment carrying at most
 * SUBMISSION_DATA_MAX_BYTES of data — could otherwise sum to a reply too large to encode, a 5xx
 * after the claims were written (and again on every replay of the same sequences).
 */
import {
  ACQUIRE_BATCH_REPLY_MAX_BYTES,
  type AcquireReply,
  SUBMISSION_DATA_MAX_BYTES,
} from '@ledgence/contracts';
import { expect, it } from 'vitest';
import { expectJson } from './testdata/expect.js';
import {
  ACME_PROD,
  acquireBody,
  createHarness,
  KEYS,
  openSession,
  submitBody,
} from './testdata/harness.js';

it('answers a batch of large assignments 200 within the bound, the slots past it empty', async () => {
  const h = createHarness();
  const data = 'x'.repeat(SUBMISSION_DATA_MAX_BYTES - 2);
  const tasks = Math.ceil(ACQUIRE_BATCH_REPLY_MAX_BYTES / SUBMISSION_DATA_MAX_BYTES) + 4;
  for (let i = 0; i < tasks; i++) {
    await h.service.submit(submitBody(ACME_PROD, `big-${i}`, { data }));
  }
  const session = await openSession(h, ACME_PROD, KEYS.worker, tasks);
  const commands = Array.from({ length: tasks }, (_, slot) => acquireBody(session, slot, 1));
  const res = await h.call('/v1/worker/acquire:batch', { key: KEYS.worker, json: { commands } });
  const text = await res.clone().text();
  const { replies } = await expectJson<{ replies: AcquireReply[] }>(res, 200);
  expect(Buffer.byteLength(text)).toBeLessThanOrEqual(ACQUIRE_BATCH_REPLY_MAX_BYTES + 64 * 1024);
  const assigned = replies.filter((r) => r.disposition === 'assigned').length;
  expect(assigned).toBeGreaterThan(0);
  expect(assigned).toBeLessThan(tasks);
  const queued = await h.service.listTasks(ACME_PROD, { filters: { state: 'queued' }, limit: 500 });
  expect(queued.tasks).toHaveLength(tasks - assigned);
  // Some 20 MiB of submissions: ~2 s alone, past vitest's 5 s default on a loaded 2-core machine.
}, 30_000);
