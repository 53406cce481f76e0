/**
 * How the server holds up under many parked waits and misbehaving clients.
 */
import { Agent, request as httpRequest } from 'node:http';
import { connect, type Socket } from 'node:net';
import type { WorkerSession } from '@ledgence/contracts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NAMESPACE, Stack, TENANT } from './test/harness.js';

const scope = { tenant_id: TENANT, namespace: NAMESPACE };
const base = `/v1/tenants/${TENANT}/namespaces/${NAMESPACE}`;
const agent = new Agent({ keepAlive: false, maxSockets: Number.POSITIVE_INFINITY });

interface Reply {
  status: number;
  // biome-ignore lint/suspicious/noExplicitAny: replies of many routes, read field by field
  body: any;
}

/** One request over its own socket; `abort` destroys the socket (a client that goes away). */
function send(
  url: string,
  method: string,
  path: string,
  body?: unknown,
): { done: Promise<Reply>; abort: () => void } {
  const target = new URL(path, url);
  let abort = () => {};
  const done = new Promise<Reply>((resolve, reject) => {
    const req = httpRequest(
      target,
      {
        method,
        agent,
        headers: body === undefined ? {} : { 'content-type': 'application/json' },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          resolve({ status: res.statusCode ?? 0, body: text === '' ? null : JSON.parse(text) });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    abort = () => req.destroy();
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
  // Aborted requests reject; a test awaits them later, so none counts as unhandled meanwhile.
  done.catch(() => undefined);
  return { done, abort };
}

const post = (url: string, path: string, body: unknown) => send(url, 'POST', path, body).done;

function submitBody(key: string, queue: string) {
  return { idempotency_key: key, input: { ...scope, queue, program: { name: 'noop' }, data: {} } };
}

async function openSession(url: string, queue: string, concurrency: number) {
  const reply = await post(url, '/v1/worker/sessions', { scope, queue, concurrency });
  expect(reply.status).toBeLessThan(300);
  return reply.body as WorkerSession;
}

function poll(session: WorkerSession, consumer: number, sequence: number) {
  return {
    scope,
    queue: session.queue,
    worker_session_id: session.id,
    consumer_id: consumer,
    sequence,
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('many parked waits', () => {
  const stack = new Stack('load_parked');
  beforeAll(async () => {
    await stack.open();
  });
  afterAll(async () => {
    await stack.close();
    agent.destroy();
  });

  it('1 000 parked acquire polls hold no pool connection: submits on a pool of 2 answer while they park, and wake them', async () => {
    const server = await stack.start({
      LEDGENCE_DB_POOL_SIZE: '2',
      LEDGENCE_LONG_POLL_WAIT_MS: '20000',
      LEDGENCE_RESCAN_INTERVAL_MS: '10000',
    });
    const queues = 50;
    const slots = 20;
    const sessions = await Promise.all(
      Array.from({ length: queues }, (_, q) => openSession(server.url, `q${q}`, slots)),
    );
    const began = Date.now();
    const polls = sessions.flatMap((s) =>
      Array.from({ length: slots }, (_, c) =>
        send(server.url, 'POST', '/v1/worker/acquire?wait_ms=20000', poll(s, c, 1)),
      ),
    );
    await sleep(2_000);
    const t0 = Date.now();
    const submits = await Promise.all(
      sessions.map((s, q) => post(server.url, `${base}/tasks`, submitBody(`k${q}`, s.queue))),
    );
    const submitMs = Date.now() - t0;
    expect(submits.map((r) => r.status)).toEqual(sessions.map(() => 201));
    // One task per queue: exactly one poll of each queue gets it, quickly (not at the 20 s end).
    const assigned: Reply[] = [];
    await Promise.race([
      Promise.all(
        polls.map((p) =>
          p.done.then((r) => {
            if (r.body?.disposition === 'assigned') assigned.push(r);
          }),
        ),
      ),
      (async () => {
        while (assigned.length < queues && Date.now() - began < 15_000) await sleep(50);
      })(),
    ]);
    console.log({ submitMs, assigned: assigned.length, after: Date.now() - t0 });
    // One run under heavy load (submits took 7 s) counted 52 assignments of the 50 tasks, not
    // reproduced since: should it recur, the message says which tasks and owners they were.
    const owners = assigned.map((r) => r.body.assignment.lease.owner);
    expect(
      { replies: assigned.length, tasks: new Set(owners.map((o) => o.task_id)).size },
      JSON.stringify(owners),
    ).toEqual({ replies: queues, tasks: queues });
    for (const p of polls) p.abort();
    await Promise.allSettled(polls.map((p) => p.done));
    console.log(server.stderr());
    expect(server.stderr()).not.toMatch(/MaxListenersExceeded/);
  });

  it('a parked poll whose client disconnects consumes nothing, over many rounds of 500 aborted waits', async () => {
    const server = await stack.start({
      LEDGENCE_DB_POOL_SIZE: '2',
      LEDGENCE_LONG_POLL_WAIT_MS: '20000',
      LEDGENCE_RESCAN_INTERVAL_MS: '200',
    });
    const sessions = await Promise.all(
      Array.from({ length: 25 }, (_, q) => openSession(server.url, `d${q}`, 20)),
    );
    // An aborted poll is not recorded: every round re-sends sequence 1 as a new poll.
    const sequence = 1;
    for (let round = 0; round < 5; round++) {
      const polls = sessions.flatMap((s) =>
        Array.from({ length: 20 }, (_, c) =>
          send(server.url, 'POST', '/v1/worker/acquire?wait_ms=20000', poll(s, c, sequence)),
        ),
      );
      const waits = sessions.map((_s, q) =>
        send(server.url, 'GET', `${base}/tasks/tsk_nonexistent${q}/result?wait_ms=20000`),
      );
      await sleep(700);
      for (const p of [...polls, ...waits]) p.abort();
      const ended = await Promise.allSettled(polls.map((p) => p.done));
      // None was answered (a 409 would mean an earlier round's aborted poll was recorded).
      expect(ended.filter((e) => e.status === 'fulfilled')).toEqual([]);
      await Promise.allSettled(waits.map((p) => p.done));
    }
    await sleep(300);
    // A task submitted now is claimable at once by the same slot and sequence, without a wait:
    // the aborted polls recorded nothing and hold nothing.
    const submitted = await post(server.url, `${base}/tasks`, submitBody('after-aborts', 'd0'));
    expect(submitted.status).toBe(201);
    const first = sessions[0] as WorkerSession;
    const again = await post(server.url, '/v1/worker/acquire', poll(first, 0, sequence));
    expect(again.status).toBe(200);
    expect(again.body.disposition).toBe('assigned');
    expect(server.stderr()).not.toMatch(/MaxListenersExceeded|memory leak/i);
  });

  it('SIGTERM with 1 000 parked polls and result waits: all answered, exit 0 within the budget', async () => {
    const server = await stack.start({
      LEDGENCE_LONG_POLL_WAIT_MS: '20000',
      LEDGENCE_RESCAN_INTERVAL_MS: '5000',
      LEDGENCE_SHUTDOWN_TIMEOUT_MS: '10000',
    });
    const sessions = await Promise.all(
      Array.from({ length: 40 }, (_, q) => openSession(server.url, `s${q}`, 20)),
    );
    const polls = sessions.flatMap((s) =>
      Array.from({ length: 20 }, (_, c) =>
        send(server.url, 'POST', '/v1/worker/acquire?wait_ms=20000', poll(s, c, 1)),
      ),
    );
    const task = await post(server.url, `${base}/tasks`, submitBody('waited', 'nobody'));
    const waits = Array.from({ length: 200 }, () =>
      send(server.url, 'GET', `${base}/tasks/${task.body.task_id}/result?wait_ms=20000`),
    );
    await sleep(2_000);
    const began = Date.now();
    const exited = server.stop('SIGTERM');
    const answers = await Promise.allSettled(polls.map((p) => p.done));
    const results = await Promise.allSettled(waits.map((p) => p.done));
    const code = await exited;
    const took = Date.now() - began;
    const statuses = new Map<string, number>();
    for (const a of [...answers, ...results]) {
      const key =
        a.status === 'fulfilled'
          ? `${a.value.status} ${a.value.body?.disposition ?? a.value.body?.outcome?.state ?? a.value.body?.code}`
          : `error ${String(a.reason)}`;
      statuses.set(key, (statuses.get(key) ?? 0) + 1);
    }
    console.log({ took, code, statuses: [...statuses] });
    expect([...statuses]).toEqual([
      ['200 empty', 800],
      ['200 pending', 200],
    ]);
    expect(code).toBe(0);
    expect(took).toBeLessThan(15_000);
  });

  it('200 concurrent single submits on a pool of 2 are all answered 201', async () => {
    const server = await stack.start({ LEDGENCE_DB_POOL_SIZE: '2' });
    const replies = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        post(server.url, `${base}/tasks`, submitBody(`burst-${i}`, 'burst')),
      ),
    );
    const codes = new Map<number, number>();
    for (const r of replies) codes.set(r.status, (codes.get(r.status) ?? 0) + 1);
    expect([...codes]).toEqual([[201, 200]]);
  });

  it('1 000 polls parked on one queue, pool of 2: a stream of 300 submits is answered and all claimed', async () => {
    const server = await stack.start({
      LEDGENCE_DB_POOL_SIZE: '2',
      LEDGENCE_LONG_POLL_WAIT_MS: '20000',
      LEDGENCE_RESCAN_INTERVAL_MS: '1000',
      // No worker renews here: leases outlive the test, so no task is recovered and re-claimed.
      LEDGENCE_LEASE_DURATION_MS: '60000',
    });
    const sessions = await Promise.all(
      Array.from({ length: 10 }, () => openSession(server.url, 'hot', 100)),
    );
    const assigned: string[] = [];
    const other: string[] = [];
    let t0 = Date.now();
    const polls = sessions.flatMap((s) =>
      Array.from({ length: 100 }, (_, c) => {
        const p = send(server.url, 'POST', '/v1/worker/acquire?wait_ms=20000', poll(s, c, 1));
        p.done.then(
          (r) => {
            if (r.body?.disposition === 'assigned') {
              assigned.push(r.body.assignment.lease.owner.task_id);
            } else other.push(`${r.status} ${r.body?.disposition ?? r.body?.code}`);
          },
          () => undefined, // aborted at the end
        );
        return p;
      }),
    );
    await sleep(2_000);
    const latencies: number[] = [];
    const statuses = new Map<number, number>();
    t0 = Date.now();
    for (let wave = 0; wave < 30; wave++) {
      await Promise.all(
        Array.from({ length: 10 }, async (_, i) => {
          const began = Date.now();
          const r = await post(server.url, `${base}/tasks`, submitBody(`hot-${wave}-${i}`, 'hot'));
          latencies.push(Date.now() - began);
          statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
        }),
      );
    }
    const submitted = Date.now() - t0;
    while (assigned.length < 300 && Date.now() - t0 < 18_000) await sleep(50);
    latencies.sort((a, b) => a - b);
    console.log({
      submitted,
      claimedAfter: Date.now() - t0,
      assigned: assigned.length,
      p50: latencies[150],
      p99: latencies[297],
      max: latencies[299],
      statuses: [...statuses],
      other: other.slice(0, 5),
      others: other.length,
    });
    expect([...statuses]).toEqual([[201, 300]]);
    expect(new Set(assigned).size).toBe(300);
    for (const p of polls) p.abort();
    await Promise.allSettled(polls.map((p) => p.done));
  });

  it('500 result waits on 500 tasks are each woken by their own task becoming terminal', async () => {
    const server = await stack.start({
      LEDGENCE_DB_POOL_SIZE: '2',
      LEDGENCE_LONG_POLL_WAIT_MS: '20000',
      LEDGENCE_RESCAN_INTERVAL_MS: '20000',
    });
    const tasks = await Promise.all(
      Array.from({ length: 500 }, (_, i) =>
        post(server.url, `${base}/tasks`, submitBody(`wait-${i}`, 'waited')),
      ),
    );
    const ids = tasks.map((t) => t.body.task_id as string);
    const began = Date.now();
    const waits = ids.map((id) =>
      send(server.url, 'GET', `${base}/tasks/${id}/result?wait_ms=20000`),
    );
    await sleep(1_500);
    // Only the even tasks end: their waits answer, the odd ones stay parked.
    const cancels = await Promise.all(
      ids
        .filter((_, i) => i % 2 === 0)
        .map((id) => post(server.url, `${base}/tasks/${id}/cancel`, {})),
    );
    expect(cancels.every((c) => c.status === 200)).toBe(true);
    const even = await Promise.all(waits.filter((_, i) => i % 2 === 0).map((w) => w.done));
    // Woken by the hint, not by the 20 s end of the wait (a termination bound, not a speed claim).
    expect(Date.now() - began).toBeLessThan(15_000);
    expect(new Set(even.map((r) => `${r.status} ${r.body.outcome.state}`))).toEqual(
      new Set(['200 cancelled']),
    );
    for (const w of waits) w.abort();
    await Promise.allSettled(waits.map((w) => w.done));
    expect(server.stderr()).not.toMatch(/MaxListenersExceeded|memory leak/i);
  });

  it('2 000 result waits rescanning on a pool of 2: submits meanwhile are all answered', async () => {
    const server = await stack.start({
      LEDGENCE_DB_POOL_SIZE: '2',
      LEDGENCE_LONG_POLL_WAIT_MS: '20000',
      LEDGENCE_RESCAN_INTERVAL_MS: '1000',
    });
    const tasks = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        post(server.url, `${base}/tasks`, submitBody(`r-${i}`, 'rq')),
      ),
    );
    const waits = Array.from({ length: 2000 }, (_, i) =>
      send(server.url, 'GET', `${base}/tasks/${tasks[i % 20]?.body.task_id}/result?wait_ms=20000`),
    );
    await sleep(3_000);
    const latencies: number[] = [];
    const statuses = new Map<number, number>();
    for (let wave = 0; wave < 10; wave++) {
      await Promise.all(
        Array.from({ length: 10 }, async (_, i) => {
          const began = Date.now();
          const r = await post(server.url, `${base}/tasks`, submitBody(`rs-${wave}-${i}`, 'rq2'));
          latencies.push(Date.now() - began);
          statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
        }),
      );
    }
    latencies.sort((a, b) => a - b);
    console.log({
      p50: latencies[50],
      p99: latencies[98],
      max: latencies[99],
      statuses: [...statuses],
    });
    expect([...statuses]).toEqual([[201, 100]]);
    for (const w of waits) w.abort();
    await Promise.allSettled(waits.map((w) => w.done));
  });

  it('300 slowloris clients (headers or body trickled) leave the server serving others', async () => {
    const server = await stack.start({ LEDGENCE_DB_POOL_SIZE: '2' });
    const { port } = new URL(server.url);
    const body = JSON.stringify(submitBody('slow', 'slow'));
    const head = `POST ${base}/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n`;
    const sockets: Socket[] = [];
    for (let i = 0; i < 300; i++) {
      const socket = connect(Number(port), '127.0.0.1');
      socket.on('error', () => undefined);
      // Half trickle their headers, half declare a body and trickle it.
      socket.write(i % 2 === 0 ? head : `${head}content-length: ${body.length}\r\n\r\n`);
      sockets.push(socket);
    }
    const trickle = setInterval(() => {
      for (const [i, socket] of sockets.entries()) socket.write(i % 2 === 0 ? 'x' : ' ');
    }, 200);
    try {
      await sleep(1_000);
      const replies = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          post(server.url, `${base}/tasks`, submitBody(`fast-${i}`, 'fast')),
        ),
      );
      expect(replies.map((r) => r.status)).toEqual(replies.map(() => 201));
    } finally {
      clearInterval(trickle);
      for (const socket of sockets) socket.destroy();
    }
  });

  it('SIGTERM with 200 parked acquire:batch polls: each answered with every slot empty, exit 0', async () => {
    const server = await stack.start({
      LEDGENCE_LONG_POLL_WAIT_MS: '20000',
      LEDGENCE_RESCAN_INTERVAL_MS: '5000',
    });
    const sessions = await Promise.all(
      Array.from({ length: 200 }, (_, q) => openSession(server.url, `b${q % 20}`, 5)),
    );
    const polls = sessions.map((s) =>
      send(server.url, 'POST', '/v1/worker/acquire:batch?wait_ms=20000', {
        commands: Array.from({ length: 5 }, (_, c) => poll(s, c, 1)),
      }),
    );
    await sleep(2_000);
    const exited = server.stop('SIGTERM');
    const answers = await Promise.all(polls.map((p) => p.done));
    expect(await exited).toBe(0);
    const kinds = new Set(
      answers.map(
        (a) =>
          `${a.status} ${a.body.replies.map((r: { disposition: string }) => r.disposition).join(',')}`,
      ),
    );
    expect(kinds).toEqual(new Set(['200 empty,empty,empty,empty,empty']));
  });
});
