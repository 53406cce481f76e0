/**
 * The completion subscription routes (DESIGN §6, §8) over the completion
 * service and the in-memory store: idempotent subscribing, the per-task
 * limit, unknown aliases, tenancy, delivery state and the redeliver rule.
 */
import {
  COMPLETION_COMMAND_MAX_BYTES,
  COMPLETION_MAX_GENERATION,
  type CompletionSubscription,
  CompletionSubscriptionListSchema,
  CompletionSubscriptionSchema,
  MAX_COMPLETION_SUBSCRIPTIONS,
} from '@ledgence/contracts';
import * as v from 'valibot';
import { describe, expect, it } from 'vitest';
import { expectJson, expectProblem } from './testdata/expect.js';
import {
  ACME_DEV,
  ACME_PROD,
  createHarness,
  deliverDue,
  GLOBEX_PROD,
  type Harness,
  KEYS,
  redeliverPath,
  scopePath,
  submitTask,
  subscribeBody,
  subscriptionsPath,
} from './testdata/harness.js';

/** Subscribes over HTTP and returns the reply (any status). */
function subscribe(h: Harness, taskId: string, key: string, destination = 'billing') {
  return h.call(subscriptionsPath(ACME_PROD, taskId), {
    key: KEYS.client,
    json: subscribeBody(key, destination),
  });
}

/** The task's subscriptions over HTTP, checked against the contract's list schema. */
async function list(h: Harness, taskId: string): Promise<CompletionSubscription[]> {
  const res = await h.call(subscriptionsPath(ACME_PROD, taskId), { key: KEYS.client });
  const body = await expectJson<CompletionSubscription[]>(res, 200);
  expect(v.safeParse(CompletionSubscriptionListSchema, body).success).toBe(true);
  return body;
}

/** Redelivers over HTTP, naming `generation`. */
function redeliver(h: Harness, id: string, generation: number) {
  return h.call(redeliverPath(ACME_PROD, id), { key: KEYS.client, json: { generation } });
}

/** Cancels a queued task over HTTP, making it terminal (its deliveries become due). */
async function cancel(h: Harness, taskId: string): Promise<void> {
  const res = await h.call(`${scopePath(ACME_PROD)}/tasks/${taskId}/cancel`, {
    method: 'POST',
    key: KEYS.client,
  });
  expect(res.status).toBe(200);
}

/** A terminal task with one subscription whose first generation finished as `state`. */
async function finishedSubscription(
  h: Harness,
  state: 'delivered' | 'exhausted',
): Promise<CompletionSubscription> {
  const task = await submitTask(h, ACME_PROD, KEYS.client);
  const created = await expectJson<CompletionSubscription>(
    await subscribe(h, task.task_id, 'finished'),
    201,
  );
  await cancel(h, task.task_id);
  const after = await deliverDue(h, { state });
  return after.get(created.id) as CompletionSubscription;
}

