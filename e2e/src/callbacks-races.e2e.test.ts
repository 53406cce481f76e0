/**
 * Races between cancel, settle, lease expiry/recovery and redelivery, for tasks
 * with completion subscriptions, across two server replicas on one database (DESIGN §5, §8).
 * Many tasks at once, so the interleavings come from concurrency rather than sleeps.
 */
import type { CompletionSubscription, TaskStatus } from '@ledgence/contracts';
import { ApplicationError, type Worker } from '@ledgence/worker';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import {
  client,
  historyOf,
  idsOf,
  prng,
  reasons,
  Stack,
  settled,
  shortWorker,
  sleep,
  until,
} from './test/harness.js';
import { type Receiver, startReceiver } from './test/receiver.js';
import { call, callUntilServed, claimNext, settleBody, TASKS_BASE } from './test/wire.js';

const SECRET = `whsec_${Buffer.alloc(32, 45).toString('base64')}`;
const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);

const stack = new Stack('callbacks_races');
let receiver: Receiver;
let a: ServerProcess;
let b: ServerProcess;
const workers: Worker[] = [];
// Receiver answers: a small deterministic delay per post, so tries overlap with the test's calls.
const jitter = prng(45);

beforeAll(async () => {
  await stack.open();
  receiver = await startReceiver(() => Math.floor(jitter() * 40));
  const env = {
    LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
      billing: { url: receiver.url, secret: SECRET, timeout_ms: 2_000 },
    }),
    LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
  };
  [a, b] = await Promise.all([stack.start(env), stack.start(env)]);
}, 120_000);
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ graceMs: 0 })));
});
afterAll(async () => {
  await stack.close();
  await receiver.close();
});

function postsOf(eventId: string) {
  return receiver.posts.filter((p) => p.id === eventId);
}

async function statusOf(url: string, id: string): Promise<TaskStatus> {
  const r = await call<TaskStatus>(url, `${TASKS_BASE}/tasks/${id}`);
  expect(r.status).toBe(200);
  return r.body;
}

async function subscriptionsOf(url: string, id: string): Promise<CompletionSubscription[]> {
  const r = await call<CompletionSubscription[]>(
    url,
    `${TASKS_BASE}/tasks/${id}/completion-subscriptions`,
  );
  expect(r.status).toBe(200);
  return r.body;
}

/**
 * Every subscription of every task is delivered (never left due or delivering), and every post
 * of its event names the task's final stored state, run and terminal_at.
 */
async function expectEventsMatch(ids: readonly string[]): Promise<void> {
  await until(
    async () => {
      for (const id of ids) {
        const subs = await subscriptionsOf(a.url, id);
        if (subs.some((s) => s.state !== 'delivered')) return false;
      }
      return true;
    },
    90_000,
    'every subscription delivered',
  );
  for (const id of ids) {
    const status = await statusOf(b.url, id);
    expect(TERMINAL.has(status.state)).toBe(true);
    const subs = await subscriptionsOf(b.url, id);
    expect(subs.length).toBeGreaterThan(0);
    for (const s of subs) {
      const posts = postsOf(s.event_id);
      expect(posts.length, `posts of ${s.event_id}`).toBeGreaterThanOrEqual(1);
      for (const p of posts) {
        const data = p.event.data as Record<string, unknown>;
        expect({ subject: p.event.subject, state: data.state, run: data.run_id }).toEqual({
          subject: id,
          state: status.state,
          run: status.run_id,
        });
        expect(p.event.time).toBe(new Date(status.terminal_at as number).toISOString());
        expect(p.body).toBe(posts[0]?.body);
      }
      const ref = ((posts[0] as (typeof posts)[number]).event.data as { result_ref: string })
        .result_ref;
      const result = await call<{ outcome: { state: string } }>(a.url, ref);
      expect(result.status).toBe(200);
      expect(result.body.outcome.state).toBe(status.state);
    }
  }
}

/** One terminal record in the task's history, naming its final state. */
async function expectOneTerminalRecord(id: string, state: string): Promise<void> {
  const events = await historyOf(client(a.url), id);
  const terminal = reasons(events).filter((r) => TERMINAL.has(r));
  expect(terminal, `terminal records of ${id}`).toEqual([state]);
}

