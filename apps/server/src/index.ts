/**
 * @module @ledgence/server
 *
 * The composition root of Ledgence: configuration from the environment,
 * embedded PostgreSQL by default, migrations, the HTTP server, the maintenance
 * loops (lease recovery, retention) and the completion-callback sender on
 * every replica, and graceful shutdown. Run it with `pnpm start` at the
 * repository root, or embed it:
 *
 * @example
 * ```ts
 * import { readFileSync } from 'node:fs';
 * import { loadConfig, startServer } from '@ledgence/server';
 *
 * const server = await startServer(loadConfig({ PORT: '0' }, (p) => readFileSync(p, 'utf8')));
 * console.log(server.url); // → http://127.0.0.1:<port>
 * await server.stop();
 * ```
 */
export {
  type ApiKeySetting,
  CONFIG_VARIABLES,
  ConfigError,
  isLoopbackHost,
  type LogLevel,
  loadConfig,
  type ReadConfigFile,
  type ServerConfig,
} from './config.js';
export {
  collectRetention,
  type Maintenance,
  type PeriodicOptions,
  type RecoveryLoopOptions,
  type RetentionLoopOptions,
  startPeriodic,
  startRecoveryLoop,
  startRetentionLoop,
} from './maintenance.js';
export {
  createServerMetrics,
  type DeliveryObservation,
  DUE_BACKLOG_CAP,
  type ServerMetrics,
  type ServerMetricsOptions,
} from './metrics.js';
export { type RunningServer, type StartServerOptions, startServer } from './server.js';
