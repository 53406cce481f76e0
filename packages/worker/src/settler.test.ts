import type { SettleCommand, SettleReply } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { TransportError } from './errors.js';
import { silentLogger } from './logger.js';
import { reportFor, settleCommandFor } from './settle.js';
import { type SendSettleBatch, Settler, type SettlerOptions } from './settler.js';
import { owner, problemErrorOf, problemOf, times } from './testdata/fixtures.js';

function command(attempt: string, output: unknown = attempt): SettleCommand {
  const taskId = `t-${attempt}`;
  return settleCommandFor(
    { ...owner, task_id: taskId, attempt_id: attempt },
    reportFor({ taskId, attemptId: attempt }, { kind: 'returned', value: output }, times),
  );
}

function reply(c: SettleCommand, already = false): SettleReply {
  return {
    receipt: {
      operation_id: c.operation_id,
      task_id: c.owner.task_id,
      attempt_id: c.owner.attempt_id,
      accepted_at: 5,
    },
    already_accepted: already,
    task_state: 'succeeded',
  };
}

const fast = { baseMs: 1, maxMs: 4 };

/** A Settler sending with `send`, logging nothing, retrying after 1–4 ms unless `options` say. */
function settlerOf(send: SendSettleBatch, options: Partial<SettlerOptions> = {}): Settler {
  return new Settler({ logger: silentLogger, backoff: fast, send, ...options });
}

