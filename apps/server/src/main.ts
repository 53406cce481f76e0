#!/usr/bin/env node
/**
 * `ledgence-server`: runs Ledgence with configuration from the environment
 * (DESIGN §11). With none, it starts embedded PostgreSQL in `./.ledgence/pg`
 * and listens on 127.0.0.1:8080 in development mode.
 */
import { readFileSync } from 'node:fs';
import { ConfigError, loadConfig } from './config.js';
import { type RunningServer, startServer } from './server.js';

async function main(): Promise<void> {
  let config: ReturnType<typeof loadConfig>;
  try {
    config = loadConfig(process.env, (path) => readFileSync(path, 'utf8'));
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`${error.message}\n`);
      process.exit(2);
    }
    throw error;
  }
  // Handlers go in before the start: without them a signal during the start ends Node at once,
  // and the embedded PostgreSQL it spawned keeps running, holding the data folder. startServer
  // cannot be interrupted, so a signal while it runs stops the server once the start settles
  // (a failed start has cleaned up after itself).
  let server: RunningServer | undefined;
  let stopRequested: string | undefined;
  let signals = 0;
  const stop = (running: RunningServer) =>
    running.stop().then(
      () => process.exit(0),
      (error: unknown) => {
        process.stderr.write(`shutdown failed: ${String(error)}\n`);
        process.exit(1);
      },
    );
  const shutdown = (signal: string) => {
    signals += 1;
    if (signals > 1) {
      // process.exit still sends the embedded database a fast shutdown (embedded.ts).
      process.stderr.write(`${signal} again: exiting now\n`);
      process.exit(1);
    }
    if (server === undefined) {
      stopRequested = signal;
      process.stderr.write(`${signal} while starting: stopping once the start completes\n`);
      return;
    }
    process.stderr.write(`${signal}: shutting down gracefully\n`);
    void stop(server);
  };
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));

  server = await startServer(config);
  if (stopRequested !== undefined) {
    process.stderr.write(`${stopRequested}: started, shutting down gracefully\n`);
    await stop(server);
    return;
  }
  const lines = [
    `Ledgence is listening on ${server.url}`,
    server.dataDir === undefined
      ? 'database: DATABASE_URL'
      : `database: embedded PostgreSQL in ${server.dataDir}`,
    server.developmentMode
      ? 'development mode: no API keys configured, loopback only, every request allowed'
      : `API keys: ${config.apiKeys.length} configured`,
  ];
  process.stderr.write(`${lines.join('\n')}\n`);
}

main().catch((error: unknown) => {
  process.stderr.write(
    `Ledgence failed to start: ${error instanceof Error ? error.message : String(error)}\n`,
  );
  process.exit(1);
});
