import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { HttpBindings } from '@hono/node-server';
import { getConnInfo } from '@hono/node-server/conninfo';
import { createCompletionSender } from '@ledgence/callbacks';
import {
  createCompletionService,
  createTaskService,
  lifecycleConfig,
  withGroupCommit,
} from '@ledgence/core';
import { createHttpApp } from '@ledgence/http';
import {
  createPostgresTaskStore,
  createPostgresWakeSource,
  type EmbeddedPostgres,
  EmbeddedPostgresError,
  migrate,
  startEmbeddedPostgres,
} from '@ledgence/store-postgres';
import pino, { type Logger } from 'pino';
import postgres from 'postgres';
import { isLoopbackHost, type ServerConfig } from './config.js';
import { armAfterReply, serverFailpoints } from './failpoints.js';
import { createListeningServer } from './listener.js';
import { startRecoveryLoop, startRetentionLoop, startStatisticsLoop } from './maintenance.js';
import { createServerMetrics } from './metrics.js';
import { wakeListenLog } from './wake-log.js';

/** The database the embedded server creates for Ledgence's own tables. */
const EMBEDDED_DATABASE = 'ledgence';
/** Longest a `/readyz` probe waits for the database: below the probe timeouts balancers use. */
const READINESS_TIMEOUT_MS = 2_000;

/** Options of {@link startServer}. */
export interface StartServerOptions {
  /** Where the JSON logs go; default pino at the configured level on stdout. */
  logger?: Logger;
  /**
   * Abandons the start: a start waiting on the migration lock stops waiting, any other step
   * is followed by no further one; what was started is cleaned up, and `startServer` rejects
   * with the signal's reason. `ledgence-server` aborts on SIGTERM, SIGINT and SIGHUP.
   */
  signal?: AbortSignal;
  /**
   * Called when the server can no longer serve and only a restart helps: the embedded
   * PostgreSQL exited unexpectedly (already logged as an error). `ledgence-server` then stops
   * and exits non-zero, so that a supervisor restarts it. Default: nothing more.
   */
  onFatal?: (error: Error) => void;
}

/** A started server. */
export interface RunningServer {
  /** Where it listens, e.g. `http://127.0.0.1:8080`. */
  readonly url: string;
  /** The embedded database's folder, or `undefined` with `DATABASE_URL`. */
  readonly dataDir: string | undefined;
  /** No API keys configured: loopback only, every request allowed. */
  readonly developmentMode: boolean;
  /**
   * Graceful shutdown (DESIGN §11): not ready, stop accepting, end parked long
   * polls with `empty`, finish in-flight requests, stop loops, close pools,
   * stop the embedded database — within the configured timeout.
   */
  stop(): Promise<void>;
}

/**
 * Starts Ledgence: connects (embedded PostgreSQL when no `DATABASE_URL`),
 * migrates under an advisory lock, serves HTTP, and runs the maintenance loop.
 *
 * @example
 * ```ts
 * const server = await startServer(loadConfig(process.env, readFileSync));
 * console.log(server.url);
 * process.on('SIGTERM', () => server.stop());
 * ```
 */
