/**
 * SIGTERM with many requests in flight (README "Running the server" → Stopping;
 * DESIGN §11: stop accepting, finish in-flight requests, end long polls with `empty`). Every
 * request either gets a whole reply with a documented status, or no reply at all, and then its
 * replay (same idempotency key / operation id) on the restarted server answers what was
 * committed.
 */
import { request as httpRequest } from 'node:http';
import { createPostgresTaskStore } from '@ledgence/store-postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { portOf, Stack, sleep } from './test/harness.js';
import { claimNext, openSession, pollBody, settleBody, TASKS_BASE, taskBody } from './test/wire.js';

const stack = new Stack('shutdown_load');
let store: ReturnType<typeof createPostgresTaskStore>;
const BUDGET_MS = 3_000;

beforeAll(async () => {
  await stack.open();
  store = createPostgresTaskStore({ url: stack.databaseUrl, max: 1 });
}, 60_000);
afterAll(async () => {
  await store?.close();
  await stack.close();
});

const TASKS = `${TASKS_BASE}/tasks`;

interface Outcome {
  kind: string;
  path: string;
  body: unknown;
  status?: number;
  text?: string;
  error?: string;
}

/** One request on a connection of its own (no agent): its whole reply, or the error it met. */
function send(url: string, kind: string, path: string, body?: unknown): Promise<Outcome> {
  const { port } = new URL(url);
  const text = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve) => {
    const outcome: Outcome = { kind, path, body };
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port: Number(port),
        path,
        method: text === undefined ? 'GET' : 'POST',
        agent: false,
        headers:
          text === undefined
            ? {}
            : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) },
      },
      (res) => {
        let data = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => {
          data += c;
        });
        res.on('end', () => {
          if (!res.complete) {
            resolve({ ...outcome, status: res.statusCode, text: data, error: 'truncated' });
          } else resolve({ ...outcome, status: res.statusCode, text: data });
        });
        res.on('error', (e) =>
          resolve({ ...outcome, status: res.statusCode, text: data, error: `res ${e.message}` }),
        );
        res.on('aborted', () =>
          resolve({ ...outcome, status: res.statusCode, text: data, error: 'aborted' }),
        );
      },
    );
    req.setTimeout(30_000, () => req.destroy(new Error('client timeout')));
    req.on('error', (e: NodeJS.ErrnoException) =>
      resolve({ ...outcome, error: e.code ?? e.message }),
    );
    req.end(text);
  });
}

const codeOf = (o: Outcome): string | undefined => {
  try {
    return (JSON.parse(o.text ?? '') as { code?: string }).code;
  } catch {
    return undefined;
  }
};

