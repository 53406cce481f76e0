/**
 * The SDK's own check of MAX_SUBMIT_BATCH at its edge, without a network: a batch of
 * exactly the limit passes the count check (every entry is then refused locally, so nothing is
 * sent), one more is a TypeError before anything is validated or sent.
 */
import { MAX_SUBMIT_BATCH, PRIORITY_MAX } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { Client } from './client.js';
import { ProblemError } from './errors.js';

// Port 9 (discard) on loopback: any request that did go out would fail as a transport error.
const client = new Client({
  url: 'http://127.0.0.1:9',
  tenant: 'acme',
  namespace: 'prod',
  retries: 0,
});

/** An entry the local validation refuses (priority one above the maximum). */
const invalid = (i: number) => ({
  queue: 'q',
  program: 'p',
  priority: PRIORITY_MAX + 1,
  idempotencyKey: `k-${i}`,
});

describe('Client.submitBatch at MAX_SUBMIT_BATCH', () => {
  it(`takes ${MAX_SUBMIT_BATCH} entries (answered item by item)`, async () => {
    const entries = Array.from({ length: MAX_SUBMIT_BATCH }, (_, i) => invalid(i));
    const answers = await client.submitBatch(entries);
    expect(answers).toHaveLength(MAX_SUBMIT_BATCH);
    expect(answers.every((a) => a instanceof ProblemError && a.code === 'invalid_input')).toBe(
      true,
    );
    expect((answers[MAX_SUBMIT_BATCH - 1] as ProblemError).problem.path).toBe(
      `$.commands[${MAX_SUBMIT_BATCH - 1}].input.priority`,
    );
  });

  it(`refuses ${MAX_SUBMIT_BATCH + 1} entries and an empty batch with a TypeError`, async () => {
    const entries = Array.from({ length: MAX_SUBMIT_BATCH + 1 }, (_, i) => invalid(i));
    await expect(client.submitBatch(entries)).rejects.toThrow(TypeError);
    await expect(client.submitBatch([])).rejects.toThrow(TypeError);
  });
});
