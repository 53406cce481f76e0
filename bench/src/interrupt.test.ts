import { EventEmitter } from 'node:events';
import { describe, expect, it } from 'vitest';
import { once, stopOnSignals } from './interrupt.js';

/** A teardown the test finishes by hand, and what the handlers did. */
function harness() {
  const calls = { teardown: 0, exits: [] as number[], logs: [] as string[] };
  let finish!: () => void;
  let fail!: (error: Error) => void;
  const teardown = () => {
    calls.teardown += 1;
    return new Promise<void>((resolve, reject) => {
      finish = resolve;
      fail = reject;
    });
  };
  const source = new EventEmitter();
  const stop = stopOnSignals(teardown, {
    what: 'the test server',
    log: (message) => calls.logs.push(message),
    exit: (code) => calls.exits.push(code),
    source,
  });
  return { calls, source, stop, finish: () => finish(), fail: (e: Error) => fail(e) };
}

const settle = () => new Promise((resolve) => setImmediate(resolve));

describe('stopOnSignals', () => {
  it('exits with 143 after SIGTERM only once the teardown has finished', async () => {
    const { calls, source, stop, finish } = harness();
    source.emit('SIGTERM', 'SIGTERM');
    await settle();
    expect(stop.signal).toBe('SIGTERM');
    expect(calls.teardown).toBe(1);
    expect(calls.exits).toEqual([]);
    expect(calls.logs).toEqual(['SIGTERM: stopping the test server (SIGTERM again exits at once)']);
    finish();
    await settle();
    expect(calls.exits).toEqual([143]);
  });

  it('exits with 130 after SIGINT, and at once on a second signal', async () => {
    const { calls, source, finish } = harness();
    source.emit('SIGINT', 'SIGINT');
    source.emit('SIGINT', 'SIGINT');
    expect(calls.exits).toEqual([130]);
    expect(calls.teardown).toBe(1);
    finish();
    await settle();
    expect(calls.exits).toEqual([130, 130]);
  });

  it('still exits when the teardown fails, saying why', async () => {
    const { calls, source, fail } = harness();
    source.emit('SIGTERM', 'SIGTERM');
    fail(new Error('postmaster would not stop'));
    await settle();
    expect(calls.exits).toEqual([143]);
    expect(calls.logs.at(-1)).toBe(
      'stopping after SIGTERM failed: Error: postmaster would not stop',
    );
  });

  it('reports no signal and leaves no handler once disposed', () => {
    const { calls, source, stop } = harness();
    expect(stop.signal).toBeUndefined();
    expect(source.listenerCount('SIGINT')).toBe(1);
    expect(source.listenerCount('SIGTERM')).toBe(1);
    stop.dispose();
    expect(source.listenerCount('SIGINT')).toBe(0);
    expect(source.listenerCount('SIGTERM')).toBe(0);
    expect(calls.teardown).toBe(0);
  });
});

describe('once', () => {
  it('runs the function on the first call and hands every later call the same promise', async () => {
    let runs = 0;
    const stopAll = once(async () => {
      runs += 1;
    });
    const first = stopAll();
    const second = stopAll();
    expect(second).toBe(first);
    await first;
    await stopAll();
    expect(runs).toBe(1);
  });
});