export async function startServer(
  config: ServerConfig,
  options: StartServerOptions = {},
): Promise<RunningServer> {
  // Taken apart here, and `config` referenced by no closure: it holds the API keys' text, which
  // must not stay reachable once the HTTP app has hashed it (DESIGN §6).
  const { apiKeys, ...settings } = config;
  const developmentMode = apiKeys.length === 0;
  // DESIGN §6: without keys the server "listens on loopback only". loadConfig refuses such a
  // HOST already; startServer is exported, so it checks its own input before starting anything.
  if (developmentMode && !isLoopbackHost(settings.host)) {
    throw new TypeError(
      `host ${settings.host} is not loopback: a server without API keys (development mode) listens on loopback only; configure API keys to serve other addresses`,
    );
  }
  const logger = options.logger ?? pino({ level: settings.logLevel });
  const { signal } = options;
  const cleanups: (() => Promise<void>)[] = [];
  let embedded: EmbeddedPostgres | undefined;
  /**
   * Runs the cleanup steps newest first, waiting at most `budgetMs` in all: a database that
   * stopped answering (a partition) must not hold the process past its shutdown budget
   * (LEDGENCE_SHUTDOWN_TIMEOUT_MS). Once the budget is spent, the steps left are started but no
   * longer awaited (the process exits; their connections die with it). The embedded
   * PostgreSQL is asked to stop last in any case, and awaited within what is left of the
   * budget: one whose disk hung (its processes stopped) held SIGTERM forever (review r56c). Left
   * stopping, it finishes its fast shutdown on its own; a start on its folder stops it first.
   */
  const cleanup = async (budgetMs: number) => {
    const deadline = performance.now() + budgetMs;
    // Spent before the cleanup began (the HTTP drain used it, and said so): the steps are not
    // waited for, and the database, not yet asked, is not what held the stop.
    let spent = budgetMs <= 0;
    for (const step of cleanups.splice(0).reverse()) {
      const running = step().catch((error: unknown) =>
        logger.warn({ err: error }, 'shutdown step failed'),
      );
      if (spent) continue;
      const remaining = deadline - performance.now();
      if ((await within(running, remaining)) === 'timeout') {
        spent = true;
        logger.warn(
          { shutdownTimeoutMs: settings.shutdownTimeoutMs },
          'shutdown budget spent: no longer waiting for the database',
        );
      }
    }
    if (embedded === undefined) return;
    const stopping = embedded
      .stop()
      .catch((error: unknown) => logger.warn({ err: error }, 'stopping PostgreSQL failed'));
    if ((await within(stopping, deadline - performance.now())) === 'timeout') {
      logger.warn(
        { shutdownTimeoutMs: settings.shutdownTimeoutMs, dataDir: embedded.dataDir },
        'shutdown budget spent: the embedded PostgreSQL goes on stopping without the server',
      );
    }
  };
  try {
    let databaseUrl = settings.databaseUrl;
    if (databaseUrl === undefined) {
      const dataDir = resolve(settings.dataDir);
      embedded = await startEmbeddedPostgres({
        dataDir,
        onUnexpectedExit({ pid, code, signal: killedBy, lastLog }) {
          const how = killedBy === null ? `with code ${code}` : `on signal ${killedBy}`;
          const error = new Error(
            `the embedded PostgreSQL (pid ${pid}, data folder ${dataDir}) exited unexpectedly ` +
              `${how}; no request can succeed without it. Restart the server: PostgreSQL ` +
              'recovers the folder as it starts.',
          );
          logger.error({ pid, code, signal: killedBy, dataDir, lastLog }, error.message);
          options.onFatal?.(error);
        },
      }).catch((error: unknown) => {
        throw dataDirError(error, dataDir);
      });
      signal?.throwIfAborted();
      await ensureDatabase(embedded.url, EMBEDDED_DATABASE);
      databaseUrl = embedded.urlFor(EMBEDDED_DATABASE);
    }
    const url = databaseUrl;
    signal?.throwIfAborted();
    let connected = false;
    await migrate(url, {
      signal,
      onConnected() {
        connected = true;
      },
      onWait(holder) {
        logger.warn(
          { holderPid: holder },
          `waiting for the migration lock held by ${holder === undefined ? 'another session' : `pid ${holder}`} (another replica migrating)`,
        );
      },
      onBlocked(blockers) {
        logger.warn(
          { blockerPids: blockers },
          `a migration waits for a table lock held by pid ${blockers.join(', ')} (a backup such as pg_dump, or a long transaction); it goes on once that ends, and a signal abandons the start`,
        );
      },
    }).catch((error: unknown) => {
      // A failure to connect to the operator's database is theirs to fix, and so is a user it
      // may not migrate with; the embedded one's (or anything else) is reported as it is.
      const { databaseUrl: configured } = settings;
      if (signal?.aborted || configured === undefined) throw error;
      if (!connected) throw databaseUrlError(error, configured);
      if (isInsufficientPrivilege(error)) throw databasePrivilegeError(error, configured);
      if (isReadOnly(error)) throw databaseReadOnlyError(error, configured);
      if (isCollision(error)) throw databaseCollisionError(error, configured);
      throw error;
    });
    signal?.throwIfAborted();

    const lifecycle = lifecycleConfig({
      leaseDurationMs: settings.leaseDurationMs,
      cleanupGraceMs: settings.cleanupGraceMs,
      leaseSafetyMarginMs: settings.leaseSafetyMarginMs,
      sessionValidityMs: settings.sessionValidityMs,
      terminalRetentionMs: settings.terminalRetentionMs,
    });
    // TEST ONLY (LEDGENCE_FAILPOINTS); none armed in any normal run.
    const failpoints = serverFailpoints(settings.failpoints);
    const store = createPostgresTaskStore({
      url,
      config: lifecycle,
      failpoints,
      max: settings.dbPoolSize,
    });
    cleanups.push(() => store.close());
    const wake = createPostgresWakeSource({
      url,
      onListenState: wakeListenLog({ logger, rescanIntervalMs: settings.rescanIntervalMs }),
    });
    cleanups.push(() => wake.close());
    const closing = new AbortController();
    // A private registry per server: two servers in one process (tests) keep separate counts.
    const metrics = createServerMetrics({
      queueDepths: (limit) => store.queueDepths(limit),
      dueBacklog: (limit) => store.dueBacklog(limit),
      logger,
    });
    const service = metrics.instrumentService(
      createTaskService({
        store: withGroupCommit(store),
        wake,
        longPollMaxMs: settings.longPollWaitMs,
        rescanIntervalMs: settings.rescanIntervalMs,
        closing: closing.signal,
      }),
    );

    let accepting = true;
    const app = createHttpApp({
      service,
      completions: createCompletionService({ store, destinations: settings.callbackDestinations }),
      retention: store,
      auth: { keys: apiKeys },
      longPollMaxMs: settings.longPollWaitMs,
      logger,
      metrics,
      onResponse: (info) => metrics.observeHttp(info),
      remoteAddress: (c) => getConnInfo(c).remote.address,
      health: {
        async ready() {
          if (!accepting) return { ok: false, detail: 'shutting down' };
          const reading = store.migrationStatus();
          // A probe answers in time whatever the database does: on a connection gone silent (a
          // failover that moved its address) the read would wait out the store's wire timeout.
          if ((await within(reading, READINESS_TIMEOUT_MS)) === 'timeout') {
            reading.catch(() => {});
            return {
              ok: false,
              detail: `the database did not answer within ${READINESS_TIMEOUT_MS / 1000} s`,
            };
          }
          const status = await reading;
          if (status.current) return true;
          return {
            ok: false,
            detail:
              status.unknown.length > 0
                ? 'the schema was migrated by a newer Ledgence: upgrade this server'
                : `${status.pending.length} migrations pending`,
          };
        },
      },
    });

    // node:http and @hono/node-server at the edge (listener.ts).
    const http = await new Promise<Server>((listening, failed) => {
      const fetch = async (request: Request, env: unknown): Promise<Response> => {
        const response = await app.fetch(request, env);
        if (failpoints.enabled) {
          await armAfterReply(failpoints, request, response, (env as HttpBindings).outgoing);
        }
        return response;
      };
      const server = createListeningServer({
        fetch,
        hostname: settings.host,
        logger,
        metrics,
        stopping: () => !accepting,
      });
      server.listen(settings.port, settings.host, () => listening(server));
      server.once('error', (error: NodeJS.ErrnoException) =>
        failed(listenError(error, settings.host, settings.port)),
      );
    });
    const address = http.address() as AddressInfo;
    const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;

    // DESIGN §11: connect, migrate, listen, then the loops and the sender. A start that fails
    // at listen (a taken port, a foreign HOST) has then done no work on the shared database: no
    // lease recovered, no completion event posted with the configuration of a server that never
    // served.
    const recovery = startRecoveryLoop({
      recover: (limit) => service.recoverExpiredLeases(limit),
      intervalMs: settings.maintenanceIntervalMs,
      logger,
      onProgress: (progress) => metrics.recordRecovery(progress),
    });
    cleanups.push(() => recovery.stop());
    const statistics = startStatisticsLoop({
      analyze: () => store.analyzeGrowingTables(),
      intervalMs: settings.maintenanceIntervalMs,
      logger,
    });
    cleanups.push(() => statistics.stop());
    const retention = startRetentionLoop({
      store,
      intervalMs: settings.retentionIntervalMs,
      logger,
      onProgress: (_, progress) => metrics.recordRetention(progress),
      onRound: () => metrics.recordRetentionRound(),
    });
    cleanups.push(() => retention.stop());
    // Every replica sends: leases are SKIP LOCKED, so replicas share the due deliveries.
    const sender = createCompletionSender({
      store,
      destinations: settings.callbackDestinations,
      retryBaseMs: settings.completionRetryBaseMs,
      leaseMs: settings.completionLeaseMs,
      logger,
      onDelivery: (record) => metrics.recordDelivery(record),
      failpoints,
    });
    sender.start();
    cleanups.push(() => sender.stop());

    const listeningOn = `http://${host}:${address.port}`;
    // A log pipeline sees the start and the stop too, not only the lines main.ts prints on stderr.
    logger.info(
      {
        url: listeningOn,
        database: embedded === undefined ? 'DATABASE_URL' : 'embedded',
        developmentMode,
      },
      'listening',
    );
    let stopping: Promise<void> | undefined;
    return {
      url: listeningOn,
      dataDir: embedded?.dataDir,
      developmentMode,
      stop() {
        stopping ??= (async () => {
          const began = performance.now();
          logger.info({ shutdownTimeoutMs: settings.shutdownTimeoutMs }, 'shutting down');
          accepting = false;
          closing.abort();
          // One budget for the HTTP drain, the callback tries and the cleanup alike: once it is
          // spent, open connections are closed, tries still in flight aborted (each reported
          // for a retry), and nothing waits on the database any longer.
          const spent = new AbortController();
          // What held the stop when the budget ran out is logged, so an operator is pointed at
          // it: requests that did not finish (a client still sending), or the sender's stop.
          let senderDone = false;
          const deadline = setTimeout(() => {
            const fields = { shutdownTimeoutMs: settings.shutdownTimeoutMs };
            // Counted now; the callback comes a tick later.
            http.getConnections((error, open) => {
              if (error || open === 0) return;
              logger.warn(
                { ...fields, openConnections: open },
                'shutdown budget spent: closing the HTTP connections still open (unfinished requests are cut)',
              );
            });
            if (!senderDone) {
              logger.warn(
                fields,
                'shutdown budget spent: the completion sender has not stopped (a receiver or the database is not answering); its tries are aborted',
              );
            }
            http.closeAllConnections();
            spent.abort();
          }, settings.shutdownTimeoutMs);
          // The sender stops leasing now, not after the drain: a try started meanwhile could
          // only be aborted. Its later cleanup step awaits this same stop.
          const senderStopped = sender.stop({ signal: spent.signal }).finally(() => {
            senderDone = true;
          });
          const closed = new Promise<void>((done) => http.close(() => done()));
          http.closeIdleConnections();
          // The sender may wait on a query the database never answers; the HTTP drain ends
          // with the budget (closeAllConnections), the sender's stop is not awaited past it.
          await within(
            Promise.allSettled([closed, senderStopped]),
            settings.shutdownTimeoutMs + 100,
          );
          clearTimeout(deadline);
          await cleanup(Math.max(0, settings.shutdownTimeoutMs - (performance.now() - began)));
          logger.info({ tookMs: Math.round(performance.now() - began) }, 'stopped');
        })();
        return stopping;
      },
    };
  } catch (error) {
    await cleanup(settings.shutdownTimeoutMs);
    throw error;
  }
}