describe('cancel racing a worker’s success, subscriptions racing the terminal transition', () => {
  it('SDK workers on both replicas, cancels through the other replica as handlers start: exactly one outcome each, cancel answers agree, every event matches the stored end', async () => {
    const queue = 'race-cancel-success';
    const ca = client(a.url);
    const cb = client(b.url);
    const n = 120;
    const ids = idsOf(
      await ca.submitBatch(
        Array.from({ length: n }, (_, i) => ({
          queue,
          program: 'race',
          data: { i },
          // Some fail for good, so the failed path races cancel too.
          retry: { max_attempts: 1, delay_ms: 0 },
        })),
      ),
    );
    const index = new Map(ids.map((id, i) => [id, i]));
    // A subscription made before anything runs, on every task.
    await Promise.all(
      ids.map((id) => cb.subscribe(id, { destination: 'billing', subscriptionKey: 'early' })),
    );
    const cancelReplies = new Map<string, string>();
    const lateSubs: Promise<unknown>[] = [];
    const onStart = (taskId: string) => {
      const i = index.get(taskId) as number;
      // Subscribing as the task ends (racing the terminal hook), through either replica.
      lateSubs.push(
        (i % 2 ? ca : cb).subscribe(taskId, { destination: 'billing', subscriptionKey: 'late' }),
      );
      if (i % 3 !== 2) {
        const c = i % 2 ? cb : ca;
        cancelReplies.set(taskId, 'pending');
        void c.cancel(taskId).then(
          (state) => cancelReplies.set(taskId, state),
          (e: unknown) => cancelReplies.set(taskId, `error ${String(e)}`),
        );
      }
    };
    const make = (url: string) => {
      const w = shortWorker(url, queue, { concurrency: 16 });
      w.register('race', async (data, ctx) => {
        const { i } = data as { i: number };
        onStart(ctx.taskId);
        // Yield a few turns: the cancel and the subscribe are on the wire meanwhile.
        for (let k = 0; k < i % 7; k += 1) await new Promise((r) => setImmediate(r));
        if (i % 5 === 0) throw new ApplicationError('bad', 'bad', { retryable: false });
        return { i };
      });
      workers.push(w);
      void w.run();
    };
    make(a.url);
    make(b.url);
    const results = await settled(ca, ids, 120_000);
    await Promise.all(lateSubs);
    await until(
      () => [...cancelReplies.values()].every((v) => v !== 'pending'),
      30_000,
      'cancel replies',
    );
    for (const [i, result] of results.entries()) {
      const id = ids[i] as string;
      const final = result.status.state;
      const reply = cancelReplies.get(id);
      if (reply !== undefined) {
        // DESIGN §5 Cancel: active → cancel_requested (the task ends cancelled once the worker
        // settles); terminal → the terminal state, unchanged.
        if (reply === 'active') expect(final, `task ${i} cancel answered active`).toBe('cancelled');
        else expect(reply, `task ${i}`).toBe(final);
      } else {
        expect(final).not.toBe('cancelled');
      }
      await expectOneTerminalRecord(id, final);
    }
    await expectEventsMatch(ids);
  }, 240_000);
});

describe('cancel and settle racing lease expiry and recovery', () => {
  it('claims left to expire, cancels and settles spread over the expiry, across replicas: one outcome each, answers agree, events match', async () => {
    const queue = 'race-expiry';
    const ca = client(a.url);
    const n = 60;
    const ids = idsOf(
      await ca.submitBatch(
        Array.from({ length: n }, (_, i) => ({
          queue,
          program: 'held',
          data: { i },
          retry: { max_attempts: i % 2 ? 1 : 2, delay_ms: 0 },
        })),
      ),
    );
    await Promise.all(
      ids.map((id, i) =>
        client(i % 2 ? a.url : b.url).subscribe(id, {
          destination: 'billing',
          subscriptionKey: 'k',
        }),
      ),
    );
    // Each claim through A with dispatch granted, then never renewed: its 1 s lease runs out.
    // Cancels through either replica and (for a third) settles are spread over the lease's
    // end, each counted from its own claim, while both replicas run recovery.
    const cancelReplies = new Map<string, { status: number; state?: string }>();
    const settleReplies = new Map<string, { status: number; body: Record<string, unknown> }>();
    await Promise.all(
      ids.map(async (_, i) => {
        // Under load the dispatch renewal may itself come after the 1 s lease: then the claim
        // is simply left to recovery, and the cancel still races it.
        const assignment = await claimNext(i % 2 ? a.url : b.url, queue).catch(
          async (e: unknown) => {
            if (!/dispatch refused: 409/.test(String(e))) throw e;
            return undefined;
          },
        );
        if (assignment === undefined) return;
        const id = assignment.lease.owner.task_id;
        await sleep(500 + (i % 16) * 50);
        const cancel = callUntilServed<{ task_state: string }>(
          i % 2 ? b.url : a.url,
          `${TASKS_BASE}/tasks/${id}/cancel`,
          {},
        ).then((r) => cancelReplies.set(id, { status: r.status, state: r.body.task_state }));
        const work: Promise<unknown>[] = [cancel];
        if (i % 3 === 0) {
          work.push(
            callUntilServed<Record<string, unknown>>(
              i % 2 ? a.url : b.url,
              '/v1/worker/settle',
              settleBody(assignment, { kind: 'success', output: { i } }),
            ).then((r) => settleReplies.set(id, r)),
          );
        }
        await Promise.all(work);
      }),
    );
    const results = await settled(ca, ids, 60_000);
    for (const [i, result] of results.entries()) {
      const id = ids[i] as string;
      const final = result.status.state;
      const cancel = cancelReplies.get(id);
      if (cancel !== undefined) {
        expect(cancel.status).toBe(200);
        if (cancel.state === 'active') expect(final, `task ${i}`).toBe('cancelled');
        else expect(cancel.state, `task ${i}`).toBe(final);
      }
      const settle = settleReplies.get(id);
      if (settle !== undefined) {
        if (settle.status === 200) {
          // The settle's answer is the state it left; a terminal one is the task's final state.
          const said = String(settle.body.task_state);
          expect(TERMINAL.has(said)).toBe(true);
          expect(said, `task ${i}`).toBe(final);
        } else {
          expect(settle.status).toBe(409);
          expect(settle.body.code).toBe('ownership_lost');
          expect(final).not.toBe('succeeded');
        }
      }
      await expectOneTerminalRecord(id, final);
    }
    await expectEventsMatch(ids);
  }, 180_000);
});