describe('Settler', () => {
  it('batches settlements ready in the same tick into one request', async () => {
    const sent: SettleCommand[][] = [];
    const settler = settlerOf(async (commands) => {
      sent.push(commands);
      return commands.map((c) => reply(c));
    });
    const results = await Promise.all(['a', 'b', 'c'].map((a) => settler.settle(command(a))));
    expect(sent).toHaveLength(1);
    expect(sent[0]).toHaveLength(3);
    expect(results.every((r) => r.kind === 'accepted')).toBe(true);
  });

  it('re-sends the same bytes after transport failures until accepted (already_accepted counts)', async () => {
    const bodies: string[] = [];
    let calls = 0;
    const settler = settlerOf(async (commands) => {
      bodies.push(JSON.stringify(commands));
      calls += 1;
      if (calls === 1) throw new TransportError('timed out', { reason: 'timeout' });
      if (calls === 2) throw new TransportError('reply lost', { reason: 'network' });
      if (calls === 3) return commands.map(() => problemOf('unavailable'));
      return commands.map((c) => reply(c, true));
    });
    const result = await settler.settle(command('a'));
    expect(result).toMatchObject({ kind: 'accepted', reply: { already_accepted: true } });
    expect(calls).toBe(4);
    expect(new Set(bodies).size).toBe(1);
  });

  it('treats ownership_lost and conflict as definitive, without retrying', async () => {
    let calls = 0;
    const settler = settlerOf(async (commands) => {
      calls += 1;
      return commands.map((c) =>
        c.owner.attempt_id === 'lost' ? problemOf('ownership_lost') : problemOf('conflict'),
      );
    });
    const [lost, conflict] = await Promise.all([
      settler.settle(command('lost')),
      settler.settle(command('other')),
    ]);
    expect(lost).toMatchObject({ kind: 'rejected', error: { code: 'ownership_lost' } });
    expect(conflict).toMatchObject({ kind: 'rejected', error: { code: 'conflict' } });
    expect(calls).toBe(1);
  });

  it('answers each item on its own within a batch', async () => {
    let calls = 0;
    const settler = settlerOf(async (commands) => {
      calls += 1;
      return commands.map((c) =>
        c.owner.attempt_id === 'flaky' && calls === 1 ? problemOf('unavailable') : reply(c),
      );
    });
    const results = await Promise.all([
      settler.settle(command('ok')),
      settler.settle(command('flaky')),
    ]);
    expect(results.map((r) => r.kind)).toEqual(['accepted', 'accepted']);
    expect(calls).toBe(2);
  });

  it('splits batches by count', async () => {
    const sizes: number[] = [];
    const settler = new Settler({
      logger: silentLogger,
      maxBatch: 2,
      send: async (commands) => {
        sizes.push(commands.length);
        return commands.map((c) => reply(c));
      },
    });
    await Promise.all(['a', 'b', 'c', 'd', 'e'].map((a) => settler.settle(command(a))));
    expect(sizes).toEqual([2, 2, 1]);
  });

  it('splits batches by UTF-8 bytes, as the server counts its limit', async () => {
    const bodies: number[] = [];
    const settler = new Settler({
      logger: silentLogger,
      maxBatchBytes: 1_000_000,
      send: async (commands) => {
        bodies.push(Buffer.byteLength(JSON.stringify({ commands })));
        return commands.map((c) => reply(c));
      },
    });
    // 300 000 UTF-8 bytes each but 100 000 UTF-16 units: counted in units, all six would share
    // one request of 1.8 MB.
    const output = '\u4e2d'.repeat(100_000);
    const results = await Promise.all(
      ['a', 'b', 'c', 'd', 'e', 'f'].map((a) => settler.settle(command(a, output))),
    );
    expect(results.every((r) => r.kind === 'accepted')).toBe(true);
    expect(bodies).toHaveLength(2);
    expect(Math.max(...bodies)).toBeLessThanOrEqual(1_000_000);
  });

  it('sends each settlement of a request refused as too large on its own; one refused alone is rejected', async () => {
    const sent: string[][] = [];
    const tooLarge = problemErrorOf('payload_too_large');
    const settler = settlerOf(async (commands) => {
      const attempts = commands.map((c) => c.owner.attempt_id);
      sent.push(attempts);
      if (attempts.length > 1 || attempts[0] === 'huge') throw tooLarge;
      return commands.map((c) => reply(c));
    });
    const results = await Promise.all(['a', 'huge', 'b'].map((a) => settler.settle(command(a))));
    expect(results.map((r) => r.kind)).toEqual(['accepted', 'rejected', 'accepted']);
    expect(results[1]).toEqual({ kind: 'rejected', error: tooLarge });
    // Once together, then each alone, once.
    expect(sent).toEqual([['a', 'huge', 'b'], ['a'], ['huge'], ['b']]);
  });

  it('abandons what is unsent when asked, and everything after', async () => {
    const settler = settlerOf(
      async () => {
        throw new TransportError('down', { reason: 'network' });
      },
      { backoff: { baseMs: 10_000, maxMs: 10_000 } },
    );
    const pending = settler.settle(command('a'));
    await new Promise((r) => setTimeout(r, 20));
    settler.abandon();
    expect(await pending).toEqual({ kind: 'abandoned' });
    expect(await settler.settle(command('b'))).toEqual({ kind: 'abandoned' });
  });
  /** A send that holds each request until released, recording what each carried. */
  function heldSend() {
    const requests: { attempts: string[]; release: () => void }[] = [];
    const send = (commands: SettleCommand[]) =>
      new Promise<SettleReply[]>((resolve) => {
        requests.push({
          attempts: commands.map((c) => c.owner.attempt_id),
          release: () => resolve(commands.map((c) => reply(c))),
        });
      });
    return { requests, send };
  }

  const tick = () => new Promise((r) => setImmediate(r));

  it('keeps one request in flight by default: later settlements wait and share the next', async () => {
    const { requests, send } = heldSend();
    const settler = new Settler({ logger: silentLogger, send });
    const first = settler.settle(command('a'));
    await tick();
    const later = ['b', 'c'].map((a) => settler.settle(command(a)));
    await tick();
    await tick();
    expect(requests.map((r) => r.attempts)).toEqual([['a']]);
    requests[0]?.release();
    expect(await first).toMatchObject({ kind: 'accepted' });
    await tick();
    expect(requests.map((r) => r.attempts)).toEqual([['a'], ['b', 'c']]);
    requests[1]?.release();
    expect((await Promise.all(later)).map((r) => r.kind)).toEqual(['accepted', 'accepted']);
  });

  it('with maxInFlight, sends settlements finishing during a request at once, never one twice', async () => {
    const { requests, send } = heldSend();
    const settler = new Settler({ logger: silentLogger, send, maxInFlight: 2 });
    const all = [settler.settle(command('a'))];
    await tick();
    all.push(settler.settle(command('b')), settler.settle(command('c')));
    await tick();
    // Two requests out, both unanswered; the third settlement waits for a free one.
    all.push(settler.settle(command('d')));
    await tick();
    await tick();
    expect(requests.map((r) => r.attempts)).toEqual([['a'], ['b', 'c']]);
    requests[1]?.release();
    await tick();
    await tick();
    expect(requests.map((r) => r.attempts)).toEqual([['a'], ['b', 'c'], ['d']]);
    requests[0]?.release();
    requests[2]?.release();
    expect((await Promise.all(all)).map((r) => r.kind)).toEqual([
      'accepted',
      'accepted',
      'accepted',
      'accepted',
    ]);
    expect(requests).toHaveLength(3);
    expect(settler.size).toBe(0);
  });

  it('refuses a count option that is not a positive integer', () => {
    const { send } = heldSend();
    for (const bad of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => new Settler({ logger: silentLogger, send, maxInFlight: bad })).toThrow(
        /maxInFlight must be a positive integer/,
      );
      expect(() => new Settler({ logger: silentLogger, send, maxBatch: bad })).toThrow(
        /maxBatch must be a positive integer/,
      );
    }
  });
});
