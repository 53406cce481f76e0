/**
 * The processes of a chaos run: its own embedded PostgreSQL (restartable in immediate mode),
 * server replicas behind a small TCP balancer, and worker processes. Every process is tracked so
 * `close()` kills it, whatever state the run ended in; a process that exits without having been
 * killed by the run is recorded as an unexpected exit.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { appendFileSync, openSync, readFileSync } from 'node:fs';
import {
  type AddressInfo,
  createConnection,
  createServer,
  type Server,
  type Socket,
} from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { alive } from '@ledgence/e2e/processes';
import { type ServerProcess, sourceArgs, startServerProcess } from '@ledgence/e2e/server-process';
import { type EmbeddedPostgres, startEmbeddedPostgres } from '@ledgence/store-postgres';
import postgres from 'postgres';
import type { UnexpectedExit, WorkerScope } from './model.js';

const HOST = '127.0.0.1';
const APP_DATABASE = 'ledgence_chaos';

/** Waits `ms`. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** A free TCP port on 127.0.0.1, so PostgreSQL can come back on the same one after a restart. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, HOST, () => {
      const { port } = probe.address() as AddressInfo;
      probe.close(() => resolve(port));
    });
  });
}

/**
 * The run's own PostgreSQL: a fresh data folder on a fixed port, so an immediate restart (the
 * postmaster SIGQUIT, crash recovery on the next start) brings it back where the servers'
 * `DATABASE_URL` points.
 */
export class ChaosDatabase {
  #server: EmbeddedPostgres;

  private constructor(
    server: EmbeddedPostgres,
    readonly dataDir: string,
    readonly port: number,
    readonly logPath: string,
  ) {
    this.#server = server;
  }

  /** Starts PostgreSQL in `dataDir` and creates the application database. */
  static async start(dataDir: string, logPath: string): Promise<ChaosDatabase> {
    const port = await freePort();
    const server = await ChaosDatabase.#boot(dataDir, port, logPath);
    const admin = postgres(server.url, { max: 1, onnotice: () => {} });
    try {
      await admin.unsafe(`create database ${APP_DATABASE}`);
    } finally {
      await admin.end();
    }
    return new ChaosDatabase(server, dataDir, port, logPath);
  }

  static #boot(dataDir: string, port: number, logPath: string): Promise<EmbeddedPostgres> {
    // Full durability, not `fast`: `fast` turns off synchronous_commit, and then an immediate
    // restart loses the last commits the servers had already acknowledged (seen as acquire
    // cursors going back: `sequence_conflict` in the workers' logs).
    return startEmbeddedPostgres({
      dataDir,
      port,
      durability: 'full',
      onLog: (line) => appendFileSync(logPath, `${line}\n`),
    });
  }

  /** The servers' database. */
  get url(): string {
    return this.#server.urlFor(APP_DATABASE);
  }

  /** The `postgres` database, for admin work that must not count as the servers' sessions. */
  get adminUrl(): string {
    return this.#server.url;
  }

  /** Terminates every session of the servers' database; returns how many were ended. */
  async terminateBackends(): Promise<number> {
    const admin = postgres(this.adminUrl, { max: 1, onnotice: () => {} });
    try {
      const [row] = await admin<{ n: number }[]>`
        select count(pg_terminate_backend(pid))::int as n from pg_stat_activity
        where datname = ${APP_DATABASE} and pid <> pg_backend_pid()`;
      return row?.n ?? 0;
    } finally {
      await admin.end();
    }
  }

  /**
   * An immediate restart: SIGQUIT to the postmaster (every backend dies at once, nothing is
   * checkpointed), then a start on the same folder and port, which runs crash recovery.
   * The embedded helper offers only a fast stop, hence the signal.
   */
  async restartImmediate(): Promise<void> {
    const pidFile = readFileSync(join(this.dataDir, 'postmaster.pid'), 'utf8');
    const pid = Number.parseInt(pidFile.split('\n')[0] ?? '', 10);
    if (!Number.isSafeInteger(pid) || pid <= 0) throw new Error(`no postmaster pid: ${pidFile}`);
    process.kill(pid, 'SIGQUIT');
    const end = Date.now() + 30_000;
    while (alive(pid)) {
      if (Date.now() > end) throw new Error(`postmaster ${pid} still alive 30 s after SIGQUIT`);
      await sleep(20);
    }
    this.#server = await ChaosDatabase.#boot(this.dataDir, this.port, this.logPath);
  }

  /** Stops the server (fast shutdown). */
  stop(): Promise<void> {
    return this.#server.stop();
  }
}

