/**
 * @module @ledgence/worker
 *
 * The Ledgence worker SDK and client. Submit tasks with {@link Client}; run
 * them with {@link Worker}, which owns the whole worker protocol: sessions,
 * long-polling acquisition with replay-safe sequences, dispatch-intent
 * renewal before user code, batched heartbeats, cancellation and lease loss
 * through `AbortSignal`, and exactly-once settlement with a stable operation
 * id. Depends on `@ledgence/contracts` only (plus Node built-ins: requests
 * go through `node:http`/`node:https` unless a `fetch` is passed), so it
 * installs alone.
 *
 * @example
 * ```ts
 * import { ApplicationError, Client, Worker } from '@ledgence/worker';
 *
 * const url = 'http://127.0.0.1:8080';
 * const client = new Client({ url, tenant: 'acme', namespace: 'prod' });
 * const task = await client.submit(
 *   { queue: 'email', program: 'send-email', data: { to: 'ada@example.com' } },
 *   { idempotencyKey: 'welcome-ada' },
 * );
 *
 * const worker = new Worker({ url, tenant: 'acme', namespace: 'prod', queue: 'email',
 *                             concurrency: 8 });
 * worker.register('send-email', async (data, ctx) => {
 *   // ctx.signal aborts on cancel or lease loss
 *   if (ctx.signal.aborted) throw ctx.signal.reason;
 *   if (!data) throw new ApplicationError('no_recipient', 'nothing to send', { retryable: false });
 *   return { sent: true };
 * });
 * const running = worker.run(); // until worker.stop(): drains in-flight work, then settles and exits
 *
 * console.log(await client.result(task.task_id, { waitMs: 20_000 }));
 * await worker.stop();
 * await running;
 * ```
 */

export type { BackoffPolicy } from './backoff.js';
export type {
  CallOptions,
  ClientOptions,
  HistoryOptions,
  ListOptions,
  ResultOptions,
  SubmitBatchEntry,
  SubmitInput,
  SubmitOptions,
  SubscribeOptions,
} from './client.js';
export { Client } from './client.js';
export type {
  ApplicationErrorOptions,
  ProblemErrorOptions,
  ProtocolErrorOptions,
  TransportErrorOptions,
} from './errors.js';
export {
  ApplicationError,
  isRetryable,
  ProblemError,
  ProtocolError,
  TransportError,
} from './errors.js';
export type { FetchLike, HttpOptions } from './http.js';
export type { FieldsFirstLogger, LogFields, Logger } from './logger.js';
export { consoleLogger, fieldsFirst, silentLogger } from './logger.js';
export type { AbortCause } from './settle.js';
export { operationIdFor } from './settle.js';
export type { StandardSchemaV1 } from './standard-schema.js';
export type {
  RegisterOptions,
  StopOptions,
  TaskContext,
  TaskHandler,
  WorkerOptions,
} from './worker.js';
export { TaskAbortedError, Worker } from './worker.js';