describe('POST {scope}/tasks/{task_id}/completion-subscriptions', () => {
  it('creates (201), answers the same key with 200, and rejects the key on another destination (409)', async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    const created = await expectJson<CompletionSubscription>(
      await subscribe(h, task.task_id, 'sub-1'),
      201,
    );
    expect(v.safeParse(CompletionSubscriptionSchema, created).success).toBe(true);
    expect(created).toMatchObject({
      task_id: task.task_id,
      subscription_key: 'sub-1',
      destination: 'billing',
      state: 'waiting',
      attempts: 0,
      generation: 1,
    });
    // A subscription has no route of its own, so no Location points at one.
    const again = await subscribe(h, task.task_id, 'sub-1');
    expect(again.headers.get('location')).toBeNull();
    expect(await expectJson(again, 200)).toEqual(created);
    const conflict = await expectProblem(
      await subscribe(h, task.task_id, 'sub-1', 'audit'),
      'conflict',
    );
    expect(conflict.reason).toBe('subscription_key_reused');
    // Another key may name another destination.
    await expectJson(await subscribe(h, task.task_id, 'sub-2', 'audit'), 201);
    expect((await list(h, task.task_id)).map((s) => s.subscription_key)).toEqual([
      'sub-1',
      'sub-2',
    ]);
  });

  it('rejects an unknown destination alias with 400 and writes nothing', async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    await expectJson(await subscribe(h, task.task_id, 'sub-1'), 201);
    const before = await list(h, task.task_id);
    const unknown = await expectProblem(
      await subscribe(h, task.task_id, 'sub-2', 'https://attacker.example/hook'),
      'invalid_input',
    );
    expect(unknown).toMatchObject({ reason: 'unknown_destination', path: '$.destination' });
    // Not even under the key of an existing subscription.
    await expectProblem(await subscribe(h, task.task_id, 'sub-1', 'nope'), 'invalid_input');
    expect(await list(h, task.task_id)).toEqual(before);
  });

  it(`accepts ${MAX_COMPLETION_SUBSCRIPTIONS} subscriptions per task and answers the next with 409 limit_exceeded`, async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    for (let i = 1; i <= MAX_COMPLETION_SUBSCRIPTIONS; i++) {
      await expectJson(await subscribe(h, task.task_id, `sub-${i}`), 201);
    }
    const over = await expectProblem(
      await subscribe(h, task.task_id, 'one-too-many'),
      'limit_exceeded',
    );
    expect(over.reason).toBe('max_completion_subscriptions');
    // A key already held is still answered at the limit: replays stay safe.
    await expectJson(await subscribe(h, task.task_id, 'sub-1'), 200);
    expect(await list(h, task.task_id)).toHaveLength(MAX_COMPLETION_SUBSCRIPTIONS);
    // The limit is per task.
    const other = await submitTask(h, ACME_PROD, KEYS.client);
    await expectJson(await subscribe(h, other.task_id, 'sub-1'), 201);
  });

  it("makes a terminal task's new subscription due at once", async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    await cancel(h, task.task_id);
    const created = await expectJson<CompletionSubscription>(
      await subscribe(h, task.task_id, 'late'),
      201,
    );
    expect(created.state).toBe('due');
    expect(created.next_attempt_at).toEqual(expect.any(Number));
  });

  it('checks content type, size, body, query and path before anything else', async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    const path = subscriptionsPath(ACME_PROD, task.task_id);
    const text = JSON.stringify(subscribeBody('k'));
    await expectProblem(
      await h.call(path, {
        key: KEYS.client,
        body: text,
        headers: { 'content-type': 'text/plain' },
      }),
      'unsupported_media_type',
    );
    await expectProblem(
      await h.call(path, {
        key: KEYS.client,
        body: text + ' '.repeat(COMPLETION_COMMAND_MAX_BYTES + 1 - text.length),
        headers: { 'content-type': 'application/json' },
      }),
      'payload_too_large',
    );
    for (const json of [
      {},
      { subscription_key: 'k' },
      { ...subscribeBody('k'), url: 'https://x.example' },
      { subscription_key: ' k', destination: 'billing' },
      { subscription_key: 'k', destination: 1 },
    ]) {
      await expectProblem(await h.call(path, { key: KEYS.client, json }), 'invalid_input');
    }
    await expectProblem(await h.call(path, { method: 'POST', key: KEYS.client }), 'invalid_input');
    await expectProblem(
      await h.call(`${path}?x=1`, { key: KEYS.client, json: subscribeBody('k') }),
      'invalid_input',
    );
    await expectProblem(
      await h.call(subscriptionsPath(ACME_PROD, ' x'), {
        key: KEYS.client,
        json: subscribeBody('k'),
      }),
      'invalid_input',
    );
    await expectProblem(
      await h.call(subscriptionsPath(ACME_PROD, 'a\u0000b'), { key: KEYS.client }),
      'invalid_input',
    );
    expect(h.calls['completions.subscribe']).toBeUndefined();
    expect(await list(h, task.task_id)).toEqual([]);
  });
});