/** Waits for `promise` at most `ms` (which may be 0 or less): its outcome, or `'timeout'`. */
async function within(promise: Promise<unknown>, ms: number): Promise<'done' | 'timeout'> {
  if (ms <= 0) return 'timeout';
  const timer = new AbortController();
  try {
    return await Promise.race([
      promise.then(() => 'done' as const),
      sleep(ms, 'timeout' as const, { signal: timer.signal }),
    ]);
  } finally {
    timer.abort();
  }
}

/**
 * A start failure as an operator acts on it (README: "Start failures exit 1 with one line on
 * stderr"): what went wrong, then what to do, naming the variable to change, e.g.
 * `127.0.0.1:8080 is taken: stop what listens there or set PORT (0 picks a free port)`. Every
 * failure the server explains is built here, so they all read alike.
 *
 * @param problem what went wrong, with the value or address concerned (never a password).
 * @param remedy what to do; it names the variable to set (`set PORT …`).
 * @param cause the underlying error.
 */
function startError(problem: string, remedy: string, cause: unknown): Error {
  return new Error(`${problem}: ${remedy}`, { cause });
}

/** A listen failure as an operator can act on it: which address, and which setting to change. */
function listenError(error: NodeJS.ErrnoException, host: string, port: number): Error {
  const address = `${host.includes(':') ? `[${host}]` : host}:${port}`;
  switch (error.code) {
    case 'EADDRINUSE':
      return startError(
        `${address} is taken`,
        'stop what listens there or set PORT (0 picks a free port)',
        error,
      );
    case 'EADDRNOTAVAIL':
      return startError(
        `HOST ${host} is not an address of this machine`,
        'set HOST to one of its addresses (127.0.0.1 for this machine only)',
        error,
      );
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
    case 'EAI_FAIL':
      // A name (or a malformed address, e.g. 999.1.1.1) the resolver could not turn into one.
      return startError(
        `HOST ${host} does not resolve to an address (${error.message})`,
        "set HOST to one of this machine's addresses (127.0.0.1 for this machine only)",
        error,
      );
    case 'EACCES':
      return startError(
        `${address} needs privileges this process lacks (ports below 1024)`,
        'set PORT to 1024 or above (0 picks a free port)',
        error,
      );
    default:
      return error;
  }
}

