/**
 * `run()` and `stop()` before any I/O: a worker told to stop before it ran.
 * The process's SIGTERM handler is often installed before `run()` is reached (README: `process.once(
 * 'SIGTERM', () => void worker.stop())`, then `await worker.run()`), so a signal arriving in
 * between must end the process cleanly, not as a failed run.
 */
import { describe, expect, it } from 'vitest';
import { silentLogger } from './logger.js';
import { Worker } from './worker.js';

function worker(): Worker {
  // Port 9 (discard) on loopback: nothing here may send a request.
  const w = new Worker({
    url: 'http://127.0.0.1:9',
    tenant: 'acme',
    namespace: 'prod',
    queue: 'q',
    concurrency: 1,
    logger: silentLogger,
  });
  w.register('p', () => null);
  return w;
}

describe('a worker stopped before run()', () => {
  it('run() resolves at once, taking no task, rather than failing as if run twice', async () => {
    const w = worker();
    await w.stop();
    await expect(w.run()).resolves.toBeUndefined();
    expect(w.inFlight).toBe(0);
  });

  it('stop() called twice before run() resolves both times', async () => {
    const w = worker();
    await expect(Promise.all([w.stop(), w.stop({ graceMs: 0 })])).resolves.toEqual([
      undefined,
      undefined,
    ]);
  });
});