describe('tenancy of the completion routes', () => {
  it('answers 404 for an unknown task and for a task or subscription of another tenant', async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    const created = await expectJson<CompletionSubscription>(
      await subscribe(h, task.task_id, 'sub-1'),
      201,
    );
    await expectProblem(await subscribe(h, 'tsk_unknown', 'sub-1'), 'not_found');
    await expectProblem(
      await h.call(subscriptionsPath(ACME_PROD, 'tsk_unknown'), { key: KEYS.client }),
      'not_found',
    );
    await expectProblem(await redeliver(h, 'sub_unknown', 1), 'not_found');
    // globex names acme's ids in its own scope: indistinguishable from unknown ids.
    const globex = { key: KEYS.other };
    await expectProblem(
      await h.call(subscriptionsPath(GLOBEX_PROD, task.task_id), {
        ...globex,
        json: subscribeBody('sub-1'),
      }),
      'not_found',
    );
    await expectProblem(
      await h.call(subscriptionsPath(GLOBEX_PROD, task.task_id), globex),
      'not_found',
    );
    await expectProblem(
      await h.call(redeliverPath(GLOBEX_PROD, created.id), { ...globex, json: { generation: 1 } }),
      'not_found',
    );
    // So is another namespace of the same tenant.
    await expectProblem(
      await h.call(subscriptionsPath(ACME_DEV, task.task_id), { key: KEYS.client }),
      'not_found',
    );
    expect(await list(h, task.task_id)).toEqual([created]);
  });

  it('answers 403 outside the key binding and without the client role', async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    const created = await expectJson<CompletionSubscription>(
      await subscribe(h, task.task_id, 'sub-1'),
      201,
    );
    const requests = [
      { path: subscriptionsPath(ACME_PROD, task.task_id), json: subscribeBody('sub-2') },
      { path: subscriptionsPath(ACME_PROD, task.task_id) },
      { path: redeliverPath(ACME_PROD, created.id), json: { generation: 1 } },
    ];
    for (const request of requests) {
      const role = await h.call(request.path, { key: KEYS.worker, json: request.json });
      expect((await expectProblem(role, 'forbidden')).reason).toBe('role');
      const foreign = await h.call(request.path, { key: KEYS.other, json: request.json });
      expect((await expectProblem(foreign, 'forbidden')).reason).toBe('scope');
    }
    const namespace = await h.call(subscriptionsPath(ACME_DEV, task.task_id), {
      key: KEYS.prodClient,
    });
    expect((await expectProblem(namespace, 'forbidden')).reason).toBe('scope');
    expect(h.calls['completions.redeliver']).toBeUndefined();
  });
});

describe('GET {scope}/tasks/{task_id}/completion-subscriptions', () => {
  it('shows each subscription with its delivery state', async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    expect(await list(h, task.task_id)).toEqual([]);
    await expectJson(await subscribe(h, task.task_id, 'a'), 201);
    await expectJson(await subscribe(h, task.task_id, 'b', 'audit'), 201);
    expect((await list(h, task.task_id)).map((s) => s.state)).toEqual(['waiting', 'waiting']);
    await cancel(h, task.task_id);
    const due = await list(h, task.task_id);
    expect(due.map((s) => s.state)).toEqual(['due', 'due']);
    for (const s of due) expect(s.next_attempt_at).toEqual(expect.any(Number));
    await deliverDue(h, { state: 'delivered' });
    const delivered = await list(h, task.task_id);
    for (const s of delivered) {
      expect(s).toMatchObject({ state: 'delivered', attempts: 1, last_status_code: 204 });
      expect(s.delivered_at).toEqual(expect.any(Number));
      expect(s.next_attempt_at).toBeUndefined();
    }
  });

  it('rejects a query string', async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    await expectProblem(
      await h.call(`${subscriptionsPath(ACME_PROD, task.task_id)}?state=due`, { key: KEYS.client }),
      'invalid_input',
    );
  });
});