/**
 * A failure to connect to the database of DATABASE_URL (before any session began: the server
 * unreachable, not PostgreSQL, or refusing the user, password or database). The driver's
 * message names the address, never the password; it is removed all the same should it appear.
 */
function databaseUrlError(error: unknown, databaseUrl: string): Error {
  const detail = detailOf(error, databaseUrl);
  return startError(
    `cannot connect to the database of DATABASE_URL (${detail})`,
    'check that PostgreSQL runs at its host and port and accepts its user, password and ' +
      'database, or set DATABASE_URL to one that does',
    error,
  );
}

/** PostgreSQL's SQLSTATE for a statement the session's user lacks the privilege for. */
const INSUFFICIENT_PRIVILEGE = '42501';
/** PostgreSQL's SQLSTATE for a write in a read-only transaction (a hot standby refuses every one). */
const READ_ONLY_SQL_TRANSACTION = '25006';

/** PostgreSQL's SQLSTATEs for creating a table, or a type or constraint, whose name is taken. */
const NAME_TAKEN = new Set(['42P07', '42710']);

const sqlState = (error: unknown): unknown => (error as { code?: unknown } | null)?.code;

function isCollision(error: unknown): boolean {
  return NAME_TAKEN.has(sqlState(error) as string);
}

/**
 * The database of DATABASE_URL already holds an object a migration creates: another
 * application's `tasks` table in `public` (the README says to give Ledgence a database of its
 * own). Unexplained, the start ended with PostgreSQL's bare `relation "tasks" already exists`
 * (review r51b); the migration rolled back, so nothing of either is changed.
 */