/** Records exits the run did not cause. */
class ExitWatch {
  readonly unexpected: UnexpectedExit[] = [];
  readonly #expected = new WeakSet<ChildProcess>();

  watch(name: string, child: ChildProcess, stderr: () => string): void {
    child.once('exit', (code, signal) => {
      if (!this.#expected.has(child)) {
        this.unexpected.push({
          process: name,
          code: code ?? signal ?? 'unknown',
          stderr: stderr().slice(-2_000),
        });
      }
    });
  }

  expect(child: ChildProcess): void {
    this.#expected.add(child);
  }
}

/**
 * A TCP balancer in front of the replicas, as a deployment would have: each new connection goes
 * to the next replica that accepts it, so a killed replica's clients reconnect to the other one.
 * It never looks inside the bytes.
 */
async function startBalancer(
  ports: () => number[],
): Promise<{ url: string; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  let next = 0;
  const track = (socket: Socket) => {
    sockets.add(socket);
    socket.on('error', () => {});
    socket.once('close', () => sockets.delete(socket));
  };
  const server: Server = createServer((downstream) => {
    track(downstream);
    downstream.pause();
    const candidates = ports();
    const start = next++;
    const attempt = (tried: number): void => {
      if (tried >= candidates.length || downstream.destroyed) {
        downstream.destroy();
        return;
      }
      const port = candidates[(start + tried) % candidates.length] as number;
      const upstream = createConnection({ host: HOST, port });
      track(upstream);
      let connected = false;
      upstream.once('connect', () => {
        connected = true;
        downstream.pipe(upstream);
        upstream.pipe(downstream);
        downstream.resume();
      });
      upstream.once('close', () => {
        if (connected) downstream.destroy();
        else attempt(tried + 1);
      });
      downstream.once('close', () => upstream.destroy());
    };
    attempt(0);
  });
  await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${HOST}:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

const workerScript = join(dirname(fileURLToPath(import.meta.url)), 'worker-process.ts');

/** A worker child process of the run. */
interface WorkerChild {
  readonly name: string;
  readonly child: ChildProcess;
  readonly exited: Promise<unknown>;
  stopped: boolean;
}

/** Settings of a {@link Cluster}. */
export interface ClusterOptions {
  /** Folder for the data directory and every log. */
  runDir: string;
  replicas: number;
  workers: number;
  /** Slots per scope in each worker process. */
  concurrency: number;
  scopes: WorkerScope[];
  queue: string;
  /** Server environment beyond the database: timings, keys, destinations. */
  serverEnv: Record<string, string>;
  /** The worker side of the servers' renew interval. */
  renewMs: number;
}

/** The database, the replicas, the balancer and the workers of one run. */
export class Cluster {
  readonly exits = new ExitWatch();
  readonly replicas: (ServerProcess | undefined)[] = [];
  readonly workers: (WorkerChild | undefined)[] = [];
  #ports: number[] = [];
  #balancer: { url: string; close(): Promise<void> } | undefined;
  #database: ChaosDatabase | undefined;
  #generation = 0;
  readonly #logs: string[] = [];

  constructor(readonly options: ClusterOptions) {}

  /** Where clients and workers connect: the balancer. */
  get url(): string {
    if (this.#balancer === undefined) throw new Error('cluster not started');
    return this.#balancer.url;
  }

  get database(): ChaosDatabase {
    if (this.#database === undefined) throw new Error('cluster not started');
    return this.#database;
  }

  /** The JSONL logs of every worker process started so far. */
  workerLogs(): string[] {
    return [...this.#logs];
  }

  /** Starts everything; on failure the caller still calls `close()`. */
  async start(): Promise<void> {
    const { runDir } = this.options;
    this.#database = await ChaosDatabase.start(join(runDir, 'pg'), join(runDir, 'postgres.log'));
    // One replica first: it applies the migrations; the others then start side by side.
    for (let i = 0; i < this.options.replicas; i++) await this.startReplica(i);
    this.#balancer = await startBalancer(() => this.#ports);
    await Promise.all(Array.from({ length: this.options.workers }, (_, i) => this.startWorker(i)));
  }

  /** Starts replica `i` (again on its old port, if it had one). */
  async startReplica(i: number): Promise<void> {
    const port = this.#ports[i];
    const server = await startServerProcess({
      DATABASE_URL: this.database.url,
      HOST,
      ...(port === undefined ? {} : { PORT: String(port) }),
      ...this.options.serverEnv,
    });
    this.replicas[i] = server;
    this.#ports[i] = Number(new URL(server.url).port);
    this.exits.watch(`server-${i}`, server.child, server.stderr);
  }

  /** SIGKILLs replica `i` and waits for its exit. */
  async killReplica(i: number): Promise<void> {
    const server = this.replicas[i];
    if (server === undefined) return;
    this.replicas[i] = undefined;
    this.exits.expect(server.child);
    await server.stop('SIGKILL');
  }

  /** Starts worker process `i`; resolves once it runs. */
  async startWorker(i: number): Promise<void> {
    const { runDir, scopes, queue, concurrency, renewMs } = this.options;
    const name = `worker-${i}.${this.#generation++}`;
    const stderrPath = join(runDir, `${name}.stderr.log`);
    const logPath = join(runDir, `${name}.jsonl`);
    this.#logs.push(logPath);
    const child = spawn(process.execPath, sourceArgs(workerScript), {
      env: {
        ...process.env,
        LEDGENCE_URL: this.url,
        WORKER_NAME: name,
        LOG_PATH: logPath,
        SCOPES: JSON.stringify(scopes),
        QUEUE: queue,
        CONCURRENCY: String(concurrency),
        RENEW_MS: String(renewMs),
      },
      stdio: ['ignore', 'pipe', openSync(stderrPath, 'a')],
    });
    const exited = new Promise((resolve) => child.once('exit', resolve));
    const entry: WorkerChild = { name, child, exited, stopped: false };
    this.workers[i] = entry;
    this.exits.watch(name, child, () => readFileSync(stderrPath, 'utf8'));
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${name} not ready within 60 s`)), 60_000);
      child.stdout?.setEncoding('utf8');
      child.stdout?.once('data', () => {
        clearTimeout(timer);
        resolve();
      });
      void exited.then(() => {
        clearTimeout(timer);
        reject(new Error(`${name} exited before it was ready`));
      });
    });
  }

  /** SIGKILLs worker `i` (resuming it first if stopped: a stopped process dies only once continued). */
  async killWorker(i: number): Promise<void> {
    const worker = this.workers[i];
    if (worker === undefined) return;
    this.workers[i] = undefined;
    this.exits.expect(worker.child);
    worker.child.kill('SIGKILL');
    if (worker.stopped) worker.child.kill('SIGCONT');
    await worker.exited;
  }

  /** SIGSTOPs (`true`) or SIGCONTs (`false`) worker `i`. */
  pauseWorker(i: number, paused: boolean): void {
    const worker = this.workers[i];
    if (worker === undefined) return;
    worker.stopped = paused;
    worker.child.kill(paused ? 'SIGSTOP' : 'SIGCONT');
  }

  /** Readiness of every replica (database reachable, migrations current). */
  async ready(): Promise<boolean> {
    const replies = await Promise.all(
      this.replicas.map((server) =>
        server === undefined
          ? false
          : fetch(`${server.url}/readyz`, { signal: AbortSignal.timeout(2_000) }).then(
              (r) => r.ok,
              () => false,
            ),
      ),
    );
    return replies.every(Boolean);
  }

  /** Stops the workers gracefully (SIGTERM; SIGKILL after `graceMs`). */
  async stopWorkers(graceMs = 10_000): Promise<void> {
    await Promise.all(
      this.workers.map(async (worker, i) => {
        if (worker === undefined) return;
        this.workers[i] = undefined;
        this.exits.expect(worker.child);
        if (worker.stopped) worker.child.kill('SIGCONT');
        worker.child.kill('SIGTERM');
        const timer = setTimeout(() => worker.child.kill('SIGKILL'), graceMs);
        await worker.exited;
        clearTimeout(timer);
      }),
    );
  }

  /** Kills every process and stops PostgreSQL; safe to call after any failure. */
  async close(): Promise<void> {
    await Promise.all(this.workers.map((_, i) => this.killWorker(i)));
    await Promise.all(this.replicas.map((_, i) => this.killReplica(i)));
    await this.#balancer?.close();
    await this.#database?.stop();
  }
}
