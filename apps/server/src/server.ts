import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import { type HttpBindings, serve } from '@hono/node-server';
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
  migrate,
  startEmbeddedPostgres,
} from '@ledgence/store-postgres';
import pino, { type Logger } from 'pino';
import postgres from 'postgres';
import { isLoopbackHost, type ServerConfig } from './config.js';
import { armAfterReply, serverFailpoints } from './failpoints.js';
import { startRecoveryLoop, startRetentionLoop, startStatisticsLoop } from './maintenance.js';
import { createServerMetrics } from './metrics.js';

/** The database the embedded server creates for Ledgence's own tables. */
const EMBEDDED_DATABASE = 'ledgence';

/** Options of {@link startServer}. */
export interface StartServerOptions {
  /** Where the JSON logs go; default pino at the configured level on stdout. */
  logger?: Logger;
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
  const cleanups: (() => Promise<void>)[] = [];
  const cleanup = async () => {
    for (const step of cleanups.reverse()) {
      await step().catch((error) => logger.warn({ err: error }, 'shutdown step failed'));
    }
  };
  try {
    let databaseUrl = settings.databaseUrl;
    let embedded: EmbeddedPostgres | undefined;
    if (databaseUrl === undefined) {
      embedded = await startEmbeddedPostgres({ dataDir: resolve(settings.dataDir) });
      const running = embedded;
      cleanups.push(() => running.stop());
      await ensureDatabase(embedded.url, EMBEDDED_DATABASE);
      databaseUrl = embedded.urlFor(EMBEDDED_DATABASE);
    }
    const url = databaseUrl;
    await migrate(url);

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
    const wake = createPostgresWakeSource({ url });
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
      health: {
        async ready() {
          if (!accepting) return { ok: false, detail: 'shutting down' };
          const status = await store.migrationStatus();
          return status.current
            ? true
            : { ok: false, detail: `${status.pending.length} migrations pending` };
        },
      },
    });

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

    // Without TLS or HTTP/2 options, @hono/node-server serves over node:http.
    const http = await new Promise<Server>((listening, failed) => {
      // While stopping, every reply asks the client to close its connection, so keep-alive
      // connections drain with their last request instead of lingering until the timeout.
      const fetch = async (request: Request, env: unknown): Promise<Response> => {
        const response = await app.fetch(request, env);
        if (failpoints.enabled) {
          await armAfterReply(failpoints, request, response, (env as HttpBindings).outgoing);
        }
        if (!accepting) {
          try {
            response.headers.set('connection', 'close');
          } catch {
            // A response with immutable headers is sent as is; the timeout still bounds it.
          }
        }
        return response;
      };
      const server = serve({ fetch, hostname: settings.host, port: settings.port }, () =>
        listening(server as Server),
      );
      server.once('error', failed);
    });
    const address = http.address() as AddressInfo;
    const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;

    let stopping: Promise<void> | undefined;
    return {
      url: `http://${host}:${address.port}`,
      dataDir: embedded?.dataDir,
      developmentMode,
      stop() {
        stopping ??= (async () => {
          accepting = false;
          closing.abort();
          // One budget for the HTTP drain and the callback tries alike: once it is spent, open
          // connections are closed and tries still in flight aborted (each reported for a retry).
          const spent = new AbortController();
          const deadline = setTimeout(() => {
            http.closeAllConnections();
            spent.abort();
          }, settings.shutdownTimeoutMs);
          // The sender stops leasing now, not after the drain: a try started meanwhile could
          // only be aborted. Its later cleanup step awaits this same stop.
          const senderStopped = sender.stop({ signal: spent.signal });
          const closed = new Promise<void>((done) => http.close(() => done()));
          http.closeIdleConnections();
          await Promise.allSettled([closed, senderStopped]);
          clearTimeout(deadline);
          await cleanup();
        })();
        return stopping;
      },
    };
  } catch (error) {
    await cleanup();
    throw error;
  }
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
