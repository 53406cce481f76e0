/**
 * One crash run of the failpoint suite (issue #8, T2): a server process armed
 * with one failpoint (`LEDGENCE_FAILPOINTS=<name>=crash`) on a database of its
 * own, the proof that the point fired (the process died of SIGKILL right after
 * printing `failpoint fired: <name>`), and a replacement server on the same
 * port, so the SDK's retries reach it without being told anything.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { FailpointName } from '@ledgence/core';
import { NAMESPACE, portOf, Stack, TENANT } from '@ledgence/e2e/harness';
import type { ServerProcess } from '@ledgence/e2e/server-process';
import { Client, silentLogger, Worker } from '@ledgence/worker';

/**
 * How long an armed point may take to fire: a termination bound (a point that
 * never fires fails its test with a clear message instead of hanging it).
 */
const FIRE_BOUND_MS = 60_000;

/** What a scenario gets: the armed server's URL and the way to wait for its crash. */
export interface CrashRun {
  /** The armed server's URL; the replacement listens on the same one. */
  readonly url: string;
  /** The run's database, for a scenario that must age rows or read what is left. */
  readonly databaseUrl: string;
  /** A client that rides out the restart (many retries, short backoff). */
  readonly client: Client;
  /**
   * Resolves once the armed server died at its point and the replacement is
   * listening; throws if it exited any other way or did not fire in time.
   */
  crashed(): Promise<void>;
  /**
   * Starts a worker on `queue` against {@link url} that runs program `echo`
   * (returns its input, counting runs in {@link executions}), program `deaf`
   * (ignores its signal, returns after `data.ms`) and program `patient` (returns
   * when its signal aborts or after `data.ms`) and program `flaky` (throws on
   * the run's first execution); stopped when the run ends.
   */
  work(queue: string): void;
  /** How often the `echo` handler ran. */
  readonly executions: () => number;
  /** What the armed server wrote to stderr so far (`failpoint fired: <name> (<action>)` lines). */
  readonly armedStderr: () => string;
}

/** Extra server environment per run (e.g. callback destinations). */
export type RunEnv = Record<string, string>;

/**
 * Runs `scenario` against a server armed with `name`, then kills everything
 * (workers, both servers, the database) whatever happened. `fired` learns the
 * name once the crash was observed, for the coverage figure. `spec` arms more
 * than `name=crash` (say, an `error` point that leads the way to the crash);
 * it must arm `name` with `crash`.
 */
export async function crashRun(
  name: FailpointName,
  env: RunEnv,
  fired: Set<FailpointName>,
  scenario: (run: CrashRun) => Promise<void>,
  spec = `${name}=crash`,
): Promise<void> {
  // Test database prefixes are at most 24 characters of [a-z0-9_].
  const stack = new Stack(`fp_${name.replace(/[._]/g, '').slice(0, 21)}`);
  const workers: Worker[] = [];
  const running: Promise<void>[] = [];
  const workerErrors: unknown[] = [];
  let executions = 0;
  let replacement: Promise<ServerProcess> | undefined;
  let armedServer: ServerProcess | undefined;
  try {
    await stack.open();
    const armed = await stack.start({ ...env, LEDGENCE_FAILPOINTS: spec });
    armedServer = armed;
    const url = armed.url;
    const run: CrashRun = {
      url,
      databaseUrl: stack.databaseUrl,
      client: new Client({
        url,
        tenant: TENANT,
        namespace: NAMESPACE,
        logger: silentLogger,
        // Enough to span a replacement's start on a loaded two-core machine.
        retries: 200,
        backoff: { baseMs: 50, maxMs: 250 },
      }),
      crashed() {
        replacement ??= diedAt(armed, name).then(() => {
          fired.add(name);
          return stack.start({ ...env, PORT: portOf(url) });
        });
        return replacement.then(() => undefined);
      },
      executions: () => executions,
      armedStderr: () => armedServer?.stderr() ?? '',
      work(queue) {
        const worker = new Worker({
          url,
          tenant: TENANT,
          namespace: NAMESPACE,
          queue,
          concurrency: 1,
          logger: silentLogger,
          renewIntervalMs: 250,
          pollWaitMs: 500,
          requestTimeoutMs: 2_000,
          shutdownGraceMs: 1_000,
          backoff: { baseMs: 50, maxMs: 250 },
        });
        worker.register('echo', (data) => {
          executions += 1;
          return data;
        });
        // Ignores its signal: runs `ms` whatever its budget says (quiescence scenarios).
        worker.register('deaf', async (data) => {
          executions += 1;
          const { ms } = data as { ms: number };
          await new Promise((resolve) => setTimeout(resolve, ms));
          return null;
        });
        // Waits for its signal (a cancel, a lost lease) or `data.ms`, whichever comes first.
        worker.register('patient', async (data, ctx) => {
          executions += 1;
          const { ms } = data as { ms: number };
          await new Promise<void>((resolve) => {
            const timer = setTimeout(resolve, ms);
            ctx.signal.addEventListener('abort', () => {
              clearTimeout(timer);
              resolve();
            });
          });
          return null;
        });
        // Fails its first run (a retryable application error), returns on any later one.
        worker.register('flaky', (data) => {
          executions += 1;
          if (executions === 1) throw new Error('the first run fails');
          return data;
        });
        workers.push(worker);
        // Caught at once: a failing run must fail the test, not surface as an unhandled rejection.
        running.push(
          worker.run().catch((error: unknown) => {
            workerErrors.push(error);
          }),
        );
      },
    };
    await scenario(run);
    if (workerErrors.length > 0) throw workerErrors[0];
  } finally {
    await Promise.allSettled(workers.map((w) => w.stop({ graceMs: 0 })));
    await Promise.allSettled(running);
    // A replacement still starting would otherwise outlive the stack's cleanup.
    await replacement?.catch(() => {});
    await stack.close();
  }
}

