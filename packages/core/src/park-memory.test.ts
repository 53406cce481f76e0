/**
 * A parked wait must leave nothing behind once it ends. A server's
 * `closing` signal lives as long as the process; every park of every long poll is tied to it.
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import type { WakeSource } from './ports.js';
import { createTaskService } from './service.js';
import {
  acquireCommand,
  createMemoryTaskStore,
  freshScope,
  openSessionCommand,
} from './testing/index.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

async function settledHeap(): Promise<number> {
  for (let i = 0; i < 4; i++) {
    await new Promise((resolve) => setTimeout(resolve, 10));
    gc();
  }
  return process.memoryUsage().heapUsed;
}

describe('parking on a long-lived closing signal', () => {
  it('retains no memory per park once the polls have ended (no growth of the closing signal)', async () => {
    const store = createMemoryTaskStore();
    const closing = new AbortController();
    const perPoll = 25_000;
    const polls = 2;
    let parks = 0;
    // A wake source whose every `next` comes back with a hint (a busy queue): each poll parks,
    // probes, parks again; the poll's client goes away after `perPoll` parks.
    const aborts = new Map<AbortSignal, () => void>();
    const wake: WakeSource = {
      watch: () => {
        let mine = 0;
        return {
          async next(_timeoutMs, signal) {
            parks += 1;
            mine += 1;
            if (mine >= perPoll && signal !== undefined) {
              for (const [s, abort] of aborts) if (!s.aborted) abort();
            }
          },
          close() {},
        };
      },
    };
    const service = createTaskService({
      store,
      wake,
      rescanIntervalMs: 60_000,
      longPollMaxMs: 60_000,
      closing: closing.signal,
    });
    const scope = freshScope();
    const session = await store.openSession(openSessionCommand(scope, { concurrency: polls }));
    const run = async (rounds: number) => {
      for (let r = 0; r < rounds; r++) {
        await Promise.all(
          Array.from({ length: polls }, async (_, slot) => {
            const client = new AbortController();
            aborts.set(client.signal, () => client.abort());
            const reply = await service.acquire(acquireCommand(session, slot, 1), {
              waitMs: 60_000,
              signal: client.signal,
            });
            aborts.delete(client.signal);
            expect(reply).toEqual({ disposition: 'empty', sequence: 1 });
          }),
        );
      }
    };
    await run(1); // warm up
    const before = await settledHeap();
    const parksBefore = parks;
    await run(2);
    const after = await settledHeap();
    const parked = parks - parksBefore;
    expect(parked).toBeGreaterThanOrEqual(2 * perPoll);
    // Each ended park must leave nothing reachable: allow 10 bytes a park of noise (≈ 1 MB).
    expect(after - before).toBeLessThan(parked * 10);
  }, 120_000);
});
