/**
 * `Retry-After` over real sockets: a small `node:http` server stands in for a rate limiter or a
 * gateway in front of the server (429/503 pages with the header) and for a server answering
 * `unavailable` with it. The transport carries the wait on its errors, over both exchanges, and
 * the `Client` waits at least that long before sending again — measured at the server, between
 * the two requests — up to its backoff's `maxMs`.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { WorkerSessionSchema } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { ProblemError, TransportError } from './errors.js';
import { type FetchLike, HttpTransport } from './http.js';
import type { LogFields, Logger } from './logger.js';
import { clientOf } from './testdata/clients.js';
import {
  queuedSnapshotOf,
  queuedStatus,
  type SentCommand,
  unavailableProblem,
} from './testdata/snapshots.js';
import { stubServers } from './testdata/stub-servers.js';
import { MAX_TIMER_MS } from './timers.js';

/**
 * Timer slack of a measured wait: Node arms a timer from the event loop's cached time, which can
 * lag the real time by a few milliseconds, so a wait of N ms may end a little before N ms have
 * passed at the server. Far below every wait asserted, and far above none of them.
 */
const SLACK_MS = 25;

const stubs = stubServers();

type Handler = (req: IncomingMessage, res: ServerResponse, body: string, index: number) => void;

/** A local server calling `handler` with each request's body; `arrivals` are monotonic times. */
async function httpServer(handler: Handler): Promise<{ url: string; arrivals: number[] }> {
  const arrivals: number[] = [];
  const url = await stubs.serve((req, res, body) => {
    arrivals.push(performance.now());
    handler(req, res, body, arrivals.length - 1);
  });
  return { url, arrivals };
}

/** A logger keeping the `delay_ms` of every retry the client announces. */
function delays(): { logger: Logger; chosen: number[] } {
  const chosen: number[] = [];
  const keep = (message: string, fields?: LogFields) => {
    if (message === 'request failed; retrying') chosen.push(Number(fields?.delay_ms));
  };
  return { logger: { debug: keep, info: keep, warn: keep, error: keep }, chosen };
}

/** A submit answered with its task, as the server answers one. */
function created(res: ServerResponse, body: string): void {
  res.writeHead(201, { 'content-type': 'application/json' });
  res.end(JSON.stringify(queuedSnapshotOf(JSON.parse(body) as SentCommand, 1)));
}

/** A reply refusing a request, as a rate limiter or gateway sends one: status, Retry-After, body. */
type Refusal = [status: number, retryAfter: string, body: string];

/**
 * A submit through a Client backing off 5 ms–`maxMs`, to a server answering its first requests
 * with `refusals`, in order, and the next with the task: what the Client answered, when each
 * request arrived, and the retry delays the Client chose.
 */
async function submitRefused(maxMs: number, ...refusals: Refusal[]) {
  const server = await httpServer((_req, res, body, index) => {
    const refusal = refusals[index];
    if (refusal === undefined) created(res, body);
    else res.writeHead(refusal[0], { 'retry-after': refusal[1] }).end(refusal[2]);
  });
  const { logger, chosen } = delays();
  const client = clientOf(server.url, { logger, backoff: { baseMs: 5, maxMs } });
  const task = await client.submit({ queue: 'q', program: 'p' });
  return { task, arrivals: server.arrivals, chosen };
}

const exchanges: [string, FetchLike | undefined][] = [
  ['node:http', undefined],
  ['fetch', (input, init) => globalThis.fetch(input, init)],
];

