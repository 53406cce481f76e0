#!/usr/bin/env node
/**
 * `ledgence-server`: runs Ledgence with configuration from the environment
 * (DESIGN §11). With none, it starts embedded PostgreSQL in `./.ledgence/pg`
 * and listens on 127.0.0.1:8080 in development mode.
 */
import { readFileSync } from 'node:fs';
import { ConfigError, loadConfig } from './config.js';
import { startServer } from './server.js';

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
  const server = await startServer(config);
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
  let signals = 0;
  const shutdown = (signal: string) => {
    signals += 1;
    if (signals > 1) {
      process.stderr.write(`${signal} again: exiting now\n`);
      process.exit(1);
    }
    process.stderr.write(`${signal}: shutting down gracefully\n`);
    server.stop().then(
      () => process.exit(0),
      (error: unknown) => {
        process.stderr.write(`shutdown failed: ${String(error)}\n`);
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
}

main().catch((error: unknown) => {
  process.stderr.write(
    `Ledgence failed to start: ${error instanceof Error ? error.message : String(error)}\n`,
  );
  process.exit(1);
});
