/**
 * What a running server costs its database when idle: the real server
 * (startServer, real sockets) on a database of its own, reached through the wire proxy, which
 * counts each statement and transaction the server sends (PgProxy.takeCounts).
 *
 * - With no worker and no task, only the maintenance loops speak: lease recovery and the
 *   statistics pass each maintenance interval (1 s), the callback sender's idle poll (250 ms);
 *   retention waits for its interval (60 s).
 * - With N parked long polls, each parked request adds at most one claim transaction per rescan
 *   interval (LEDGENCE_RESCAN_INTERVAL_MS): nothing per namespace or per queue on top.
 */
import {
  createTestDatabase,
  type PgProxy,
  type ProxyCounts,
  startPgProxy,
  type TestDatabase,
} from '@ledgence/store-postgres/testing';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

let db: TestDatabase;
let proxy: PgProxy;
let server: RunningServer;

beforeAll(async () => {
  db = await createTestDatabase({ prefix: 'idle_cost' });
  proxy = await startPgProxy(db.url);
  const config = loadConfig({ DATABASE_URL: proxy.url, PORT: '0' }, (path) => {
    throw new Error(`no file ${path}`);
  });
  server = await startServer(config, { logger: pino({ level: 'silent' }) });
}, 60_000);
afterAll(async () => {
  await server?.stop();
  await proxy?.close();
  await db?.drop();
});

async function call<T>(method: string, path: string, body?: unknown): Promise<T> {
  const response = await fetch(`${server.url}${path}`, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return (text === '' ? null : JSON.parse(text)) as T;
}

/** ProxyCounts what the server sends during `ms` (after the first second of start-up work). */
async function window(ms: number): Promise<ProxyCounts & { seconds: number }> {
  proxy.takeCounts();
  const began = performance.now();
  await new Promise((resolve) => setTimeout(resolve, ms));
  const counts = proxy.takeCounts();
  return { ...counts, seconds: (performance.now() - began) / 1000 };
}

/** The statements by their first 60 characters, most frequent first (for the failure message). */
function summary(counts: ProxyCounts): string {
  const by = new Map<string, number>();
  for (const s of counts.statements) by.set(s.slice(0, 60), (by.get(s.slice(0, 60)) ?? 0) + 1);
  return [...by.entries()]
    .sort((a, b) => b[1] - a[1])
    .map(([s, n]) => `${n} × ${s}`)
    .join('\n');
}

describe('an idle server', () => {
  it('sends a few transactions a second from its loops alone: recovery, statistics, callback sender', async () => {
    // Past the start (migrations, the first statistics pass, LISTEN).
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    const idle = await window(4_000);
    const perSecond = idle.transactions / idle.seconds;
    // Recovery 1/s + statistics 1/s + the sender's poll 4/s = 6/s.
    expect(perSecond, summary(idle)).toBeLessThanOrEqual(8);
    expect(perSecond, summary(idle)).toBeGreaterThan(0);
  });

  it('adds at most one claim per rescan interval for each parked poll, nothing per queue or namespace', async () => {
    const parked = 24;
    const scopes = [
      { tenant_id: 'idle', namespace: 'a' },
      { tenant_id: 'idle', namespace: 'b' },
      { tenant_id: 'other', namespace: 'c' },
    ];
    const queues = ['q1', 'q2', 'q3', 'q4'];
    const aborts = new AbortController();
    const polls: Promise<unknown>[] = [];
    for (let i = 0; i < parked; i += 1) {
      const scope = scopes[i % scopes.length] as (typeof scopes)[number];
      const queue = queues[i % queues.length] as string;
      const session = await call<{ id: string }>('POST', '/v1/worker/sessions', {
        scope,
        queue,
        concurrency: 1,
      });
      polls.push(
        fetch(`${server.url}/v1/worker/acquire?wait_ms=20000`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({
            scope,
            queue,
            worker_session_id: session.id,
            consumer_id: 0,
            sequence: 1,
          }),
          signal: aborts.signal,
        }).catch(() => undefined),
      );
    }
    try {
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      const busy = await window(4_000);
      const perSecond = busy.transactions / busy.seconds;
      // The loops' 6/s, plus one claim per parked poll per rescan (1 s), with slack for a
      // rescan landing on either side of the window.
      expect(perSecond, summary(busy)).toBeLessThanOrEqual(8 + parked * 1.25);
    } finally {
      aborts.abort();
      await Promise.all(polls);
    }
  });
});
