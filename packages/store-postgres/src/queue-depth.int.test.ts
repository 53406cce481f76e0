/**
 * `queueDepths` (the `/metrics` queue depth gauge): counts per queue and state over every scope,
 * folding the queues past the limit into one row, and — EXPLAINed over 50 000 terminal tasks —
 * reading queued tasks through `tasks_acquire` and active ones through `attempts_active`, never
 * scanning tasks or attempts sequentially.
 */
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { queueDepths } from './hot-sql.js';
import type { QueueDepth } from './store.js';
import {
  acquireCommand,
  type Harness,
  harness,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;

beforeAll(async () => {
  h = await harness('queue_depth');
});

afterAll(async () => {
  await h?.close();
});

function sorted(rows: QueueDepth[]): QueueDepth[] {
  return [...rows].sort(
    (a, b) => String(a.queue).localeCompare(String(b.queue)) || a.state.localeCompare(b.state) || 0,
  );
}

async function claim(queue: string, scope = SCOPE) {
  const session = await h.store.openSession({ scope, queue, concurrency: 1 });
  const { reply } = await h.store.acquire(acquireCommand(session.id, 0, 1, queue, scope), {
    recordEmpty: true,
  });
  if (reply.disposition !== 'assigned') throw new Error(`nothing to claim in ${queue}`);
  return reply.assignment;
}

describe('queueDepths', () => {
  it('counts queued and active tasks per queue over every scope, never terminal ones', async () => {
    const other = { tenant_id: 'globex', namespace: 'dev' };
    for (let i = 0; i < 3; i += 1) await h.store.submit(submitCommand(`a-${i}`, { queue: 'a' }));
    await h.store.submit(submitCommand('a-globex', { queue: 'a', ...other }));
    for (let i = 0; i < 3; i += 1) await h.store.submit(submitCommand(`b-${i}`, { queue: 'b' }));
    await h.store.submit(submitCommand('c-0', { queue: 'c' }));
    await h.store.submit(submitCommand('d-0', { queue: 'd' }));
    await claim('a'); // active
    await claim('a', other); // active, in another tenant
    const done = await claim('b');
    await h.store.settle(successCommand(done, 'op-b')); // terminal: not counted

    expect(sorted(await h.store.queueDepths(50))).toEqual([
      { queue: 'a', state: 'active', count: 2 },
      { queue: 'a', state: 'queued', count: 2 },
      { queue: 'b', state: 'queued', count: 2 },
      { queue: 'c', state: 'queued', count: 1 },
      { queue: 'd', state: 'queued', count: 1 },
    ]);
    // Deepest first (a: 4, b: 2), ties by name (c before d): d and c fold past a limit of 2.
    expect(sorted(await h.store.queueDepths(2))).toEqual([
      { queue: 'a', state: 'active', count: 2 },
      { queue: 'a', state: 'queued', count: 2 },
      { queue: 'b', state: 'queued', count: 2 },
      { queue: null, state: 'queued', count: 2 },
    ]);
    expect(sorted(await h.store.queueDepths(3))).toContainEqual({
      queue: null,
      state: 'queued',
      count: 1,
    });
    await expect(h.store.queueDepths(0)).rejects.toThrow(RangeError);
  });

  it('plans through the partial indexes, never a sequential scan of tasks or attempts', async () => {
    await h.sql`
      insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest,
        input, queue, program, retry, timeout_ms, priority, labels, state, submitted_at,
        available_at, terminal_at, attempt_count, dispatch_count, outcome, history_sequence)
      select 'acme', 'prod', 'tsk_done_' || lpad(g::text, 8, '0'), 'run_' || g, 'done-' || g,
        'x', '{}', 'q' || (g % 7), '{"name":"p"}', '{"max_attempts":3,"delay_ms":1000}', 300000,
        0, '{}', 'succeeded', g, g, g + 1, 1, 1, '{"state":"succeeded"}', 5
      from generate_series(1, 50000) as g`;
    await h.sql`
      insert into attempts (tenant_id, namespace, task_id, attempt_id, ordinal, lease_id,
        generation, worker_session_id, consumer_id, state, claimed_at, deadline,
        authority_deadline, lease_expires_at, renew_sequence, dispatch_allowed, quiescence,
        finished_at)
      select 'acme', 'prod', 'tsk_done_' || lpad(g::text, 8, '0'), 'att_' || g, 1, 'lse_' || g,
        1, 'ses_x', 0, 'succeeded', g, g + 1000, g + 2000, g + 1000, 1, true, 'confirmed', g + 10
      from generate_series(1, 50000) as g`;
    // DESIGN §7.1: ANALYZE after bulk loads, where the planner would otherwise guess.
    await h.sql`analyze`;

    const captured: { query: string; params: unknown[] }[] = [];
    const client = postgres(h.db.url, {
      max: 1,
      onnotice: () => {},
      debug: (_connection, query, params) => captured.push({ query, params: [...params] }),
    });
    try {
      const rows = await queueDepths(client, 50);
      expect(rows.length).toBeGreaterThan(0);
      const statement = captured.find((c) => /with depth as/.test(c.query));
      if (statement === undefined) throw new Error('the statement was not captured');
      const plan = (
        await h.sql.unsafe(
          `explain ${statement.query}`,
          statement.params as postgres.ParameterOrJSON<never>[],
        )
      )
        .map((row) => String(row['QUERY PLAN']))
        .join('\n');
      expect(plan).toMatch(/tasks_acquire/);
      expect(plan).toMatch(/attempts_active/);
      expect(plan).not.toMatch(/Seq Scan on (tasks|attempts)/);
    } finally {
      await client.end();
    }
  });
});
