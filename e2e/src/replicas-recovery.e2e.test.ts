/**
 * Replicas: lease recovery run by three server processes on one database at once
 * (every replica runs the loop, DESIGN §5, §11): each expired lease is recovered exactly once.
 */
import type {
  AcquireReply,
  Assignment,
  RecordedHistoryEvent,
  TaskStatus,
} from '@ledgence/contracts';
import { createPostgresTaskStore } from '@ledgence/store-postgres';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { Stack, until } from './test/harness.js';
import { call, metricSum, SCOPE, TASKS_BASE } from './test/wire.js';

async function historyOf(url: string, taskId: string): Promise<RecordedHistoryEvent[]> {
  const { body } = await call<RecordedHistoryEvent[]>(url, `${TASKS_BASE}/tasks/${taskId}/history`);
  return body;
}

const stack = new Stack('replicas_recovery');
beforeAll(async () => {
  await stack.open();
}, 60_000);
afterAll(async () => {
  await stack.close();
});

it('three replicas recovering at once record each expired lease once and count each attempt once', async () => {
  // Recovery every 10 ms on each replica, so their passes overlap.
  const env = { LEDGENCE_MAINTENANCE_INTERVAL_MS: '10' };
  const servers = await Promise.all([stack.start(env), stack.start(env), stack.start(env)]);
  const [a] = servers;
  if (a === undefined) throw new Error('no server');
  const queue = 'expire-many';
  const total = 600;
  const commands = Array.from({ length: total }, (_, i) => ({
    idempotency_key: `expire-${i}`,
    input: {
      ...SCOPE,
      queue,
      program: { name: 'noop' },
      data: { i },
      retry: { max_attempts: 1, delay_ms: 0 },
    },
  }));
  const submitted = await call<{ results: { task_id: string }[] }>(
    a.url,
    `${TASKS_BASE}/tasks:batch`,
    { commands },
  );
  expect(submitted.status).toBe(200);
  const ids = submitted.body.results.map((r) => r.task_id);

  // Claim them all (half granted dispatch, so their attempt counts), then never renew.
  const dispatched = new Set<string>();
  const { body: session } = await call<{ id: string }>(a.url, '/v1/worker/sessions', {
    scope: SCOPE,
    queue,
    concurrency: 1_000,
  });
  const slots = Array.from({ length: total }, (_, slot) => ({
    scope: SCOPE,
    queue,
    worker_session_id: session.id,
    consumer_id: slot,
    sequence: 1,
  }));
  for (let i = 0; i < total; i += 100) {
    const { body } = await call<{ replies: AcquireReply[] }>(a.url, '/v1/worker/acquire:batch', {
      commands: slots.slice(i, i + 100),
    });
    const assigned = body.replies.flatMap((r) =>
      r.disposition === 'assigned' ? [r.assignment] : [],
    ) as Assignment[];
    const toDispatch = assigned.filter((_, k) => k % 2 === 0);
    if (toDispatch.length > 0) {
      const { body: renewed } = await call<{ results: { dispatch_allowed?: boolean }[] }>(
        a.url,
        '/v1/worker/renew:batch',
        {
          commands: toDispatch.map((x) => ({
            owner: x.lease.owner,
            sequence: 1,
            intent: 'dispatch',
          })),
        },
      );
      // Only a granted dispatch counts the attempt (a slow machine may let a lease run out first).
      toDispatch.forEach((x, k) => {
        if (renewed.results[k]?.dispatch_allowed === true) dispatched.add(x.lease.owner.task_id);
      });
    }
  }

  // Every lease expires (1 s) and is recovered: dispatched ones fail, the others are re-queued.
  await until(
    async () => {
      let expired = 0;
      for (const s of servers) expired += await metricSum(s.url, 'ledgence_lease_expiries_total');
      return expired >= total;
    },
    60_000,
    'every lease recovered',
  );
  // Give any double recovery time to show.
  await new Promise((r) => setTimeout(r, 1_000));
  let expired = 0;
  for (const s of servers) expired += await metricSum(s.url, 'ledgence_lease_expiries_total');
  expect(expired).toBe(total);

  const wrong: string[] = [];
  for (const id of ids) {
    const events = await historyOf(a.url, id);
    const lost = events.filter((e) => e.event.reason === 'lease_expired').length;
    const { body: status } = await call<TaskStatus>(a.url, `${TASKS_BASE}/tasks/${id}`);
    const expected = dispatched.has(id)
      ? { state: 'failed', attempt_count: 1 }
      : { state: 'queued', attempt_count: 1 };
    if (
      lost !== 1 ||
      status.state !== expected.state ||
      status.attempt_count !== expected.attempt_count
    ) {
      wrong.push(
        `${id}: lease_expired ×${lost}, ${status.state}, attempts ${status.attempt_count}`,
      );
    }
  }
  expect(wrong).toEqual([]);
}, 180_000);

