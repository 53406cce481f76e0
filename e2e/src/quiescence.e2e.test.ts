/**
 * Quiescence confirmation end to end (DESIGN §5 Settle: with `quiescence: unconfirmed` the task
 * stays `active` until `confirm_quiescence` or the authority deadline, then takes its outcome with
 * `cleanup_confirmed`): a real server process on real PostgreSQL, the real worker SDK in this
 * process and in a process of its own, over real sockets. The cleanup grace is long (60 s), so a
 * task released within a few seconds was released by the worker's confirmation, not by its
 * authority deadline.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import {
  request as httpRequest,
  createServer as httpServer,
  type IncomingMessage,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { sourceArgs } from './server-process.js';
import {
  attemptIds,
  client,
  historyOf,
  portOf,
  reasons,
  settled,
  sleep,
  startHttpProxy,
  until,
  workerSuite,
} from './test/harness.js';

const suite = workerSuite('quiescence_e2e', {
  LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
  LEDGENCE_CLEANUP_GRACE_MS: '60000',
});
const children: ChildProcess[] = [];

afterEach(() => {
  for (const child of children.splice(0)) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
});

/**
 * An HTTP proxy to the server, closing each connection after one exchange, that holds every
 * quiescence confirmation *before* forwarding it
 * until `release()`; one whose client went away meanwhile is never forwarded (as a request cut
 * on the wire never reaches the server). With `cutReplies`, the replies of that many
 * confirmations are lost after the server answered them.
 */
async function gatedConfirmations(target: string, options: { cutReplies?: number } = {}) {
  const upstream = new URL(target);
  let open = () => {};
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  let cutReplies = options.cutReplies ?? 0;
  let held = 0;
  let forwarded = 0;
  let dropped = 0;
  const proxy = httpServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    let gone = false;
    res.on('close', () => {
      if (!res.writableFinished) gone = true;
    });
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', async () => {
      if (req.url === '/v1/worker/quiescence') {
        held += 1;
        await gate;
        if (gone) {
          dropped += 1;
          return;
        }
        forwarded += 1;
      }
      // The server takes the request and answers, and the answer is lost on the way back.
      const cut = req.url === '/v1/worker/quiescence' && cutReplies > 0;
      if (cut) cutReplies -= 1;
      const out = httpRequest(
        {
          host: upstream.hostname,
          port: upstream.port,
          method: req.method,
          path: req.url,
          headers: req.headers,
        },
        (reply) => {
          if (cut) {
            reply.resume();
            reply.on('end', () => res.destroy());
            return;
          }
          // Every connection serves one exchange (as behind a balancer closing them), so each
          // request goes out on a connection of its own, never a reused one.
          res.writeHead(reply.statusCode ?? 502, { ...reply.headers, connection: 'close' });
          reply.pipe(res);
        },
      );
      out.on('error', () => res.destroy());
      out.end(Buffer.concat(chunks));
    });
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  const { port } = proxy.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    held: () => held,
    forwarded: () => forwarded,
    dropped: () => dropped,
    release: () => open(),
    close: () =>
      new Promise<void>((resolve) => {
        open();
        proxy.closeAllConnections();
        proxy.close(() => resolve());
      }),
  };
}

const script = join(dirname(fileURLToPath(import.meta.url)), 'testdata', 'quiescence-worker.ts');