describe('redeliver racing in-flight tries, through both replicas', () => {
  it('parallel redelivers of the current generation while tries are in flight: one generation each step, the answers agree, every generation delivered, nothing left delivering', async () => {
    const queue = 'race-redeliver';
    const ca = client(a.url);
    const n = 30;
    const ids = idsOf(
      await ca.submitBatch(
        Array.from({ length: n }, (_, i) => ({ queue, program: 'never', data: { i } })),
      ),
    );
    const subs = await Promise.all(
      ids.map((id) => ca.subscribe(id, { destination: 'billing', subscriptionKey: 'r' })),
    );
    await Promise.all(ids.map((id) => ca.cancel(id)));
    const target = 4;
    const unexpected: unknown[] = [];
    await Promise.all(
      subs.map(async (s) => {
        let g = 1;
        while (g < target) {
          // Two copies of the same request at once, one through each replica.
          const replies = await Promise.all(
            [a.url, b.url].map((url) =>
              callUntilServed<CompletionSubscription & { code?: string; reason?: string }>(
                url,
                `${TASKS_BASE}/completion-subscriptions/${s.id}/redeliver`,
                { generation: g },
              ),
            ),
          );
          const started = replies.filter((r) => r.status === 200);
          for (const r of replies) {
            if (r.status === 200) {
              if (r.body.generation !== g + 1) unexpected.push({ g, body: r.body });
            } else if (r.status !== 409 || r.body.reason !== 'generation_in_progress') {
              unexpected.push({ g, status: r.status, body: r.body });
            }
          }
          if (started.length > 0) g += 1;
          else await new Promise((r) => setImmediate(r));
        }
      }),
    );
    expect(unexpected).toEqual([]);
    await until(
      async () => {
        for (const id of ids) {
          const [view] = await subscriptionsOf(b.url, id);
          if (view?.state !== 'delivered' || view.generation !== target) return false;
        }
        return true;
      },
      60_000,
      'the last generation delivered',
    );
    for (const s of subs) {
      const posts = postsOf(s.event_id);
      expect(posts.length).toBeGreaterThanOrEqual(target);
      expect(new Set(posts.map((p) => p.body)).size).toBe(1);
    }
    await expectEventsMatch(ids);
  }, 180_000);
});

describe('subscribes racing a cancel of the queued task and each other, through both replicas', () => {
  it('20 distinct keys and duplicated keys at once, the cancel among them: 16 subscriptions exactly, one per key, each delivered saying cancelled', async () => {
    const queue = 'race-sub-race';
    const ca = client(a.url);
    const n = 20;
    const ids = idsOf(
      await ca.submitBatch(
        Array.from({ length: n }, (_, i) => ({ queue, program: 'never', data: { i } })),
      ),
    );
    const unexpected: unknown[] = [];
    const created = new Map<string, Set<string>>();
    await Promise.all(
      ids.map(async (id, t) => {
        const calls: Promise<unknown>[] = [];
        for (let k = 0; k < 20; k += 1) {
          // Each key sent twice, once through each replica.
          for (const url of [a.url, b.url]) {
            calls.push(
              callUntilServed<CompletionSubscription & { code?: string; reason?: string }>(
                url,
                `${TASKS_BASE}/tasks/${id}/completion-subscriptions`,
                { subscription_key: `key-${k}`, destination: 'billing' },
              ).then((r) => {
                if (r.status === 200 || r.status === 201) {
                  const ofKey = created.get(`${id}/${k}`) ?? new Set<string>();
                  ofKey.add(r.body.id);
                  created.set(`${id}/${k}`, ofKey);
                } else if (r.status !== 409 || r.body.code !== 'limit_exceeded') {
                  unexpected.push({ status: r.status, body: r.body });
                }
              }),
            );
          }
          if (k === t % 20) {
            calls.push(
              callUntilServed<{ task_state: string }>(
                t % 2 ? a.url : b.url,
                `${TASKS_BASE}/tasks/${id}/cancel`,
                {},
              ).then((r) => {
                if (r.status !== 200 || r.body.task_state !== 'cancelled') unexpected.push(r.body);
              }),
            );
          }
        }
        await Promise.all(calls);
      }),
    );
    expect(unexpected).toEqual([]);
    for (const id of ids) {
      const subs = await subscriptionsOf(a.url, id);
      expect(subs.length).toBe(16);
      // A key answered on both replicas names one subscription.
      for (const s of subs)
        expect(created.get(`${id}/${s.subscription_key.slice(4)}`)).toEqual(new Set([s.id]));
    }
    await expectEventsMatch(ids);
  }, 180_000);
});
