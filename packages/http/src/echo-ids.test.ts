/**
 * Only the `*_id` strings of a decoded command (and path, query and
 * header values) are collected for the scrub. Service refusals of commands whose other strings
 * (namespace, queue, program, labels, idempotency and subscription keys) carry a marker must
 * still not echo it.
 */
import { describe, expect, it } from 'vitest';
import {
  ACME_PROD,
  assignTask,
  createHarness,
  KEYS,
  openSession,
  scopePath,
  settleBody,
  submitBody,
  submitTask,
  subscribeBody,
  subscriptionsPath,
} from './testdata/harness.js';

const MARKER = 'QQR49AMARK';
const TASKS = `${scopePath(ACME_PROD)}/tasks`;

describe('service refusals of commands whose non-id strings carry a marker', () => {
  it('do not echo it (409s, 403s, 404s, batch items)', async () => {
    const h = createHarness();
    const marked = { queue: MARKER, program: { name: MARKER }, labels: { [MARKER]: MARKER } };
    // A first submit, then the same key with another command: a conflict.
    const first = await h.call(TASKS, {
      key: KEYS.client,
      json: submitBody(ACME_PROD, MARKER, marked),
    });
    expect(first.status).toBe(201);
    const task = await submitTask(h);
    const { session, assignment } = await assignTask(h);
    const other = await openSession(h);
    await h.completions.subscribe(ACME_PROD, task.task_id, subscribeBody(MARKER, 'billing'));
    const requests: [string, Parameters<typeof h.call>[1]][] = [
      [TASKS, { key: KEYS.client, json: submitBody(ACME_PROD, MARKER, { ...marked, data: 2 }) }],
      [
        `${TASKS}:batch`,
        {
          key: KEYS.client,
          json: {
            commands: [
              submitBody(ACME_PROD, MARKER, { ...marked, data: 3 }),
              submitBody(ACME_PROD, `${MARKER}-2`, { ...marked, timeout_ms: 1000 }),
            ],
          },
        },
      ],
      [
        TASKS,
        {
          key: KEYS.client,
          json: submitBody(ACME_PROD, `${MARKER}-3`, { ...marked, timeout_ms: 1000 }),
        },
      ],
      // A session in a namespace the key may not use, the namespace and queue the marker.
      [
        '/v1/worker/sessions',
        {
          key: KEYS.prodWorker,
          json: { scope: { tenant_id: 'acme', namespace: MARKER }, queue: MARKER, concurrency: 1 },
        },
      ],
      // An acquire naming a queue other than its session's.
      [
        '/v1/worker/acquire',
        {
          key: KEYS.both,
          json: {
            scope: other.scope,
            queue: MARKER,
            worker_session_id: other.id,
            consumer_id: 0,
            sequence: 1,
          },
        },
      ],
      // An acquire in a namespace the session is not in.
      [
        '/v1/worker/acquire',
        {
          key: KEYS.both,
          json: {
            scope: { tenant_id: 'acme', namespace: MARKER },
            queue: 'email',
            worker_session_id: session.id,
            consumer_id: 1,
            sequence: 1,
          },
        },
      ],
      // A settle whose owner names another namespace.
      [
        '/v1/worker/settle',
        {
          key: KEYS.both,
          json: {
            ...settleBody(assignment),
            owner: { ...assignment.lease.owner, scope: { tenant_id: 'acme', namespace: MARKER } },
          },
        },
      ],
      // The subscription key reused for another destination.
      [
        subscriptionsPath(ACME_PROD, task.task_id),
        { key: KEYS.client, json: subscribeBody(MARKER, 'audit') },
      ],
    ];
    for (const [path, init] of requests) {
      const res = await h.call(path, init);
      const text = await res.text();
      expect({ path, status: res.status, text }).not.toEqual(
        expect.objectContaining({ text: expect.stringContaining(MARKER) }),
      );
      expect(res.status).toBeLessThan(500);
      expect(res.status >= 400 || /"status":4/.test(text), `${path} ${text}`).toBe(true);
    }
  });
});
