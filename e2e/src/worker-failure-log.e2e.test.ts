/**
 * A handler's failure is in the worker's log where an operator looks — a crash or a timeout at
 * `warn`, an `ApplicationError` at `info`, each naming the task — and a plain object thrown in
 * place of an Error is described by its message (review r35e: the only line was a `debug`
 * `settled`, and such an object was stored as `[object Object]`).
 */
import { ApplicationError, type Worker } from '@ledgence/worker';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { ServerProcess } from './server-process.js';
import { client, Stack, settled, shortWorker } from './test/harness.js';

const lines: { level: string; message: string; fields: Record<string, unknown> }[] = [];
const line =
  (level: string) =>
  (message: string, fields: Record<string, unknown> = {}): void => {
    lines.push({ level, message, fields });
  };
const logger = {
  debug: line('debug'),
  info: line('info'),
  warn: line('warn'),
  error: line('error'),
};

const stack = new Stack('worker_failure_log');
let server: ServerProcess;
let worker: Worker;
let running: Promise<void>;

beforeAll(async () => {
  await stack.open();
  server = await stack.start();
  worker = shortWorker(server.url, 'failures', { concurrency: 4, logger });
  worker.register('crash', () => {
    throw { code: 'E_DB', message: 'database down' };
  });
  worker.register('bigint', () => 10n);
  worker.register('refuse', () => {
    throw new ApplicationError('card_declined', 'the card was declined', { retryable: false });
  });
  worker.register('fine', () => 'ok');
  running = worker.run();
});
afterAll(async () => {
  await worker.stop({ graceMs: 0 });
  await running;
  await stack.close();
});

it('logs a crash and an unsendable output at warn, an application error at info, each with its task', async () => {
  const c = client(server.url);
  const once = { max_attempts: 1, delay_ms: 0 };
  const submitted = await Promise.all(
    ['crash', 'bigint', 'refuse', 'fine'].map((program) =>
      c.submit({ queue: 'failures', program, data: null, retry: once }),
    ),
  );
  const [crash, bigint, refuse, fine] = submitted.map((task) => task.task_id) as string[];
  const results = await settled(
    c,
    submitted.map((task) => task.task_id),
  );
  expect(results.map((r) => r?.outcome?.state)).toEqual([
    'failed',
    'failed',
    'failed',
    'succeeded',
  ]);
  expect(results[0]?.outcome).toMatchObject({
    failure: { error: { kind: 'crashed', message: 'database down' } },
  });
  const about = (taskId: string | undefined) =>
    lines
      .filter((l) => l.fields.task_id === taskId && l.level !== 'debug')
      .map((l) => [l.level, l.message, l.fields.message]);
  expect(about(crash)).toEqual([['warn', 'task handler failed', 'database down']]);
  expect(about(bigint)).toEqual([
    ['warn', 'task handler failed', expect.stringContaining('a bigint is not JSON')],
  ]);
  expect(about(refuse)).toEqual([
    ['info', 'task handler returned an application error', 'the card was declined'],
  ]);
  expect(about(fine)).toEqual([]);
});
