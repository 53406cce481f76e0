/**
 * A problem's detail and path are scrubbed when the message "quotes" what the request
 * supplied. A one-letter program or queue name ("p", "a") occurs inside the server's own words;
 * that must not turn a precise, input-free message into the generic "The request is not valid."
 * with no path, which does not tell the user what to fix (project rule "Errors say what to do";
 * DESIGN §6 problem documents with a stable code).
 */
import { describe, expect, it } from 'vitest';
import { expectProblem } from './testdata/expect.js';
import { ACME_PROD, createHarness, KEYS, scopePath, submitBody } from './testdata/harness.js';

const TASKS = `${scopePath(ACME_PROD)}/tasks`;

describe('problem details of a submit with short names', () => {
  it('a timeout_ms within the safety margin names its path and the minimum even when the program is called "p"', async () => {
    const h = createHarness();
    const res = await h.call(TASKS, {
      key: KEYS.client,
      json: submitBody(ACME_PROD, 'short-p', { program: { name: 'p' }, timeout_ms: 5_000 }),
    });
    // "p" occurs in "...lease safety margin..." and in "$.input.timeout_ms": neither quotes the
    // input, so neither is scrubbed.
    expect(await expectProblem(res, 'invalid_input')).toMatchObject({
      path: '$.input.timeout_ms',
      detail: expect.stringContaining('use at least 5500'),
    });
  });
});
