/**
 * Completion callbacks as a receiver sees them (DESIGN §8), through a real server
 * process on real PostgreSQL and a real receiver:
 * - every string context attribute of the delivered event is a CloudEvents 1.0 `String`
 *   (no control characters, no Unicode noncharacters): names beyond ASCII go out as given, and
 *   names holding a noncharacter are refused at submit;
 * - the event's `time` is the task's `terminal_at` (the terminal task's immutable facts), also
 *   when the subscription comes after the end, and its bytes are the same after a redelivery;
 * - terminal paths not covered elsewhere: cancelled while active (the worker settles after the
 *   cancel request), a settlement with unconfirmed quiescence (no event until the task is
 *   terminal: at confirm_quiescence, or at the authority deadline);
 * - the subscription view after a delivery.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { CompletionSubscription, TaskStatus } from '@ledgence/contracts';
import { Client, silentLogger } from '@ledgence/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { Stack, sleep, TENANT, until } from './test/harness.js';
import { type ReceivedPost, type Receiver, startReceiver } from './test/receiver.js';
import { call, claimNext, settleBody, submitTask, TASKS_BASE, taskBody } from './test/wire.js';

const KEY = Buffer.alloc(32, 0x41);
const SECRET = `whsec_${KEY.toString('base64')}`;

/** A post of a completion event: its CloudEvent, typed as far as these tests read it. */
type Post = ReceivedPost & {
  event: Record<string, unknown> & { data: Record<string, unknown>; subject: string };
};

const stack = new Stack('callbacks_receiver');
let receiver: Receiver;
let server: ServerProcess;

beforeAll(async () => {
  await stack.open();
  receiver = await startReceiver(() => 0, 204);
  server = await stack.start({
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url: receiver.url, secret: SECRET, timeout_ms: 2_000 },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
    LEDGENCE_CLEANUP_GRACE_MS: '1000',
    LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
  });
}, 120_000);

afterAll(async () => {
  await stack.close();
  await receiver.close();
});

const postsOf = (taskId: string) =>
  (receiver.posts as Post[]).filter((p) => p.event.subject === taskId);

async function firstPost(taskId: string): Promise<Post> {
  await until(() => postsOf(taskId).length > 0, 30_000, `the event of ${taskId}`);
  return postsOf(taskId)[0] as Post;
}

/** The README's verifier, by hand: a v1 HMAC-SHA256 of `id.timestamp.body` with the key. */
function verifies(post: Post): boolean {
  const id = String(post.headers['webhook-id']);
  const ts = String(post.headers['webhook-timestamp']);
  const want = createHmac('sha256', KEY).update(`${id}.${ts}.`).update(post.body).digest();
  return String(post.headers['webhook-signature'])
    .split(' ')
    .some((sig) => {
      const got = Buffer.from(sig.slice(3), 'base64');
      return sig.startsWith('v1,') && got.length === want.length && timingSafeEqual(got, want);
    });
}

/**
 * The code points CloudEvents 1.0 (spec.md, "Type System", `String`) disallows in a String
 * attribute: controls U+0000-U+001F and U+007F-U+009F, Unicode noncharacters (U+FDD0-U+FDEF and
 * the last two code points of every plane), lone surrogates.
 */
function disallowedInCloudEventsString(value: string): string[] {
  const bad: string[] = [];
  for (const ch of value) {
    const cp = ch.codePointAt(0) as number;
    const nonchar = (cp >= 0xfdd0 && cp <= 0xfdef) || (cp & 0xfffe) === 0xfffe;
    const control = cp <= 0x1f || (cp >= 0x7f && cp <= 0x9f);
    const surrogate = cp >= 0xd800 && cp <= 0xdfff;
    if (nonchar || control || surrogate) bad.push(`U+${cp.toString(16).toUpperCase()}`);
  }
  return bad;
}

async function statusOf(taskId: string): Promise<TaskStatus> {
  const reply = await call<TaskStatus>(server.url, `${TASKS_BASE}/tasks/${taskId}`);
  expect(reply.status).toBe(200);
  return reply.body;
}

async function subscribe(taskId: string, key = 'k1'): Promise<CompletionSubscription> {
  const reply = await call<CompletionSubscription>(
    server.url,
    `${TASKS_BASE}/tasks/${taskId}/completion-subscriptions`,
    { subscription_key: key, destination: 'billing' },
  );
  expect([200, 201]).toContain(reply.status);
  return reply.body;
}

