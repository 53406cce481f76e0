/**
 * The worker session and poll routes over HTTP, in-process over a real store: no
 * request may produce a 5xx by its content alone (DESIGN §6), limits hold at their edges
 * (§12, MAX_SESSION_CONCURRENCY), and a rejected poll writes nothing.
 */
import { MAX_SESSION_CONCURRENCY } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { appOverPostgres, scopeFor, tasksPath } from './testdata/app-over-postgres.js';

const call = appOverPostgres('worker_edges', ['client', 'worker']);

describe('worker routes on odd input', () => {
  it('never answers 5xx to malformed session, extend and poll bodies', async () => {
    const scope = scopeFor('odd');
    const open = await call<{ id: string }>('/v1/worker/sessions', {
      scope,
      queue: 'q',
      concurrency: 2,
    });
    expect(open.status).toBe(200);
    const id = open.body.id;
    const poll = { scope, queue: 'q', worker_session_id: id, consumer_id: 0, sequence: 1 };
    const cases: [string, unknown][] = [
      ['/v1/worker/acquire', { ...poll, consumer_id: -1 }],
      ['/v1/worker/acquire', { ...poll, consumer_id: 2 ** 31 }],
      ['/v1/worker/acquire', { ...poll, consumer_id: 1.5 }],
      ['/v1/worker/acquire', { ...poll, sequence: Number.MAX_SAFE_INTEGER }],
      ['/v1/worker/acquire', { ...poll, sequence: -1 }],
      ['/v1/worker/acquire', { ...poll, worker_session_id: 'x'.repeat(4000) }],
      ['/v1/worker/acquire', { ...poll, worker_session_id: 'a\u0000b' }],
      ['/v1/worker/acquire', { ...poll, queue: 'other' }],
      ['/v1/worker/acquire?wait_ms=99999999999999999999999', { ...poll, queue: 'other' }],
      ['/v1/worker/acquire?wait_ms=-1', poll],
      ['/v1/worker/acquire:batch', { commands: [] }],
      ['/v1/worker/acquire:batch', { commands: [null, 1, 'x', []] }],
      [
        '/v1/worker/acquire:batch',
        {
          commands: [
            { ...poll, consumer_id: 7 },
            { ...poll, consumer_id: 2 ** 40 },
          ],
        },
      ],
      [
        '/v1/worker/acquire:batch?wait_ms=50',
        { commands: [{ ...poll, worker_session_id: 'nope' }] },
      ],
      ['/v1/worker/sessions', { scope, queue: 'q', concurrency: 0 }],
      ['/v1/worker/sessions', { scope, queue: 'q', concurrency: MAX_SESSION_CONCURRENCY + 1 }],
      ['/v1/worker/sessions', { scope, queue: 'q', concurrency: 2 ** 32 }],
      ['/v1/worker/sessions', { scope, queue: ' q', concurrency: 1 }],
      [`/v1/worker/sessions/${encodeURIComponent('a\u0000b')}/extend`, { scope }],
      [`/v1/worker/sessions/${'y'.repeat(3000)}/extend`, { scope }],
      [`/v1/worker/sessions/%ff%fe/extend`, { scope }],
      [`/v1/worker/sessions/${id}/extend`, { scope: null }],
      [`/v1/worker/sessions/${id}/extend`, { scope: { tenant_id: 'acme' } }],
    ];
    const answers: string[] = [];
    for (const [path, body] of cases) {
      const reply = await call<{ code?: string; replies?: unknown[] }>(path, body);
      answers.push(
        `${reply.status} ${path.slice(0, 60)} ${JSON.stringify(body).slice(0, 80)} -> ${JSON.stringify(reply.body).slice(0, 160)}`,
      );
    }
    for (const a of answers) expect(Number(a.slice(0, 3)), a).toBeLessThan(500);
  });
});

describe('acquire:batch?wait_ms parks until a slot is assigned (DESIGN §6)', () => {
  // A batch of a slot re-sending its last poll (a replay, answered `empty` again) and another
  // slot's new poll: no slot is assigned, so the batch parks, and the task submitted during the
  // wait is assigned to the new poll.
  it('a replayed empty poll beside a new one does not end the wait: the new slot gets the task submitted meanwhile', async () => {
    const scope = scopeFor('batch-replay');
    const queue = 'q';
    const open = await call<{ id: string }>('/v1/worker/sessions', {
      scope,
      queue,
      concurrency: 2,
    });
    const id = open.body.id;
    const slot = (consumer_id: number, sequence: number) => ({
      scope,
      queue,
      worker_session_id: id,
      consumer_id,
      sequence,
    });
    const first = await call<{ disposition: string }>('/v1/worker/acquire', slot(0, 1));
    expect(first.body.disposition).toBe('empty');
    const started = performance.now();
    let answeredMs = 0;
    const batch = call<{ replies: { disposition?: string; sequence?: number }[] }>(
      '/v1/worker/acquire:batch?wait_ms=4000',
      { commands: [slot(0, 1), slot(1, 1)] },
    ).then((r) => {
      answeredMs = performance.now() - started;
      return r;
    });
    await new Promise((r) => setTimeout(r, 300));
    const submitted = await call(`${tasksPath(scope)}`, {
      idempotency_key: 'batch-replay',
      input: { ...scope, queue, program: { name: 'p' }, data: null },
    });
    expect(submitted.status).toBe(201);
    const reply = await batch;
    const ms = answeredMs;
    expect(reply.status).toBe(200);
    expect(reply.body.replies[0]).toEqual({ disposition: 'empty', sequence: 1 });
    expect({
      disposition: reply.body.replies[1]?.disposition,
      answeredAfterSubmit: ms >= 300,
    }).toEqual({
      disposition: 'assigned',
      answeredAfterSubmit: true,
    });
  });
});
