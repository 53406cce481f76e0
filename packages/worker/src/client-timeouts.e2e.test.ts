/**
 * The `Client` over real sockets against small `node:http` / `node:net`
 * servers that misbehave on purpose — never answering, answering gateway pages, problem
 * documents with extension members — and a caller's AbortSignal at each stage.
 */
import { createServer as createTcpServer } from 'node:net';
import { describe, expect, it } from 'vitest';
import { ProblemError, ProtocolError, TransportError } from './errors.js';
import { clientOf } from './testdata/clients.js';
import { queuedSnapshotOf } from './testdata/snapshots.js';
import { type BodyHandler, stubServers } from './testdata/stub-servers.js';

const stubs = stubServers();

/** A local server calling `handler` with each request's whole body, counting the requests. */
async function httpServer(handler: BodyHandler): Promise<{ url: string; requests: () => number }> {
  let requests = 0;
  const url = await stubs.serve((req, res, body) => {
    requests += 1;
    handler(req, res, body);
  });
  return { url, requests: () => requests };
}

/** Accepts connections and never answers. */
async function silentServer(): Promise<{ url: string; connections: () => number }> {
  let connections = 0;
  const server = createTcpServer((socket) => {
    connections += 1;
    socket.on('error', () => {});
    socket.resume();
  });
  return { url: await stubs.listen(server), connections: () => connections };
}

function timers(): number {
  return process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
}

const problem = (code: string, status: number, extra: Record<string, unknown> = {}): string =>
  JSON.stringify({
    type: `https://ledgence.dev/problems/${code}`,
    title: 't',
    status,
    code,
    detail: `d ${code}`,
    ...extra,
  });

describe('Client over misbehaving servers', () => {
  it('honours requestTimeoutMs on a server that accepts and never answers, retrying, leaving no timer', async () => {
    const before = timers();
    const silent = await silentServer();
    const c = clientOf(silent.url, { requestTimeoutMs: 100, retries: 2 });
    const error = await c.status('tsk_1').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TransportError);
    expect(error).toMatchObject({ reason: 'timeout', retryable: true });
    expect(silent.connections()).toBe(3);
    expect(timers()).toBeLessThanOrEqual(before);
  });

  it('honours an abort while the request is parked, during the backoff, and before sending, leaving no timer', async () => {
    const before = timers();
    const silent = await silentServer();
    const parked = new AbortController();
    const c = clientOf(silent.url, { requestTimeoutMs: 60_000 });
    const pending = c.result('tsk_1', { waitMs: 60_000, signal: parked.signal }).catch((e) => e);
    await new Promise((r) => setTimeout(r, 50));
    const reason = new Error('parked abort');
    parked.abort(reason);
    expect(await pending).toBe(reason);

    const busy = await httpServer((_req, res) => {
      res.writeHead(503, { 'content-type': 'application/problem+json' });
      res.end(problem('unavailable', 503));
    });
    const slow = clientOf(busy.url, { backoff: { baseMs: 60_000, maxMs: 60_000 } });
    const backingOff = new AbortController();
    const during = slow.cancel('tsk_1', { signal: backingOff.signal }).catch((e) => e);
    while (busy.requests() < 1) await new Promise((r) => setTimeout(r, 5));
    await new Promise((r) => setTimeout(r, 20));
    const reason2 = new Error('backoff abort');
    backingOff.abort(reason2);
    expect(await during).toBe(reason2);
    expect(busy.requests()).toBe(1);

    const already = AbortSignal.abort(new Error('already'));
    const none = await slow
      .submit({ queue: 'q', program: 'p' }, { signal: already })
      .catch((e) => e);
    expect((none as Error).message).toBe('already');
    expect(busy.requests()).toBe(1);
    expect(timers()).toBeLessThanOrEqual(before);
  });

  it('a non-JSON 502 from a gateway is a retried TransportError; a proxy 413 page is a clear error', async () => {
    const gateway = await httpServer((_req, res) => {
      res.writeHead(502, { 'content-type': 'text/html' });
      res.end('<html>Bad Gateway</html>');
    });
    const error = await clientOf(gateway.url, { retries: 2 })
      .status('tsk_1')
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TransportError);
    expect(error).toMatchObject({ reason: 'server', status: 502 });
    expect(gateway.requests()).toBe(3);

    const tooLarge = await httpServer((_req, res) => {
      res.writeHead(413, { 'content-type': 'text/html' });
      res.end('<html>413 Request Entity Too Large</html>');
    });
    const big = await clientOf(tooLarge.url)
      .submit({ queue: 'q', program: 'p' })
      .catch((e: unknown) => e);
    expect(big).toBeInstanceOf(ProtocolError);
    expect(big).toMatchObject({ status: 413, retryable: false });
    expect(tooLarge.requests()).toBe(1);
  });

  it('submitBatch sends again, with the same keys, the items answered unavailable (commit outcome unknown)', async () => {
    const bodies: { commands: { idempotency_key: string; input: Record<string, unknown> }[] }[] =
      [];
    const server = await httpServer((_req, res, body) => {
      const request = JSON.parse(body) as (typeof bodies)[number];
      bodies.push(request);
      // The first time, the store could not tell whether the second item's commit happened
      // (store-postgres `submitBatch`: "a commit whose outcome is unknown"): it may exist.
      const results = request.commands.map((command, i) =>
        bodies.length === 1 && i === 1
          ? JSON.parse(problem('unavailable', 503))
          : queuedSnapshotOf(command, bodies.length * 10 + i),
      );
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ results }));
    });
    const answers = await clientOf(server.url).submitBatch([
      { queue: 'q', program: 'p', data: 1 },
      { queue: 'q', program: 'p', data: 2 },
    ]);
    expect(answers.map((a) => (a instanceof Error ? `${a.name}: ${a.message}` : a.state))).toEqual([
      'queued',
      'queued',
    ]);
    expect(bodies).toHaveLength(2);
    expect(bodies[1]?.commands).toEqual([bodies[0]?.commands[1]]);
  });
  it('submitBatch stops sending unavailable items at its retry budget or abort, returning what it has', async () => {
    let requests = 0;
    const server = await httpServer((_req, res, body) => {
      requests += 1;
      const request = JSON.parse(body) as {
        commands: { idempotency_key: string; input: Record<string, unknown> }[];
      };
      const results = request.commands.map((command, i) =>
        command.input.data === 2
          ? JSON.parse(problem('unavailable', 503))
          : queuedSnapshotOf(command, i),
      );
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ results }));
    });
    const entries = [
      { queue: 'q', program: 'p', data: 1 },
      { queue: 'q', program: 'p', data: 2 },
    ];
    const spent = await clientOf(server.url, { retries: 2 }).submitBatch(entries);
    expect(requests).toBe(3);
    expect(spent[0]).toMatchObject({ state: 'queued' });
    expect(spent[1]).toBeInstanceOf(ProblemError);
    expect(spent[1]).toMatchObject({ code: 'unavailable', retryable: true });

    const controller = new AbortController();
    const slow = clientOf(server.url, { backoff: { baseMs: 60_000, maxMs: 60_000 } });
    const pending = slow.submitBatch(entries, { signal: controller.signal });
    while (requests < 4) await new Promise((r) => setTimeout(r, 5));
    await new Promise((r) => setTimeout(r, 20));
    controller.abort(new Error('enough'));
    const aborted = await pending;
    expect(requests).toBe(4);
    expect(aborted[0]).toMatchObject({ state: 'queued' });
    expect(aborted[1]).toMatchObject({ code: 'unavailable' });
  });
});