describe.each(exchanges)('a failed reply carries its Retry-After (%s exchange)', (_name, fetch) => {
  async function failureFor(
    status: number,
    headers: Record<string, string>,
    body = '<html>slow down</html>',
  ): Promise<unknown> {
    const { url } = await httpServer((_req, res) => res.writeHead(status, headers).end(body));
    const http = new HttpTransport({ url, fetch });
    return http
      .request({ method: 'GET', path: '/x', schema: WorkerSessionSchema, maxBytes: 1_000 })
      .catch((error: unknown) => error);
  }

  it('a 429 page with delay-seconds is a TransportError with retryAfterMs', async () => {
    const error = await failureFor(429, { 'content-type': 'text/html', 'retry-after': '7' });
    expect(error).toBeInstanceOf(TransportError);
    expect(error).toMatchObject({
      code: 'transport_error',
      reason: 'server',
      status: 429,
      retryAfterMs: 7_000,
    });
  });

  it('a Retry-After longer than a timer holds is capped at what one holds', async () => {
    const error = await failureFor(503, {
      'content-type': 'text/html',
      'retry-after': '9'.repeat(40),
    });
    expect(error).toMatchObject({ status: 503, retryAfterMs: MAX_TIMER_MS });
  });

  it("a 503 page's HTTP-date is read against the reply's Date, not this machine's clock", async () => {
    // The gateway's clock is an hour behind this machine's: read against the local clock the
    // date would be long past (no wait at all); against the reply's own Date it is 2 s away.
    const at = Math.floor(Date.now() / 1000) * 1000 - 3_600_000;
    const error = await failureFor(503, {
      'content-type': 'text/html',
      date: new Date(at).toUTCString(),
      'retry-after': new Date(at + 2_000).toUTCString(),
    });
    expect(error).toMatchObject({ code: 'transport_error', status: 503, retryAfterMs: 2_000 });
  });

  it('an `unavailable` problem carries it; a problem that is not retried does not', async () => {
    const problemType = { 'content-type': 'application/problem+json', 'retry-after': '3' };
    const error = await failureFor(503, problemType, unavailableProblem);
    expect(error).toBeInstanceOf(ProblemError);
    expect(error).toMatchObject({ code: 'unavailable', retryable: true, retryAfterMs: 3_000 });
    const conflict = await failureFor(
      409,
      problemType,
      JSON.stringify({ ...JSON.parse(unavailableProblem), status: 409, code: 'conflict' }),
    );
    expect(conflict).toMatchObject({ code: 'conflict', retryAfterMs: undefined });
  });

  it('a malformed Retry-After, or none, leaves retryAfterMs undefined', async () => {
    for (const value of ['soon', '-1', '1.5', 'Wed, 99 Foo 2015']) {
      const error = await failureFor(503, { 'content-type': 'text/html', 'retry-after': value });
      expect(error).toBeInstanceOf(TransportError);
      expect((error as TransportError).retryAfterMs).toBeUndefined();
    }
    const bare = await failureFor(502, { 'content-type': 'text/html' });
    expect(bare).toMatchObject({ code: 'transport_error', status: 502, retryAfterMs: undefined });
    // A valid one through the same path, so the loop above cannot pass by never reading it.
    const valid = await failureFor(503, { 'content-type': 'text/html', 'retry-after': '1' });
    expect(valid).toMatchObject({ retryAfterMs: 1_000 });
  });
});

describe('the Client waits out a Retry-After before sending again', () => {
  it('a submit answered 429 with Retry-After: 1 is sent again no sooner than 1 s later', async () => {
    const { task, arrivals, chosen } = await submitRefused(2_000, [429, '1', 'rate limited']);
    expect(task.task_id).toBe('tsk_1');
    expect(arrivals).toHaveLength(2);
    expect(chosen).toEqual([1_000]);
    const [first = 0, second = 0] = arrivals;
    expect(second - first).toBeGreaterThanOrEqual(1_000 - SLACK_MS);
  });

  it('a read answered `unavailable` with an HTTP-date Retry-After waits until that date', async () => {
    const server = await httpServer((_req, res, _body, index) => {
      if (index === 0) {
        const at = Math.floor(Date.now() / 1000) * 1000;
        res
          .writeHead(503, {
            'content-type': 'application/problem+json',
            date: new Date(at).toUTCString(),
            'retry-after': new Date(at + 1_000).toUTCString(),
          })
          .end(unavailableProblem);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(queuedStatus));
    });
    const client = clientOf(server.url, {
      logger: delays().logger,
      backoff: { baseMs: 5, maxMs: 2_000 },
    });
    await expect(client.status('tsk_1')).resolves.toMatchObject({ state: 'queued' });
    const [first = 0, second = 0] = server.arrivals;
    expect(second - first).toBeGreaterThanOrEqual(1_000 - SLACK_MS);
  });

  it('ignores a malformed Retry-After (its own backoff), then honours a valid one', async () => {
    const { arrivals, chosen } = await submitRefused(
      2_000,
      [503, 'in a bit', 'busy'],
      [503, '1', 'busy'],
    );
    expect(arrivals).toHaveLength(3);
    // The first retry is the backoff's first delay, in [baseMs/2, baseMs]; the second is the ask.
    expect(chosen[0]).toBeLessThanOrEqual(5);
    expect(chosen[1]).toBe(1_000);
    const [, second = 0, third = 0] = arrivals;
    expect(third - second).toBeGreaterThanOrEqual(1_000 - SLACK_MS);
  });

  it("waits no longer than the backoff's maxMs, and the error still says what was asked", async () => {
    const { arrivals, chosen } = await submitRefused(300, [429, '3600', 'come back in an hour']);
    expect(chosen).toEqual([300]);
    const [first = 0, second = 0] = arrivals;
    expect(second - first).toBeGreaterThanOrEqual(300 - SLACK_MS);

    // Without retries left, the caller gets the ask itself, to wait it out if it chooses.
    const limited = await httpServer((_req, res) =>
      res.writeHead(429, { 'retry-after': '3600' }).end('come back in an hour'),
    );
    const once = clientOf(limited.url, { retries: 0 });
    const error = await once.submit({ queue: 'q', program: 'p' }).catch((e: unknown) => e);
    expect(error).toMatchObject({ code: 'transport_error', status: 429, retryAfterMs: 3_600_000 });
    expect(JSON.parse(JSON.stringify(error))).toMatchObject({ retryAfterMs: 3_600_000 });
  });
});
