/**
 * Problem bodies never carry rejected input, and no body, header or query
 * produces a 5xx.
 */
import { ContractError, MIN_RETENTION_MS } from '@ledgence/contracts';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { problemOf } from './problem.js';
import {
  ACME_PROD,
  acquireBody,
  assignTask,
  createHarness,
  KEYS,
  openSession,
  policyPath,
  redeliverPath,
  scopePath,
  settleBody,
  submitBody,
  submitTask,
  subscribeBody,
  subscriptionsPath,
} from './testdata/harness.js';

const MARKER = 'QQMARKER9041';
const TASKS = `${scopePath(ACME_PROD)}/tasks`;
const POLICY = policyPath(ACME_PROD);

describe('problem documents never echo rejected input', () => {
  it('does not echo markers in queries, headers, path parameters or bodies', async () => {
    const h = createHarness();
    const { session, assignment } = await assignTask(h);
    const owner = assignment.lease.owner;
    const task = await submitTask(h);
    const subscriptions = subscriptionsPath(ACME_PROD, task.task_id);
    // A subscription whose key is the marker, to provoke a conflict that names it.
    const { subscription } = await h.completions.subscribe(
      ACME_PROD,
      task.task_id,
      subscribeBody(MARKER),
    );
    const requests: [string, Parameters<typeof h.call>[1]][] = [
      // Queries.
      [`${TASKS}?state=${MARKER}`, { key: KEYS.client }],
      [`${TASKS}?limit=${MARKER}`, { key: KEYS.client }],
      [`${TASKS}?cursor=${MARKER}`, { key: KEYS.client }],
      [
        `${TASKS}?cursor=${Buffer.from(`[1,"x",1,"${MARKER}"]`).toString('base64url')}`,
        { key: KEYS.client },
      ],
      [`${TASKS}?label.team=%20${MARKER}`, { key: KEYS.client }],
      [`${TASKS}?submitted_from=${MARKER}`, { key: KEYS.client }],
      [`${TASKS}?${MARKER}=1`, { key: KEYS.client }],
      [`${TASKS}/t1/result?wait_ms=${MARKER}`, { key: KEYS.client }],
      [`${TASKS}/t1/history?after_sequence=${MARKER}`, { key: KEYS.client }],
      // Headers.
      [TASKS, { key: `${MARKER}` }],
      [TASKS, { headers: { authorization: `Basic ${MARKER}` } }],
      [TASKS, { key: KEYS.client, headers: { 'x-request-id': `${MARKER} !` } }],
      [
        TASKS,
        {
          key: KEYS.client,
          json: { input: submitBody(ACME_PROD, 'x').input },
          headers: { 'idempotency-key': `${MARKER}${'x'.repeat(300)}` },
        },
      ],
      [TASKS, { key: KEYS.client, body: '{}', headers: { 'content-type': `text/${MARKER}` } }],
      // Path parameters the service does not know.
      [`${TASKS}/${MARKER}`, { key: KEYS.client }],
      [`${TASKS}/${MARKER}/attempts/${MARKER}`, { key: KEYS.client }],
      [`${TASKS}/${MARKER}/cancel`, { method: 'POST', key: KEYS.client }],
      [`/v1/tenants/${MARKER}/namespaces/prod/tasks`, { key: KEYS.client }],
      [`/v1/tenants/acme/namespaces/${MARKER}%00/tasks`, { key: KEYS.client }],
      [`/v1/worker/sessions/${MARKER}/extend`, { key: KEYS.worker, json: { scope: ACME_PROD } }],
      [`/${MARKER}`, {}],
      [subscriptionsPath(ACME_PROD, MARKER), { key: KEYS.client }],
      [subscriptionsPath(ACME_PROD, MARKER), { key: KEYS.client, json: subscribeBody('k') }],
      [subscriptionsPath(ACME_PROD, `${MARKER}\t`), { key: KEYS.client }],
      [redeliverPath(ACME_PROD, MARKER), { key: KEYS.client, json: { generation: 1 } }],
      [
        redeliverPath(ACME_PROD, `x${MARKER}`.repeat(30)),
        { key: KEYS.client, json: { generation: 1 } },
      ],
      [`${POLICY}/preview?limit=${MARKER}`, { key: KEYS.admin }],
      [`${POLICY}/preview?${MARKER}=1`, { key: KEYS.admin }],
      [`${POLICY}?${MARKER}=1`, { key: KEYS.admin }],
      [policyPath({ tenant_id: 'acme', namespace: `${MARKER} ` }), { key: KEYS.admin }],
      // Subscriptions the service rejects, naming the marker.
      [subscriptions, { key: KEYS.client, json: subscribeBody(MARKER, 'audit') }],
      [subscriptions, { key: KEYS.client, json: subscribeBody('k', MARKER) }],
      [subscriptions, { key: KEYS.client, json: subscribeBody(MARKER, MARKER) }],
      [redeliverPath(ACME_PROD, subscription.id), { key: KEYS.client, json: { generation: 2 } }],
      // Bodies that decode but name things the service rejects.
      [
        '/v1/worker/acquire',
        { key: KEYS.worker, json: { ...acquireBody(session, 0, 1), worker_session_id: MARKER } },
      ],
      [
        '/v1/worker/acquire',
        { key: KEYS.worker, json: { ...acquireBody(session, 1, 1), queue: MARKER } },
      ],
      [
        '/v1/worker/renew',
        {
          key: KEYS.worker,
          json: { owner: { ...owner, attempt_id: MARKER }, sequence: 1, intent: 'dispatch' },
        },
      ],
      [
        '/v1/worker/renew',
        {
          key: KEYS.worker,
          json: { owner: { ...owner, lease_id: MARKER }, sequence: 1, intent: 'dispatch' },
        },
      ],
      [
        '/v1/worker/settle',
        {
          key: KEYS.worker,
          json: { ...settleBody(assignment), owner: { ...owner, task_id: MARKER } },
        },
      ],
      [
        '/v1/worker/quiescence',
        { key: KEYS.worker, json: { ...owner, worker_session_id: MARKER } },
      ],
      [
        '/v1/worker/sessions',
        {
          key: KEYS.worker,
          json: { scope: { tenant_id: MARKER, namespace: 'x' }, queue: 'q', concurrency: 1 },
        },
      ],
      // Bodies the decoder rejects, the marker in a value.
      [
        '/v1/worker/acquire',
        { key: KEYS.worker, json: { ...acquireBody(session, 0, 1), sequence: MARKER } },
      ],
      ['/v1/worker/renew', { key: KEYS.worker, json: { owner, sequence: 2, intent: MARKER } }],
      [TASKS, { key: KEYS.client, json: submitBody(ACME_PROD, ` ${MARKER}`) }],
      [TASKS, { key: KEYS.client, json: submitBody(ACME_PROD, 'k', { queue: `${MARKER}\n` }) }],
      [
        TASKS,
        { key: KEYS.client, json: submitBody(ACME_PROD, 'k', { labels: { a: `${MARKER} ` } }) },
      ],
      [
        TASKS,
        { key: KEYS.client, json: submitBody(ACME_PROD, 'k', { data: 1e300, queue: MARKER }) },
      ],
      [
        `${TASKS}:batch`,
        {
          key: KEYS.client,
          json: { commands: [submitBody(ACME_PROD, `${MARKER}\t`), { x: MARKER }] },
        },
      ],
      [
        '/v1/worker/renew:batch',
        {
          key: KEYS.worker,
          json: {
            commands: [{ owner: { ...owner, lease_id: MARKER }, sequence: 1, intent: 'dispatch' }],
          },
        },
      ],
      [subscriptions, { key: KEYS.client, json: subscribeBody(`${MARKER}\n`) }],
      [subscriptions, { key: KEYS.client, json: { ...subscribeBody('k'), url: MARKER } }],
      [redeliverPath(ACME_PROD, 'sub_1'), { key: KEYS.client, json: { generation: MARKER } }],
      [POLICY, { method: 'PUT', key: KEYS.admin, json: { retention_ms: MARKER } }],
      [
        POLICY,
        { method: 'PUT', key: KEYS.admin, json: { retention_ms: MIN_RETENTION_MS, x: MARKER } },
      ],
    ];
    for (const [path, init] of requests) {
      const res = await h.call(path, init);
      const text = await res.text();
      expect({ path, status: res.status, text }).not.toEqual(
        expect.objectContaining({ text: expect.stringContaining(MARKER) }),
      );
      expect(res.status).toBeLessThan(500);
      for (const [name, value] of res.headers) {
        expect({ name, value }).not.toEqual(
          expect.objectContaining({ value: expect.stringContaining(MARKER) }),
        );
      }
    }
  });

  it('replaces a service message that quotes request input by the generic detail', () => {
    const error = new ContractError('session_not_found', `worker session ${MARKER} was not found`);
    expect(problemOf(error, { supplied: [MARKER] }).detail).toBe(
      'The worker session was not found.',
    );
    expect(problemOf(error).detail).toContain(MARKER);
  });
});