/** Starts testdata/quiescence-worker.ts; its JSON lines collect in `lines`. */
function startChild(env: Record<string, string>) {
  const child = spawn(process.execPath, sourceArgs(script), {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  const lines: { event: string; [key: string]: unknown }[] = [];
  let partial = '';
  let stderr = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => {
    stderr += chunk;
  });
  child.stdout?.setEncoding('utf8');
  child.stdout?.on('data', (chunk: string) => {
    partial += chunk;
    const complete = partial.split('\n');
    partial = complete.pop() ?? '';
    for (const text of complete) if (text.trim() !== '') lines.push(JSON.parse(text));
  });
  const exited = new Promise<number | string>((resolve) => {
    child.once('exit', (code, signal) => resolve(code ?? signal ?? 'unknown'));
  });
  return { child, lines, exited, stderr: () => stderr };
}

describe('quiescence confirmation', () => {
  it('confirms a handler that returned while its unconfirmed settlement was still being retried, once that settlement is in', async () => {
    const c = client(suite.server.url);
    const queue = 'confirm-before-settle';
    const task = await c.submit({
      queue,
      program: 'deaf',
      data: null,
      timeout_ms: 1_000,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    let settleRefused = 0;
    let refusedAfterReturn = 0;
    let returned = false;
    let confirmsAnswered = 0;
    const proxy = await startHttpProxy(suite.server.url, {
      // The server is briefly unavailable to settlements (overloaded, restarting): the worker
      // retries its `unconfirmed` report with backoff. The outage lasts past the handler's end,
      // until a confirmation sent meanwhile has been answered, or (a worker that waits for its
      // report before confirming) three more tries of the report.
      refuse: (request) => {
        if (request.path !== '/v1/worker/settle:batch') return false;
        if (returned && (confirmsAnswered > 0 || refusedAfterReturn >= 3)) return false;
        settleRefused += 1;
        if (returned) refusedAfterReturn += 1;
        return true;
      },
      observe: (request) =>
        request.path === '/v1/worker/quiescence'
          ? () => {
              confirmsAnswered += 1;
            }
          : undefined,
    });
    try {
      let release = () => {};
      const released = new Promise<void>((resolve) => {
        release = resolve;
      });
      let started = false;
      const w = suite.worker(queue, { url: proxy.url, abortGraceMs: 50 });
      w.register('deaf', async () => {
        started = true;
        await released;
        return 'late';
      });
      const running = w.run();
      await until(() => started);
      // The budget ends, the handler ignores its abort, and the worker's `unconfirmed` report is
      // refused (and retried).
      await until(() => settleRefused >= 1, 10_000, 'the unconfirmed settlement to be tried');
      // The handler ends now, while the report is still unsent.
      returned = true;
      release();
      // The report lands; the handler has ended, so the task must be released now, not at its
      // authority deadline (timeout + 60 s cleanup grace).
      await until(
        async () => reasons(await historyOf(c, task.task_id)).includes('cleanup_confirmed'),
        10_000,
        'cleanup_confirmed',
      );
      const [result] = await settled(c, [task.task_id], 5_000);
      expect(result?.outcome).toMatchObject({
        state: 'failed',
        failure: { kind: 'execution', error: { kind: 'timed_out' } },
      });
      await w.stop({ graceMs: 0 });
      await running;
    } finally {
      await proxy.close();
    }
  });

  it('a worker process stopped while its quiescence confirmation is in flight still delivers it before it exits', async () => {
    const c = client(suite.server.url);
    const queue = 'confirm-in-flight-at-stop';
    const task = await c.submit({
      queue,
      program: 'deaf',
      // Returns 2 s after it started: 1 s past its budget, well within the cleanup grace.
      data: { ms: 2_000 },
      timeout_ms: 1_000,
      retry: { max_attempts: 1, delay_ms: 0 },
    });
    const proxy = await gatedConfirmations(suite.server.url);
    try {
      const worker = startChild({ LEDGENCE_URL: proxy.url, QUEUE: queue });
      await until(() => proxy.held() >= 1, 30_000, 'the confirmation to be sent');
      expect(worker.lines.map((l) => l.event)).toContain('returned');
      // Reported `unconfirmed`, the task is held while the confirmation is on its way.
      expect((await c.status(task.task_id)).state).toBe('active');
      // The process is asked to stop while its confirmation is on the wire (a deploy's SIGTERM).
      worker.child.kill('SIGTERM');
      // The confirmation reaches the server a moment later (a slow network, a busy server):
      // well within the worker's request timeout (2 s).
      await sleep(300);
      proxy.release();
      expect(await worker.exited).toBe(0);
      // The process is gone: whatever it delivered is all the server will ever hear from it.
      const events = await historyOf(c, task.task_id);
      expect(reasons(events), worker.stderr()).toContain('cleanup_confirmed');
      expect(proxy.forwarded()).toBeGreaterThanOrEqual(1);
      const [attemptId] = attemptIds(events);
      expect((await c.attempt(task.task_id, attemptId as string)).quiescence).toBe('confirmed');
      expect((await c.status(task.task_id)).state).toBe('failed');
    } finally {
      await proxy.close();
    }
  });

  /** A worker on `url` whose `deaf` handler ignores its signal until `release()`. */
  function deafWorker(url: string, queue: string) {
    let release = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let started = false;
    const w = suite.worker(queue, { url, abortGraceMs: 50 });
    w.register('deaf', async () => {
      started = true;
      await released;
      return 'late';
    });
    return { w, release, started: () => started };
  }

  /** The ids of the queue's tasks the listing shows `active`. */
  async function activeIn(c: ReturnType<typeof client>, queue: string): Promise<string[]> {
    const ids: string[] = [];
    for await (const page of c.list({ state: 'active', queue })) {
      ids.push(...page.tasks.map((t) => t.task_id));
    }
    return ids;
  }

  async function reported(c: ReturnType<typeof client>, taskId: string): Promise<void> {
    await until(
      async () => reasons(await historyOf(c, taskId)).includes('report_accepted'),
      15_000,
      'report_accepted',
    );
  }

  const deafTask = (c: ReturnType<typeof client>, queue: string) =>
    c.submit({
      queue,
      program: 'deaf',
      data: null,
      timeout_ms: 1_000,
      retry: { max_attempts: 1, delay_ms: 0 },
    });

  it('a result wait and the listing see the held task active until the confirmation, which wakes the wait', async () => {
    const c = client(suite.server.url);
    const queue = 'held-then-woken';
    const task = await deafTask(c, queue);
    const deaf = deafWorker(suite.server.url, queue);
    const running = deaf.w.run();
    await reported(c, task.task_id);
    expect(await activeIn(c, queue)).toEqual([task.task_id]);
    expect((await c.result(task.task_id)).outcome).toEqual({ state: 'pending' });
    // A wait far shorter than the authority deadline (60 s away): only the confirmation ends it.
    const waiting = c.result(task.task_id, { waitMs: 20_000 });
    await sleep(200);
    deaf.release();
    const result = await waiting;
    expect(result.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'execution', error: { kind: 'timed_out' } },
    });
    expect(await activeIn(c, queue)).toEqual([]);
    const history = reasons(await historyOf(c, task.task_id));
    expect(history.filter((r) => r === 'cleanup_confirmed')).toHaveLength(1);
    expect(history.filter((r) => r === 'failed')).toHaveLength(1);
    await deaf.w.stop({ graceMs: 0 });
    await running;
  });

  it('a confirmation whose reply was lost is sent again and answered; cleanup is confirmed once', async () => {
    const c = client(suite.server.url);
    const queue = 'confirm-reply-lost';
    const task = await deafTask(c, queue);
    const proxy = await gatedConfirmations(suite.server.url, { cutReplies: 1 });
    proxy.release();
    try {
      const deaf = deafWorker(proxy.url, queue);
      const running = deaf.w.run();
      await reported(c, task.task_id);
      deaf.release();
      await until(() => proxy.held() >= 2, 10_000, 'the confirmation to be sent again');
      await settled(c, [task.task_id], 10_000);
      const history = reasons(await historyOf(c, task.task_id));
      expect(history.filter((r) => r === 'cleanup_confirmed')).toHaveLength(1);
      await deaf.w.stop({ graceMs: 0 });
      await running;
    } finally {
      await proxy.close();
    }
  });

  it('a confirmation is retried across a server restart', async () => {
    const c = client(suite.server.url);
    const queue = 'confirm-restart';
    const task = await deafTask(c, queue);
    const env = { LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200', LEDGENCE_CLEANUP_GRACE_MS: '60000' };
    const doomed = await suite.stack.start(env);
    const deaf = deafWorker(doomed.url, queue);
    const running = deaf.w.run();
    await reported(c, task.task_id);
    await doomed.stop('SIGKILL');
    // The handler ends while its server is down: the confirmation fails (refused connections).
    deaf.release();
    await sleep(500);
    await suite.stack.start({ ...env, PORT: portOf(doomed.url) });
    await until(
      async () => reasons(await historyOf(c, task.task_id)).includes('cleanup_confirmed'),
      15_000,
      'cleanup_confirmed',
    );
    expect((await c.status(task.task_id)).state).toBe('failed');
    await deaf.w.stop({ graceMs: 0 });
    await running;
  });

  it('a handler that never returns: the task is held to its authority deadline, then takes its outcome unconfirmed', async () => {
    const shortGrace = await suite.stack.start({
      LEDGENCE_LEASE_SAFETY_MARGIN_MS: '200',
      LEDGENCE_CLEANUP_GRACE_MS: '2000',
    });
    const c = client(shortGrace.url);
    const queue = 'never-returns';
    const task = await deafTask(c, queue);
    const deaf = deafWorker(shortGrace.url, queue);
    const running = deaf.w.run();
    await reported(c, task.task_id);
    // The worker (or its process) goes away; the handler never ends.
    await deaf.w.stop({ graceMs: 0 });
    await running;
    expect((await c.status(task.task_id)).state).toBe('active');
    const [result] = await settled(c, [task.task_id], 15_000);
    expect(result?.outcome).toMatchObject({
      state: 'failed',
      failure: { kind: 'execution', error: { kind: 'timed_out' } },
    });
    const events = await historyOf(c, task.task_id);
    const history = reasons(events);
    expect(history).not.toContain('cleanup_confirmed');
    expect(history).not.toContain('lease_expired');
    expect(history.slice(-2)).toEqual(['report_accepted', 'failed']);
    const [attemptId] = attemptIds(events);
    const attempt = await c.attempt(task.task_id, attemptId as string);
    expect(attempt.quiescence).toBe('unconfirmed');
    // Ended at the authority deadline (the attempt's deadline plus the 2 s cleanup grace).
    const terminal = events.at(-1)?.event.at ?? 0;
    expect(terminal).toBeGreaterThanOrEqual(attempt.authority_deadline);
    deaf.release();
  });
});