describe('the event a receiver gets is a valid CloudEvent', () => {
  it('for names beyond ASCII: every string attribute is a CloudEvents String, the names as given', async () => {
    const namespace = 'ns-\u00e9\ufffd';
    const queue = 'j\u00f6bs-\u{1f600}';
    const c = new Client({
      url: server.url,
      tenant: TENANT,
      namespace,
      logger: silentLogger,
      backoff: { baseMs: 50, maxMs: 500 },
    });
    const task = await c.submit({ queue, program: 'never', data: null });
    await c.subscribe(task.task_id, { destination: 'billing', subscriptionKey: 'unicode' });
    expect(await c.cancel(task.task_id)).toBe('cancelled');
    const post = await firstPost(task.task_id);
    expect(verifies(post)).toBe(true);
    expect([post.event.ldgnamespace, post.event.ldgqueue]).toEqual([namespace, queue]);
    const problems: Record<string, string[]> = {};
    for (const [name, value] of Object.entries(post.event)) {
      if (name === 'data' || typeof value !== 'string') continue;
      const bad = disallowedInCloudEventsString(value);
      if (bad.length > 0) problems[name] = bad;
    }
    expect(problems).toEqual({});
  }, 60_000);

  it('a queue or namespace holding a Unicode noncharacter, which no CloudEvents String may hold, is refused 400 and creates nothing', async () => {
    const queue = await call<{ code: string; path: string; detail: string }>(
      server.url,
      `${TASKS_BASE}/tasks`,
      taskBody('nonchar-queue', 'jobs\ufdd0'),
    );
    expect([queue.status, queue.body.code, queue.body.path]).toEqual([
      400,
      'invalid_input',
      '$.input.queue',
    ]);
    expect(queue.body.detail).toContain('noncharacters');
    const scope = { tenant_id: TENANT, namespace: 'ns\uffff' };
    const namespace = await call<{ code: string }>(
      server.url,
      `/v1/tenants/${TENANT}/namespaces/${encodeURIComponent(scope.namespace)}/tasks`,
      {
        idempotency_key: 'nonchar-ns',
        input: { ...scope, queue: 'jobs', program: { name: 'noop' }, data: null },
      },
    );
    expect([namespace.status, namespace.body.code]).toEqual([400, 'invalid_input']);
    const replay = await call<{ code: string }>(
      server.url,
      `${TASKS_BASE}/tasks`,
      taskBody('nonchar-queue', 'jobs'),
    );
    expect(replay.status).toBe(201); // the refused key made no task
  });
});

describe("the event's time and bytes", () => {
  it('a subscription made after the task ended: event time is terminal_at, and a redelivery posts the same bytes', async () => {
    const id = await submitTask(server.url, taskBody('late-sub', 'cb-late'));
    const cancelled = await fetch(`${server.url}${TASKS_BASE}/tasks/${id}/cancel`, {
      method: 'POST',
    });
    expect(cancelled.status).toBe(200);
    const status = await statusOf(id);
    expect(status.state).toBe('cancelled');
    await sleep(1_100); // so "now" at subscription time is a different second than terminal_at
    const subscription = await subscribe(id);
    const first = await firstPost(id);
    expect(first.event.time).toBe(new Date(status.terminal_at as number).toISOString());
    expect(first.headers['webhook-id']).toBe(subscription.event_id);
    expect(verifies(first)).toBe(true);

    await until(
      async () => {
        const list = await call<CompletionSubscription[]>(
          server.url,
          `${TASKS_BASE}/tasks/${id}/completion-subscriptions`,
        );
        return list.body[0]?.state === 'delivered';
      },
      30_000,
      'delivered',
    );
    const again = await call<CompletionSubscription>(
      server.url,
      `${TASKS_BASE}/completion-subscriptions/${subscription.id}/redeliver`,
      { generation: 1 },
    );
    expect(again.status).toBe(200);
    expect(again.body).toMatchObject({ generation: 2 });
    await until(() => postsOf(id).length >= 2, 30_000, 'the redelivery');
    const second = postsOf(id)[1] as Post;
    expect(second.body).toBe(first.body);
    expect(second.headers['webhook-id']).toBe(first.headers['webhook-id']);
    expect(verifies(second)).toBe(true);
  }, 60_000);

  it('the subscription view after a 204: delivered, attempts 1, last_status_code 204, delivered_at at or after terminal_at, no next_attempt_at', async () => {
    const id = await submitTask(server.url, taskBody('view', 'cb-view'));
    await subscribe(id);
    const r = await fetch(`${server.url}${TASKS_BASE}/tasks/${id}/cancel`, { method: 'POST' });
    expect(r.status).toBe(200);
    await firstPost(id);
    let view: CompletionSubscription | undefined;
    await until(
      async () => {
        const list = await call<CompletionSubscription[]>(
          server.url,
          `${TASKS_BASE}/tasks/${id}/completion-subscriptions`,
        );
        view = list.body[0];
        return view?.state === 'delivered';
      },
      30_000,
      'delivered',
    );
    const status = await statusOf(id);
    expect(view).toMatchObject({
      state: 'delivered',
      attempts: 1,
      generation: 1,
      last_status_code: 204,
    });
    expect(view).not.toHaveProperty('next_attempt_at');
    expect(view).not.toHaveProperty('last_error');
    expect((view?.delivered_at ?? 0) >= (status.terminal_at ?? Number.MAX_SAFE_INTEGER)).toBe(true);
  }, 60_000);
});