function databaseCollisionError(error: unknown, databaseUrl: string): Error {
  const detail = detailOf(error, databaseUrl);
  return startError(
    `the database of DATABASE_URL holds objects named like Ledgence's own (${detail}); ` +
      'nothing was changed',
    'give Ledgence a database of its own (e.g. `create database ledgence`) and set DATABASE_URL ' +
      'to it',
    error,
  );
}

function isInsufficientPrivilege(error: unknown): boolean {
  return sqlState(error) === INSUFFICIENT_PRIVILEGE;
}

function isReadOnly(error: unknown): boolean {
  return sqlState(error) === READ_ONLY_SQL_TRANSACTION;
}

/**
 * DATABASE_URL reaches a server that refuses writes: a hot standby, a multi-host URL whose first
 * host is one, or a database whose sessions default to read-only. Unexplained, the start ended
 * with PostgreSQL's bare `cannot execute CREATE SCHEMA in a read-only transaction`.
 */
function databaseReadOnlyError(error: unknown, databaseUrl: string): Error {
  const detail = detailOf(error, databaseUrl);
  return startError(
    `the database of DATABASE_URL is read-only (${detail})`,
    'point DATABASE_URL at the primary server (a standby refuses writes; with several hosts, ' +
      'add target_session_attrs=read-write), or turn off default_transaction_read_only there',
    error,
  );
}