it('recovery on three replicas while workers claim and settle keyed tasks: no deadlock, no 5xx', async () => {
  const env = { LEDGENCE_MAINTENANCE_INTERVAL_MS: '10' };
  const servers =
    stack.servers.length > 0
      ? stack.servers
      : await Promise.all([stack.start(env), stack.start(env), stack.start(env)]);
  const [a] = servers;
  if (a === undefined) throw new Error('no server');
  const adminStore = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
  const admin = adminStore.sql;
  try {
    const deadlocks = async () =>
      Number(
        (await admin`select deadlocks from pg_stat_database where datname = current_database()`)[0]
          ?.deadlocks,
      );
    const deadlocksBefore = await deadlocks();
    const fivexx = async () => {
      let n = 0;
      for (const s of servers) {
        const text = await (await fetch(`${s.url}/metrics`)).text();
        for (const line of text.split('\n')) {
          if (
            line.startsWith('ledgence_http_request_duration_seconds_count') &&
            line.includes('status_class="5xx"')
          ) {
            n += Number(line.split(' ').at(-1));
          }
        }
      }
      return n;
    };
    const fivexxBefore = await fivexx();
    const queue = 'contend';
    const total = 800;
    const commands = Array.from({ length: total }, (_, i) => ({
      idempotency_key: `contend-${i}`,
      input: {
        ...SCOPE,
        queue,
        program: { name: 'noop' },
        data: { i },
        concurrency_key: `k${i % 7}`,
        concurrency_limit: 40,
        retry: { max_attempts: 5, delay_ms: 0 },
      },
    }));
    const ids: string[] = [];
    for (let i = 0; i < total; i += 400) {
      const { body } = await call<{ results: { task_id: string }[] }>(
        a.url,
        `${TASKS_BASE}/tasks:batch`,
        {
          commands: commands.slice(i, i + 400),
        },
      );
      ids.push(...body.results.map((r) => r.task_id));
    }
    // Abandoners (claim, never renew: recovery re-queues) and finishers (claim, settle) on every
    // replica at once, in batches, until every task is terminal.
    let done = false;
    const worker = async (url: string, abandon: boolean) => {
      const openSession = async () =>
        (
          await call<{ id: string }>(url, '/v1/worker/sessions', {
            scope: SCOPE,
            queue,
            concurrency: 1_000,
          })
        ).body;
      let session = await openSession();
      let slot = 0;
      while (!done) {
        // Each slot polls once (sequence 1): a session whose slots are used up is replaced, so
        // the finishers keep going until the abandoned tasks' leases expire (30 s) and recovery
        // re-queues them, however many empty polls a slow machine makes meanwhile.
        if (slot >= 1_000) {
          if (abandon) return; // one session's worth of abandoned claims
          session = await openSession();
          slot = 0;
        }
        const polls = Array.from({ length: 20 }, () => ({
          scope: SCOPE,
          queue,
          worker_session_id: session.id,
          consumer_id: slot++,
          sequence: 1,
        }));
        const { status, body } = await call<{ replies: AcquireReply[] }>(
          url,
          '/v1/worker/acquire:batch',
          {
            commands: polls,
          },
        );
        if (status !== 200) continue;
        const assigned = body.replies.flatMap((r) =>
          'disposition' in r && r.disposition === 'assigned' ? [r.assignment] : [],
        ) as Assignment[];
        if (assigned.length === 0) {
          await new Promise((r) => setTimeout(r, 20));
          continue;
        }
        if (abandon) continue;
        await call(url, '/v1/worker/settle:batch', {
          commands: assigned.map((x) => ({
            owner: x.lease.owner,
            operation_id: `s-${x.lease.owner.attempt_id}`,
            report: {
              kind: 'completed',
              report: {
                context: {
                  identity: {
                    task_id: x.lease.owner.task_id,
                    attempt_id: x.lease.owner.attempt_id,
                  },
                },
                outcome: { kind: 'success', output: null },
              },
            },
            quiescence: 'confirmed',
          })),
        });
      }
    };
    const running: Promise<void>[] = [];
    for (const s of servers) {
      running.push(worker(s.url, true));
      for (let k = 0; k < 4; k += 1) running.push(worker(s.url, false));
    }
    await until(
      async () => {
        const [row] = await admin`
          select count(*)::int as n from tasks where queue = ${queue} and state not in ('succeeded','failed','cancelled')`;
        return row?.n === 0;
      },
      150_000,
      'every task terminal',
    ).finally(() => {
      done = true;
    });
    await Promise.all(running);
    expect(await deadlocks()).toBe(deadlocksBefore);
    expect(await fivexx()).toBe(fivexxBefore);
    // Each lost attempt recorded once.
    const [dup] = await admin`
      select count(*)::int as n from (
        select task_id, attempt_id from task_history where reason = 'lease_expired'
        group by 1, 2 having count(*) > 1) d`;
    expect(dup?.n).toBe(0);
  } finally {
    await adminStore.close();
  }
}, 240_000);
