/**
 * What a worker and a client log through an outage of the network to their server: the first failed poll of a
 * run as a warning, the rest at debug (one a minute would be a warning again), and one line when
 * polling works again, with the count — not a warning per failed try (22 for one short outage).
 * The real server, the real SDK, a TCP proxy between them that goes down and comes back.
 */
import { Client, type LogFields, type Logger } from '@ledgence/worker';
import { describe, expect, it } from 'vitest';
import { NAMESPACE, sleep, startProxy, TENANT, until, workerSuite } from './test/harness.js';

const suite = workerSuite('worker_outage_log');

interface Line {
  level: keyof Logger;
  message: string;
  fields: LogFields;
}

function recordingLogger(): Logger & { lines: Line[] } {
  const lines: Line[] = [];
  const at =
    (level: keyof Logger) =>
    (message: string, fields: LogFields = {}) =>
      void lines.push({ level, message, fields });
  return { lines, debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
}

describe('a worker through a network outage', () => {
  it('warns at the first failed poll of a run, and says once when polling works again', async () => {
    const proxy = await startProxy(suite.server.url);
    suite.proxies.push(proxy);
    const logger = recordingLogger();
    const worker = suite.worker('outage-log', {
      url: proxy.url,
      logger,
      backoff: { baseMs: 10, maxMs: 50 },
    });
    worker.register('noop', () => null);
    const running = worker.run();
    await until(
      () => logger.lines.some((l) => l.message === 'session opened'),
      10_000,
      'a session',
    );

    proxy.setDown(true);
    const failed = () => logger.lines.filter((l) => l.message === 'acquire failed; retrying');
    await until(() => failed().length >= 10, 20_000, 'ten failed polls');
    await sleep(100);
    proxy.setDown(false);
    await until(
      () => logger.lines.some((l) => l.message === 'acquire works again'),
      20_000,
      'polling again',
    );
    await worker.stop({ graceMs: 0 });
    await running;

    const failures = failed();
    expect(failures.map((l) => l.level)).toEqual([
      'warn',
      ...Array.from({ length: failures.length - 1 }, () => 'debug'),
    ]);
    expect(failures.map((l) => l.fields.failures)).toEqual(failures.map((_, i) => i + 1));
    // The warning says what failed.
    expect(failures[0]?.fields).toMatchObject({ error_code: 'transport_error' });
    const again = logger.lines.filter((l) => l.message === 'acquire works again');
    expect(again).toEqual([
      { level: 'info', message: 'acquire works again', fields: { failures: failures.length } },
    ]);
    expect(logger.lines.filter((l) => l.level === 'warn' || l.level === 'error')).toHaveLength(1);
  });

  it('a client warns at the first retried failure of its calls, and says once when they work again', async () => {
    const proxy = await startProxy(suite.server.url);
    suite.proxies.push(proxy);
    const logger = recordingLogger();
    const client = new Client({
      url: proxy.url,
      tenant: TENANT,
      namespace: NAMESPACE,
      logger,
      retries: 1_000,
      backoff: { baseMs: 10, maxMs: 50 },
    });
    proxy.setDown(true);
    // A busy producer: five calls retrying at once through the outage.
    const calls = Array.from({ length: 5 }, (_, i) =>
      client.submit({ queue: 'outage-log-client', program: 'p', data: i }),
    );
    const failed = () => logger.lines.filter((l) => l.message === 'request failed; retrying');
    await until(() => failed().length >= 20, 20_000, 'twenty retried failures');
    proxy.setDown(false);
    const tasks = await Promise.all(calls);
    expect(new Set(tasks.map((t) => t.task_id)).size).toBe(5);

    const failures = failed();
    expect(failures.filter((l) => l.level === 'warn')).toHaveLength(1);
    expect(failures[0]?.level).toBe('warn');
    expect(failures.filter((l) => l.level === 'debug')).toHaveLength(failures.length - 1);
    expect(logger.lines.filter((l) => l.message === 'requests work again')).toEqual([
      { level: 'info', message: 'requests work again', fields: { failures: failures.length } },
    ]);
  });
});
