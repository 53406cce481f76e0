/**
 * The completion sender under load and with slow receivers, against real server processes and
 * real node:http receivers: one receiver's hanging tries do not hold up another's deliveries
 * (until 2026-12-05 the loop leased again only once half its window was free, so 60 hanging
 * tries held a healthy destination's events until their deadline), a burst stays within the
 * window and leaves no socket, a 2xx after the deadline is a failed try, retries keep the
 * schedule the subscriptions route shows, and two replicas never post one event at once.
 */
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { createServer, type Server, type ServerResponse } from 'node:http';
import {
  COMPLETION_MAX_RETRY_DELAY_MS,
  deterministicFullJitter,
  exponentialCap,
  MAX_COMPLETION_BATCH,
} from '@ledgence/contracts';
import type { Client } from '@ledgence/worker';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { client, idsOf, Stack, sleep, until } from './test/harness.js';

const SECRET = `whsec_${Buffer.alloc(32, 9).toString('base64')}`;

interface Post {
  id: string;
  at: number;
}

type Answer = number | 'hang' | { delayMs: number; status: number };

/** A receiver recording each POST with its arrival time and the number of requests open at once. */
async function startReceiver(answer: (post: Post, seen: number) => Answer = () => 200) {
  const posts: Post[] = [];
  const held = new Set<ServerResponse>();
  let open = 0;
  let maxOpen = 0;
  const state = { retryAfter: '' };
  const server: Server = createServer((request, response) => {
    open += 1;
    maxOpen = Math.max(maxOpen, open);
    response.on('close', () => {
      open -= 1;
      held.delete(response);
    });
    request.resume();
    request.on('end', () => {
      const post = { id: String(request.headers['webhook-id']), at: Date.now() };
      const seen = posts.filter((p) => p.id === post.id).length;
      posts.push(post);
      const a = answer(post, seen);
      if (a === 'hang') {
        held.add(response);
        return;
      }
      if (typeof a === 'number') {
        response
          .writeHead(a, a === 503 && state.retryAfter ? { 'retry-after': state.retryAfter } : {})
          .end();
        return;
      }
      held.add(response);
      setTimeout(() => {
        if (!response.destroyed) response.writeHead(a.status).end();
      }, a.delayMs);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}/hooks`,
    posts,
    get open() {
      return open;
    },
    get maxOpen() {
      return maxOpen;
    },
    set retryAfter(value: string) {
      state.retryAfter = value;
    },
    resetMaxOpen: () => {
      maxOpen = open;
    },
    connections: () =>
      new Promise<number>((resolve, reject) =>
        server.getConnections((error, n) => (error ? reject(error) : resolve(n))),
      ),
    ids: () => new Set(posts.map((p) => p.id)),
    close: () =>
      new Promise<void>((resolve) => {
        for (const r of held) r.destroy();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Remote ports of the process's established TCP sockets, counted. */
function remotePorts(pid: number): Record<string, number> {
  const inodes = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const link = readlinkSync(`/proc/${pid}/fd/${fd}`);
      const m = /^socket:\[(\d+)\]$/.exec(link);
      if (m) inodes.add(m[1] as string);
    } catch {}
  }
  const counts: Record<string, number> = {};
  for (const line of readFileSync(`/proc/${pid}/net/tcp`, 'utf8').split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 10 || !inodes.has(f[9] as string)) continue;
    const port = String(Number.parseInt((f[2] as string).split(':')[1] as string, 16));
    const key = `${port}/${f[3]}`;
    counts[key] = (counts[key] ?? 0) + 1;
  }
  return counts;
}

type Receiver = Awaited<ReturnType<typeof startReceiver>>;

function destinations(map: Record<string, { r: Receiver; timeoutMs: number }>) {
  return JSON.stringify(
    Object.fromEntries(
      Object.entries(map).map(([alias, { r, timeoutMs }]) => [
        alias,
        { url: r.url, secret: SECRET, timeout_ms: timeoutMs },
      ]),
    ),
  );
}

// Each test gets its own database: a killed server leaves leased deliveries behind that the next
// test's server would otherwise post (or hold slots for) once their lease runs out.
const stacks: Stack[] = [];
const closers: (() => Promise<void>)[] = [];
let stack: Stack;
beforeEach(async () => {
  stack = await new Stack('callbacks_load').open();
  stacks.push(stack);
});
afterEach(async () => {
  await Promise.all(stacks.splice(0).map((s) => s.close()));
  await Promise.all(closers.splice(0).map((c) => c()));
});

async function receiver(answer?: (post: Post, seen: number) => Answer): Promise<Receiver> {
  const r = await startReceiver(answer);
  closers.push(r.close);
  return r;
}

/** `n` terminal (cancelled) tasks on `queue`, each subscribed to `destination`. */
async function subscribedTerminalTasks(
  c: Client,
  queue: string,
  n: number,
  destination: string,
): Promise<{ ids: string[]; events: Map<string, string> }> {
  const ids = idsOf(
    await c.submitBatch(
      Array.from({ length: n }, (_, i) => ({ queue, program: 'never-run', data: { i } })),
    ),
  );
  const events = new Map<string, string>();
  for (let start = 0; start < ids.length; start += 25) {
    await Promise.all(
      ids.slice(start, start + 25).map(async (id) => {
        await c.cancel(id);
        const s = await c.subscribe(id, { destination });
        events.set(s.event_id, id);
      }),
    );
  }
  return { ids, events };
}

describe('head-of-line blocking', () => {
  it.each([
    ['hangs until its 15 s deadline', 'hang' as const],
    ['answers 200 after 8 s (within its deadline)', { delayMs: 8_000, status: 200 }],
  ])(
    '60 deliveries to a destination that %s do not hold up a healthy destination',
    async (_, slowAnswer) => {
      const slow = await receiver(() => slowAnswer);
      const healthy = await receiver(() => 200);
      const server = await stack.start({
        LEDGENCE_CALLBACK_DESTINATIONS: destinations({
          slow: { r: slow, timeoutMs: 15_000 },
          healthy: { r: healthy, timeoutMs: 2_000 },
        }),
        LEDGENCE_COMPLETION_RETRY_BASE_MS: '1000',
      });
      const c = client(server.url);
      await subscribedTerminalTasks(c, 'hol-slow', 60, 'slow');
      // Every slow try is in flight (and stuck) before the healthy events fall due.
      await until(() => slow.open >= 60, 20_000, '60 slow tries in flight');

      const started = Date.now();
      const { events } = await subscribedTerminalTasks(c, 'hol-healthy', 5, 'healthy');
      const subscribedAt = Date.now();
      await until(() => healthy.ids().size >= 5, 40_000, 'the healthy deliveries');
      const latest = Math.max(...healthy.posts.map((p) => p.at));
      expect([...healthy.ids()].sort()).toEqual([...events.keys()].sort());
      // A healthy destination's events arrive within a few idle polls of falling due, not once
      // the slow destination's tries end.
      expect(
        latest - subscribedAt,
        `subscribing took ${subscribedAt - started} ms; slow tries still open: ${slow.open}`,
      ).toBeLessThan(3_000);
    },
    120_000,
  );
});

describe('a burst', () => {
  it('250 deliveries due in the same second: each posted once more, at most MAX_COMPLETION_BATCH open at once, no sockets left behind', async () => {
    // The first try of every event is answered 503 with one Retry-After date, so all 250 fall
    // due together; the second is answered 200 after 300 ms.
    let retryAt = '';
    const r = await receiver((_, seen) => (seen === 0 ? 503 : { delayMs: 300, status: 200 }));
    const server = await stack.start({
      LEDGENCE_CALLBACK_DESTINATIONS: destinations({ billing: { r, timeoutMs: 5_000 } }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
    });
    retryAt = new Date(Math.ceil((Date.now() + 14_000) / 1000) * 1000).toUTCString();
    r.retryAfter = retryAt;
    const pid = server.child.pid as number;
    const c = client(server.url);
    const { events } = await subscribedTerminalTasks(c, 'burst', 250, 'billing');
    await until(() => r.posts.length >= 250, 12_000, 'the 250 first tries');
    const firstRoundDone = Date.now();
    r.resetMaxOpen();
    await until(() => r.posts.length >= 500, 60_000, '500 posts');
    const dueAt = Date.parse(retryAt);
    await sleep(2_000);
    expect(firstRoundDone).toBeLessThan(dueAt);
    const counts = new Map<string, number>();
    for (const p of r.posts) counts.set(p.id, (counts.get(p.id) ?? 0) + 1);
    expect([...counts.keys()].sort()).toEqual([...events.keys()].sort());
    expect([...counts.values()].every((n) => n === 2)).toBe(true);
    expect(r.posts).toHaveLength(500);
    // The window was used, and never exceeded.
    expect(r.maxOpen).toBeGreaterThanOrEqual(MAX_COMPLETION_BATCH / 2);
    expect(r.maxOpen).toBeLessThanOrEqual(MAX_COMPLETION_BATCH);
    // Kept-alive connections end with the keep-alive timeouts: no socket of the burst stays.
    await until(
      async () => (await r.connections()) === 0,
      20_000,
      'the receiver connections closed',
    );
    const port = new URL(r.url).port;
    expect(Object.keys(remotePorts(pid)).filter((k) => k.startsWith(`${port}/`))).toEqual([]);
  }, 240_000);
});

describe('a 2xx after the destination timeout', () => {
  it('counts as a failed try: the same webhook-id is posted again and recorded delivered at try 2', async () => {
    const r = await receiver((_, seen) => (seen === 0 ? { delayMs: 1_800, status: 200 } : 200));
    const server = await stack.start({
      LEDGENCE_CALLBACK_DESTINATIONS: destinations({ billing: { r, timeoutMs: 1_000 } }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
    });
    const c = client(server.url);
    const { ids, events } = await subscribedTerminalTasks(c, 'late-2xx', 1, 'billing');
    const [eventId] = [...events.keys()];
    await until(() => r.posts.length >= 2, 20_000, 'the second post');
    await sleep(2_000);
    expect(r.posts.map((p) => p.id)).toEqual([eventId, eventId]);
    const [s] = await c.subscriptions(ids[0] as string);
    expect(s).toMatchObject({ state: 'delivered', attempts: 2, generation: 1 });
  }, 60_000);
});

describe('the retry schedule', () => {
  it('each retry happens at the next_attempt_at the subscriptions route showed, which follows the capped full-jitter schedule', async () => {
    const baseMs = 500;
    const failures = 4;
    const r = await receiver((_, seen) => (seen < failures ? 500 : 200));
    const server = await stack.start({
      LEDGENCE_CALLBACK_DESTINATIONS: destinations({ billing: { r, timeoutMs: 2_000 } }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: String(baseMs),
    });
    const c = client(server.url);
    const { ids, events } = await subscribedTerminalTasks(c, 'schedule', 1, 'billing');
    const [eventId] = [...events.keys()] as [string];
    const taskId = ids[0] as string;
    // next_attempt_at seen while due after try k (1-based).
    const shown = new Map<number, number>();
    const deadline = Date.now() + 60_000;
    for (;;) {
      const [s] = await c.subscriptions(taskId);
      if (s?.state === 'due' && s.attempts > 0 && s.next_attempt_at !== undefined) {
        shown.set(s.attempts, s.next_attempt_at);
      }
      if (s?.state === 'delivered') break;
      if (Date.now() > deadline) throw new Error('not delivered');
      await sleep(10);
    }
    expect(r.posts).toHaveLength(failures + 1);
    for (let k = 1; k <= failures; k += 1) {
      const next = shown.get(k);
      expect(next, `next_attempt_at after try ${k}`).toBeDefined();
      const failedAt = (r.posts[k - 1] as Post).at;
      const retriedAt = (r.posts[k] as Post).at;
      const cap = exponentialCap(
        { delay_ms: baseMs, backoff: 'exponential', max_delay_ms: COMPLETION_MAX_RETRY_DELAY_MS },
        k,
      );
      const expectedDelay = deterministicFullJitter(cap, [eventId], k);
      expect(expectedDelay).toBeLessThanOrEqual(baseMs * 2 ** (k - 1));
      // The shown time is the report time plus the deterministic delay.
      expect(Math.abs((next as number) - failedAt - expectedDelay)).toBeLessThan(300);
      // The try happens at the shown time: not before, and within an idle poll or so after.
      expect(retriedAt - (next as number)).toBeGreaterThanOrEqual(-50);
      expect(retriedAt - (next as number)).toBeLessThan(700);
    }
  }, 90_000);
});

describe('two replicas under load', () => {
  it('never post one event twice at once, and a replica SIGKILLed with tries in flight loses none: they are posted again after the lease', async () => {
    // Every POST is answered 200 after 1 s; each replica posts to its own path of one receiver.
    const posts: { id: string; path: string; at: number }[] = [];
    const open = new Map<string, number>();
    const answered = new Set<string>();
    let concurrentTwice = 0;
    const server: Server = createServer((request, response) => {
      const id = String(request.headers['webhook-id']);
      const path = String(request.url);
      request.resume();
      open.set(id, (open.get(id) ?? 0) + 1);
      if ((open.get(id) ?? 0) > 1) concurrentTwice += 1;
      posts.push({ id, path, at: Date.now() });
      let closed = false;
      response.on('close', () => {
        closed = true;
        open.set(id, (open.get(id) ?? 1) - 1);
      });
      setTimeout(() => {
        if (closed || response.destroyed) return;
        response.writeHead(200).end(() => answered.add(id));
      }, 1_000);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    closers.push(
      () =>
        new Promise<void>((resolve) => {
          server.closeAllConnections();
          server.close(() => resolve());
        }),
    );
    const base = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
    const env = (path: string) => ({
      LEDGENCE_CALLBACK_DESTINATIONS: JSON.stringify({
        billing: { url: `${base}${path}`, secret: SECRET, timeout_ms: 3_000 },
      }),
      LEDGENCE_COMPLETION_RETRY_BASE_MS: '50',
      LEDGENCE_COMPLETION_LEASE_MS: '1000',
    });
    const [a, b] = await Promise.all([stack.start(env('/a')), stack.start(env('/b'))]);
    const c = client(b.url);
    const { ids, events } = await subscribedTerminalTasks(c, 'replicas-load', 150, 'billing');
    // Kill A while it has tries in flight.
    const inFlightAtA = () => posts.filter((p) => p.path === '/a' && !answered.has(p.id));
    await until(
      () => inFlightAtA().filter((p) => p.at > Date.now() - 500).length >= 3,
      30_000,
      'tries in flight at A',
    );
    const killedAt = Date.now();
    // Posted in the last 0.5 s: their 1 s answer cannot have come before the kill.
    const lostWithA = new Set(
      inFlightAtA()
        .filter((p) => p.at > killedAt - 500)
        .map((p) => p.id),
    );
    expect(await a.stop('SIGKILL')).toBe('SIGKILL');
    await until(() => [...events.keys()].every((id) => answered.has(id)), 90_000, 'all answered');
    await sleep(2_000);
    expect(concurrentTwice).toBe(0);
    const counts = new Map<string, number>();
    for (const p of posts) counts.set(p.id, (counts.get(p.id) ?? 0) + 1);
    const twice = [...counts].filter(([, n]) => n > 1).map(([id]) => id);
    // Only the tries A had in flight (or had leased) are posted again, once, by B, after the
    // lease (the longest timeout + 5 s from A's lease).
    expect(
      twice.every((id) => lostWithA.has(id) || posts.find((p) => p.id === id)?.path === '/a'),
    ).toBe(true);
    for (const id of lostWithA) {
      const again = posts.filter((p) => p.id === id).slice(1);
      expect(again.length, `posted again: ${id}`).toBeGreaterThanOrEqual(1);
      expect(again.every((p) => p.path === '/b' && p.at >= killedAt + 2_000)).toBe(true);
    }
    expect([...counts.values()].every((n) => n <= 2)).toBe(true);
    for (const id of ids.slice(0, 10)) {
      await until(async () => (await c.subscriptions(id))[0]?.state === 'delivered', 20_000);
    }
  }, 180_000);
});