describe('SIGTERM under a mixed load of submits, batches, parked polls, result waits and settles', () => {
  it('every request is answered whole with a documented status or not at all; replays find what was committed', async () => {
    const env = {
      LEDGENCE_SHUTDOWN_TIMEOUT_MS: String(BUDGET_MS),
      LEDGENCE_LONG_POLL_WAIT_MS: '20000',
      LEDGENCE_LEASE_DURATION_MS: '30000',
    };
    const server: ServerProcess = await stack.start(env);
    const url = server.url;
    // Claimed tasks, to settle while the signal comes.
    const assignments = [];
    for (let i = 0; i < 20; i++) {
      const res = await send(url, 'setup', TASKS, taskBody(`sl-claim-${i}`, 'sl-work'));
      expect(res.status).toBe(201);
    }
    for (let i = 0; i < 20; i++) assignments.push(await claimNext(url, 'sl-work'));
    // Pending tasks, to wait on.
    const pendingIds: string[] = [];
    for (let i = 0; i < 10; i++) {
      const res = await send(url, 'setup', TASKS, taskBody(`sl-wait-${i}`, 'sl-never'));
      pendingIds.push((JSON.parse(res.text ?? '{}') as { task_id: string }).task_id);
    }
    const sessions: string[] = [];
    for (let i = 0; i < 10; i++) sessions.push(await openSession(url, 'sl-idle'));

    const inflight: Promise<Outcome>[] = [];
    // Parked: polls and result waits.
    for (const s of sessions) {
      inflight.push(
        send(url, 'poll', '/v1/worker/acquire?wait_ms=20000', pollBody(s, 'sl-idle', 0, 1)),
      );
    }
    for (const id of pendingIds)
      inflight.push(send(url, 'result', `${TASKS}/${id}/result?wait_ms=20000`));
    // A stream of submits and batch submits around the signal.
    let n = 0;
    let streaming = true;
    const stream = (async () => {
      while (streaming) {
        n += 1;
        inflight.push(send(url, 'submit', TASKS, taskBody(`sl-s-${n}`, 'sl-bulk')));
        if (n % 5 === 0) {
          inflight.push(
            send(url, 'batch', `${TASKS}:batch`, {
              commands: Array.from({ length: 50 }, (_, k) => taskBody(`sl-b-${n}-${k}`, 'sl-bulk')),
            }),
          );
        }
        await sleep(2);
      }
    })();
    await sleep(300);
    const began = performance.now();
    server.child.kill('SIGTERM');
    for (const a of assignments)
      inflight.push(
        send(url, 'settle', '/v1/worker/settle', settleBody(a, { kind: 'success', output: null })),
      );
    await sleep(400);
    streaming = false;
    await stream;
    const exit = await server.exited;
    const tookMs = performance.now() - began;
    const outcomes = await Promise.all(inflight);

    // Documented answers only: 2xx, or 503 unavailable; polls end `empty` (or are refused).
    const bad = outcomes.filter((o) => {
      if (o.error !== undefined) return o.status !== undefined; // a reply begun and cut
      if (o.status === undefined) return true;
      if (o.status >= 200 && o.status < 300) return false;
      return !(o.status === 503 && codeOf(o) === 'unavailable');
    });
    const pollsNotEmpty = outcomes.filter(
      (o) => o.kind === 'poll' && o.status === 200 && !(o.text ?? '').includes('"empty"'),
    );
    const summary = new Map<string, number>();
    for (const o of outcomes) {
      const k = `${o.kind} ${o.status ?? o.error}`;
      summary.set(k, (summary.get(k) ?? 0) + 1);
    }
    expect(
      { exit, withinBudget: tookMs < BUDGET_MS + 2_000, bad: bad.slice(0, 5), pollsNotEmpty },
      JSON.stringify([...summary]),
    ).toEqual({ exit: 0, withinBudget: true, bad: [], pollsNotEmpty: [] });

    // Restart on the same port, replay every request left without a reply (or refused 503).
    const again = await stack.start({ ...env, PORT: portOf(url) });
    const unanswered = outcomes.filter(
      (o) => o.kind !== 'setup' && (o.status === undefined || o.status === 503),
    );
    const replayBad: unknown[] = [];
    for (const o of unanswered) {
      if (o.kind === 'poll' || o.kind === 'result') continue;
      const r = await send(again.url, o.kind, o.path, o.body);
      if (r.status === undefined || r.status >= 300) replayBad.push({ o, r });
      if (o.kind === 'batch') {
        const results = (JSON.parse(r.text ?? '{}') as { results: { task_id?: string }[] }).results;
        if (results.some((x) => x.task_id === undefined))
          replayBad.push({ o, r: r.text?.slice(0, 300) });
      }
    }
    expect(replayBad.slice(0, 3)).toEqual([]);
    // Each key once; every acknowledged submit exists.
    const dup = await store.sql<{ k: string; n: number }[]>`
      select idempotency_key as k, count(*)::int as n from tasks
      where idempotency_key like 'sl-%' group by 1 having count(*) > 1`;
    expect(dup).toEqual([]);
    const acked = outcomes
      .filter((o) => o.kind === 'submit' && (o.status === 201 || o.status === 200))
      .map((o) => (JSON.parse(o.text ?? '{}') as { task_id: string }).task_id);
    const [{ found } = { found: -1 }] = await store.sql<{ found: number }[]>`
      select count(*)::int as found from tasks where task_id = any(${acked}::text[])`;
    expect(found).toBe(acked.length);
    // Settles: every one accepted once, its replay the same.
    const [{ succeeded } = { succeeded: -1 }] = await store.sql<{ succeeded: number }[]>`
      select count(*)::int as succeeded from tasks where idempotency_key like 'sl-claim-%' and state = 'succeeded'`;
    expect(succeeded).toBe(20);
    await again.stop('SIGTERM');
  }, 120_000);
});

describe('the terminal running the server closed (its stdout and stderr gone), then SIGHUP', () => {
  it('requests are still answered, and the stop is graceful: exit 0 within the budget', async () => {
    const server = await stack.start(
      { LEDGENCE_SHUTDOWN_TIMEOUT_MS: String(BUDGET_MS), LEDGENCE_LOG_LEVEL: 'info' },
      { captureStdout: true },
    );
    await send(server.url, 'setup', '/healthz');
    // The reading ends of its output go away, as a closed terminal's do.
    server.child.stdout?.destroy();
    server.child.stderr?.destroy();
    await sleep(200);
    const replies: Outcome[] = [];
    for (let i = 0; i < 3; i++) {
      replies.push(await send(server.url, 'submit', TASKS, taskBody(`sl-hup-${i}`, 'sl-hup')));
    }
    const began = performance.now();
    server.child.kill('SIGHUP');
    const exit = await Promise.race([
      server.exited,
      sleep(BUDGET_MS + 10_000).then(() => 'still running'),
    ]);
    const ms = performance.now() - began;
    expect({
      statuses: replies.map((r) => r.status ?? r.error),
      exit,
      withinBudget: ms < BUDGET_MS + 2_000,
    }).toEqual({ statuses: [201, 201, 201], exit: 0, withinBudget: true });
  }, 60_000);
});