describe('terminal paths the other callback tests do not take', () => {
  it('cancelled while active, the worker then settling a success: the event says cancelled, at terminal_at', async () => {
    const queue = 'cb-cancel-active';
    const id = await submitTask(server.url, taskBody('cancel-active', queue));
    await subscribe(id);
    const assignment = await claimNext(server.url, queue);
    const r = await fetch(`${server.url}${TASKS_BASE}/tasks/${id}/cancel`, { method: 'POST' });
    expect(r.status).toBe(200);
    const settled = await call<{ task_state?: string }>(
      server.url,
      '/v1/worker/settle',
      settleBody(assignment, { kind: 'success', output: { secret: 'not-in-event' } }),
    );
    expect(settled.status).toBe(200);
    const post = await firstPost(id);
    const status = await statusOf(id);
    expect(status.state).toBe('cancelled');
    expect(post.event.data.state).toBe('cancelled');
    expect(post.event.time).toBe(new Date(status.terminal_at as number).toISOString());
    expect(post.body).not.toContain('not-in-event');
  }, 60_000);

  it('a settlement with unconfirmed quiescence: no event while the task stays active; confirm_quiescence makes it due', async () => {
    const queue = 'cb-unconfirmed';
    const id = await submitTask(server.url, taskBody('unconfirmed', queue, { timeout_ms: 60_000 }));
    await subscribe(id);
    const assignment = await claimNext(server.url, queue);
    const settled = await call(server.url, '/v1/worker/settle', {
      ...settleBody(assignment, { kind: 'success', output: 1 }),
      quiescence: 'unconfirmed',
    });
    expect(settled.status).toBe(200);
    expect((await statusOf(id)).state).toBe('active');
    await sleep(1_000);
    expect(postsOf(id)).toEqual([]);
    const confirmed = await call<{ task_state: string }>(
      server.url,
      '/v1/worker/quiescence',
      assignment.lease.owner,
    );
    expect(confirmed.body.task_state).toBe('succeeded');
    const post = await firstPost(id);
    const status = await statusOf(id);
    expect(post.event.data.state).toBe('succeeded');
    expect(post.event.time).toBe(new Date(status.terminal_at as number).toISOString());
  }, 60_000);

  it('a settlement with unconfirmed quiescence never confirmed: the event is posted once the authority deadline ends the task', async () => {
    const queue = 'cb-unconfirmed-deadline';
    const id = await submitTask(
      server.url,
      taskBody('unconfirmed-deadline', queue, { timeout_ms: 1_000 }),
    );
    await subscribe(id);
    const assignment = await claimNext(server.url, queue);
    const settled = await call(server.url, '/v1/worker/settle', {
      ...settleBody(assignment, { kind: 'success', output: 1 }),
      quiescence: 'unconfirmed',
    });
    expect(settled.status).toBe(200);
    const post = await firstPost(id);
    const status = await statusOf(id);
    expect(status.state).not.toBe('active');
    expect(post.event.data.state).toBe(status.state);
    expect(post.event.time).toBe(new Date(status.terminal_at as number).toISOString());
  }, 60_000);
});