/** Waits for `server` to die of SIGKILL after announcing `name`; throws otherwise. */
async function diedAt(server: ServerProcess, name: FailpointName): Promise<void> {
  let bound: NodeJS.Timeout | undefined;
  const timedOut = new Promise<'timeout'>((resolve) => {
    bound = setTimeout(() => resolve('timeout'), FIRE_BOUND_MS);
  });
  const exit = await Promise.race([server.exited, timedOut]);
  clearTimeout(bound);
  if (exit === 'timeout') throw new Error(`failpoint ${name} did not fire`);
  if (exit !== 'SIGKILL' || !server.stderr().includes(`failpoint fired: ${name} (crash)`)) {
    throw new Error(
      `the armed server exited (${exit}) without firing ${name}:\n${server.stderr()}`,
    );
  }
}

/** One POST a {@link Receiver} saw. */
export interface Received {
  readonly id: string;
  readonly body: string;
}

/**
 * A webhook receiver that records every POST and answers 204. Deliveries are
 * at least once, so a repeated id is fine; a different id is not.
 */
export class Receiver {
  readonly received: Received[] = [];
  #server: Server | undefined;

  get url(): string {
    const address = this.#server?.address() as AddressInfo;
    return `http://127.0.0.1:${address.port}/hooks`;
  }

  async start(): Promise<this> {
    this.#server = createServer((request, response) => {
      let body = '';
      request.setEncoding('utf8');
      request.on('data', (chunk: string) => {
        body += chunk;
      });
      request.on('end', () => {
        this.received.push({ id: String(request.headers['webhook-id']), body });
        response.writeHead(204).end();
      });
    });
    const server = this.#server;
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return this;
  }

  /**
   * The destinations variable naming this receiver `hooks`. Its timeout is a termination bound,
   * not a timing claim: the receiver answers from the test process, which shares two cores with
   * up to five crash runs, and a 204 arriving after the timeout makes the sender (rightly) try
   * again — a second POST that `delivery.after_report`'s count of exactly one would blame on the
   * crash. 5 s keeps that count about the crash alone; it also sets the completion lease (the
   * timeout + 5 s) that `before_send` and `after_send` wait out before the POST is sent again.
   */
  destinations(): string {
    const secret = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
    return JSON.stringify({ hooks: { url: this.url, secret, timeout_ms: 5_000 } });
  }

  close(): Promise<void> {
    const server = this.#server;
    if (server === undefined) return Promise.resolve();
    server.closeAllConnections();
    return new Promise((resolve) => server.close(() => resolve()));
  }
}