describe('no request content produces a 5xx', () => {
  const routes = [
    ['POST', TASKS],
    ['POST', `${TASKS}:batch`],
    ['GET', TASKS],
    ['GET', `${TASKS}/t1`],
    ['GET', `${TASKS}/t1/result`],
    ['GET', `${TASKS}/t1/history`],
    ['POST', `${TASKS}/t1/cancel`],
    ['POST', '/v1/worker/sessions'],
    ['POST', '/v1/worker/sessions/s1/extend'],
    ['POST', '/v1/worker/acquire'],
    ['POST', '/v1/worker/acquire:batch'],
    ['POST', '/v1/worker/renew'],
    ['POST', '/v1/worker/renew:batch'],
    ['POST', '/v1/worker/settle'],
    ['POST', '/v1/worker/settle:batch'],
    ['POST', '/v1/worker/quiescence'],
    ['POST', `${TASKS}/t1/completion-subscriptions`],
    ['GET', `${TASKS}/t1/completion-subscriptions`],
    ['POST', `${scopePath(ACME_PROD)}/completion-subscriptions/s1/redeliver`],
    ['GET', POLICY],
    ['PUT', POLICY],
    ['GET', `${POLICY}/preview`],
  ] as const;

  it('answers arbitrary bodies, queries and headers below 500', async () => {
    const h = createHarness({ longPollMaxMs: 0 });
    await openSession(h);
    const jsonish = fc.oneof(
      fc.json(),
      fc.string(),
      fc.uint8Array({ maxLength: 64 }).map((b) => Buffer.from(b).toString('latin1')),
      fc.jsonValue().map((v) => JSON.stringify({ commands: [v] })),
      fc.jsonValue().map((v) => JSON.stringify({ scope: ACME_PROD, queue: v, concurrency: v })),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...routes),
        jsonish,
        fc.string({ maxLength: 40 }),
        fc.constantFrom('application/json', 'text/plain', '', 'application/json; x=y'),
        fc.string({ maxLength: 20 }),
        async ([method, path], body, query, contentType, header) => {
          const headers: Record<string, string> = {};
          if (contentType !== '') headers['content-type'] = contentType;
          const safe = header.replace(/[^\x20-\x7e]/g, '');
          headers['idempotency-key'] = safe;
          headers['x-request-id'] = safe;
          const res = await h.call(
            `${path}?${encodeURIComponent(query)}=${encodeURIComponent(query)}`,
            {
              method,
              key: KEYS.admin,
              headers,
              ...(method === 'GET' ? {} : { body }),
            },
          );
          expect(res.status).toBeLessThan(500);
          await res.arrayBuffer();
        },
      ),
      { numRuns: 400 },
    );
  });
});