/**
 * The user of DATABASE_URL connected but may not migrate: the migrations
 * (`create schema drizzle`, tables in `public`) need CREATE on the database and on schema
 * public, which PostgreSQL 15 and later give only to the database's owner. Unexplained, the
 * start ended with a bare `permission denied for database …`, naming no setting and no remedy.
 */
function databasePrivilegeError(error: unknown, databaseUrl: string): Error {
  const detail = detailOf(error, databaseUrl);
  return startError(
    `the user of DATABASE_URL lacks a privilege Ledgence's migrations need (${detail})`,
    "make that user the owner of the database (and of Ledgence's tables, if another user " +
      'created them), or grant it CREATE on the database and on schema public (PostgreSQL 15 ' +
      'and later grant these to the owner only), or set DATABASE_URL to a user that may',
    error,
  );
}

/** An error's message as a start failure quotes it: without the password of `databaseUrl`. */
function detailOf(error: unknown, databaseUrl: string): string {
  return withoutPassword(error instanceof Error ? error.message : String(error), databaseUrl);
}

/** `text` with the password of `url` (as written and decoded) replaced by `***`. */
function withoutPassword(text: string, url: string): string {
  const written = /^[a-z][a-z0-9+.-]*:\/\/[^:@/]*:([^@]*)@/i.exec(url)?.[1] ?? '';
  let decoded = written;
  try {
    decoded = decodeURIComponent(written);
  } catch {
    // A malformed escape: the password as written is all there is to remove.
  }
  let safe = text;
  // Shorter ones could be any part of the message.
  for (const secret of [written, decoded]) {
    if (secret.length >= 4) safe = safe.split(secret).join('***');
  }
  return safe;
}

/**
 * A failure to start the embedded PostgreSQL that LEDGENCE_DATA_DIR causes or fixes: a folder
 * that cannot be created (a file on the path, no permission, a read-only disk), or one the
 * embedded server cannot use. Other failures are reported as they are.
 */
function dataDirError(error: unknown, dataDir: string): unknown {
  if (error instanceof EmbeddedPostgresError) {
    if (!['data_dir_invalid', 'data_dir_busy', 'permission'].includes(error.code)) return error;
    return new Error(`${error.message.trimEnd()} (LEDGENCE_DATA_DIR sets the data folder)`, {
      cause: error,
    });
  }
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  const syscall = (error as NodeJS.ErrnoException | undefined)?.syscall;
  if (!(error instanceof Error) || code === undefined || syscall === undefined) return error;
  return startError(
    `the data folder ${dataDir} cannot be created or used (${error.message})`,
    'set LEDGENCE_DATA_DIR to a folder this process can create and write, or set DATABASE_URL ' +
      'to use a PostgreSQL server instead',
    error,
  );
}

/** Creates `name` on the server at `adminUrl` unless it exists (a fresh embedded cluster). */
async function ensureDatabase(adminUrl: string, name: string): Promise<void> {
  const sql = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    const [found] = await sql`select 1 from pg_database where datname = ${name}`;
    if (found === undefined) await sql.unsafe(`create database "${name}"`);
  } finally {
    await sql.end();
  }
}