describe('POST {scope}/completion-subscriptions/{id}/redeliver', () => {
  it('answers 409 while the current generation is waiting or due', async () => {
    const h = createHarness();
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    const created = await expectJson<CompletionSubscription>(
      await subscribe(h, task.task_id, 'sub-1'),
      201,
    );
    const waiting = await expectProblem(await redeliver(h, created.id, 1), 'conflict');
    expect(waiting.reason).toBe('generation_in_progress');
    await cancel(h, task.task_id);
    await expectProblem(await redeliver(h, created.id, 1), 'conflict');
    // A generation that does not exist yet is a conflict too.
    expect((await expectProblem(await redeliver(h, created.id, 2), 'conflict')).reason).toBe(
      'generation_mismatch',
    );
    const [after] = await list(h, task.task_id);
    expect(after).toMatchObject({ state: 'due', generation: 1 });
  });

  it.each(['delivered', 'exhausted'] as const)(
    'starts the next generation of a %s delivery once, and replays the request unchanged',
    async (state) => {
      const h = createHarness();
      const finished = await finishedSubscription(h, state);
      expect(finished).toMatchObject({ state, generation: 1, attempts: 1 });
      const next = await expectJson<CompletionSubscription>(
        await redeliver(h, finished.id, 1),
        200,
      );
      expect(next).toMatchObject({
        id: finished.id,
        event_id: finished.event_id,
        state: 'due',
        generation: 2,
        attempts: 0,
      });
      expect(next.last_status_code).toBeUndefined();
      // The same request again (a network retry) starts nothing.
      expect(await expectJson(await redeliver(h, finished.id, 1), 200)).toEqual(next);
      // Generation 2 is still due: redelivering it is a conflict.
      await expectProblem(await redeliver(h, finished.id, 2), 'conflict');
      await expectProblem(await redeliver(h, finished.id, 3), 'conflict');
    },
  );

  it(`stops at generation ${COMPLETION_MAX_GENERATION} with 409 limit_exceeded`, async () => {
    const h = createHarness();
    const finished = await finishedSubscription(h, 'delivered');
    for (let generation = 1; generation < COMPLETION_MAX_GENERATION; generation++) {
      const next = await expectJson<CompletionSubscription>(
        await redeliver(h, finished.id, generation),
        200,
      );
      expect(next.generation).toBe(generation + 1);
      await deliverDue(h, { state: 'delivered' });
    }
    const last = await expectProblem(
      await redeliver(h, finished.id, COMPLETION_MAX_GENERATION),
      'limit_exceeded',
    );
    expect(last.reason).toBe('max_completion_generation');
  });

  it('rejects bad bodies and path parameters with 400 before the service', async () => {
    const h = createHarness();
    const finished = await finishedSubscription(h, 'delivered');
    for (const json of [
      {},
      { generation: 0 },
      { generation: COMPLETION_MAX_GENERATION + 1 },
      { generation: 1.5 },
      { generation: '1' },
      { generation: 1, reason: 'x' },
    ]) {
      await expectProblem(
        await h.call(redeliverPath(ACME_PROD, finished.id), { key: KEYS.client, json }),
        'invalid_input',
      );
    }
    await expectProblem(
      await h.call(redeliverPath(ACME_PROD, finished.id), { method: 'POST', key: KEYS.client }),
      'invalid_input',
    );
    await expectProblem(
      await h.call(redeliverPath(ACME_PROD, 'x'.repeat(300)), {
        key: KEYS.client,
        json: { generation: 1 },
      }),
      'invalid_input',
    );
    await expectProblem(
      await h.call(`${redeliverPath(ACME_PROD, finished.id)}?generation=1`, {
        key: KEYS.client,
        json: { generation: 1 },
      }),
      'invalid_input',
    );
    await expectProblem(
      await h.call(redeliverPath(ACME_PROD, finished.id), {
        key: KEYS.client,
        body: '{"generation":1}',
        headers: { 'content-type': 'text/plain' },
      }),
      'unsupported_media_type',
    );
    expect(h.calls['completions.redeliver']).toBeUndefined();
  });
});

describe('without a completion service', () => {
  it('does not mount the completion routes', async () => {
    const h = createHarness({ completions: undefined });
    const task = await submitTask(h, ACME_PROD, KEYS.client);
    for (const [path, json] of [
      [subscriptionsPath(ACME_PROD, task.task_id), subscribeBody('k')],
      [subscriptionsPath(ACME_PROD, task.task_id), undefined],
      [redeliverPath(ACME_PROD, 'sub_1'), { generation: 1 }],
    ] as const) {
      await expectProblem(await h.call(path, { key: KEYS.client, json }), 'not_found');
    }
  });
});
