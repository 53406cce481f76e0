/**
 * What the completion sender and one delivery try leave behind and cost the
 * process, against real receivers on 127.0.0.1 and the in-memory store (no
 * network mocks): no socket outliving stop(), no listener warning in a full
 * delivery window, and a 101 Switching Protocols decided as a status, not
 * waited out as a timeout.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { buildCompletionEvent } from '@ledgence/contracts';
import { createMemoryTaskStore, freshScope } from '@ledgence/core/testing';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { deliverEvent, encodeCompletionEvent } from './deliver.js';
import { createDestination, type Destinations } from './destinations.js';
import { type CompletionSender, createCompletionSender } from './sender.js';
import { type Receiver, startRawReceiver, startReceiver } from './testdata/receiver.js';
import { finishTask, subscribe, subscriptionOf } from './testdata/tasks.js';

const KEY = Buffer.alloc(32, 0x5a);
/** Conditions are polled, not timed: generous for a loaded CI machine, quick when all is well. */
const WAIT = { timeout: 5_000, interval: 10 };

const open: { close(): Promise<void> }[] = [];
const senders: CompletionSender[] = [];
afterEach(async () => {
  const stopping = senders.splice(0).map((sender) => sender.stop());
  await Promise.all(open.splice(0).map((server) => server.close()));
  await Promise.all(stopping);
});

async function receiver(answer: Parameters<typeof startReceiver>[0]): Promise<Receiver> {
  const started = await startReceiver(answer);
  open.push(started);
  return started;
}

function destinations(origin: string, timeoutMs?: number): Destinations {
  return new Map([
    [
      'billing',
      createDestination({ alias: 'billing', url: `${origin}/hooks`, secret: KEY, timeoutMs }),
    ],
  ]);
}

/** An HTTP receiver that also tracks its open connections, which `Receiver` does not show. */
async function trackingReceiver(
  handler: Parameters<typeof createServer>[1],
): Promise<{ origin: string; connections: Set<Socket> }> {
  const connections = new Set<Socket>();
  const server: Server = createServer(handler);
  server.on('connection', (socket: Socket) => {
    connections.add(socket);
    socket.on('close', () => connections.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  open.push({
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  });
  return { origin: `http://127.0.0.1:${port}`, connections };
}

describe('stop()', () => {
  it('ends the drain of a 2xx body still arriving: no socket to the receiver outlives it', {
    timeout: 20_000,
  }, async () => {
    // The status decides (delivered, reported); the body then drains up to the destination's
    // timeout. A long timeout shows whether stop() leaves that socket, and its ref'd deadline
    // timer, to keep the process alive after it resolved.
    const r = await trackingReceiver((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-length': '1000' });
        res.write('x');
      });
    });
    const store = createMemoryTaskStore({ now: () => Date.now() });
    const scope = freshScope();
    const subscription = await subscribe(store, scope, await finishTask(store, scope), 'billing');
    const sender = createCompletionSender({ store, destinations: destinations(r.origin, 60_000) });
    senders.push(sender);

    expect((await sender.runOnce()).records).toMatchObject([{ outcome: 'delivered' }]);
    expect((await subscriptionOf(store, scope, subscription)).state).toBe('delivered');
    expect(r.connections.size).toBe(1);

    await sender.stop();
    await vi.waitFor(() => expect(r.connections.size).toBe(0), WAIT);
  });
});

describe('a full delivery window', () => {
  it('raises no MaxListenersExceededWarning with more than 10 tries in flight', async () => {
    // Every try listens on the sender's one abort signal and stops listening when it ends, so
    // a window of up to MAX_COMPLETION_BATCH tries is no leak; Node warns past 10 listeners.
    const tries = 12;
    const warnings: Error[] = [];
    const onWarning = (warning: Error): void => {
      if (warning.name === 'MaxListenersExceededWarning') warnings.push(warning);
    };
    process.on('warning', onWarning);
    try {
      const held: Array<() => void> = [];
      // Answers nothing until every try has arrived: all of them are in flight at once.
      const r = await receiver((res) => {
        held.push(() => res.end());
        if (held.length === tries) for (const answer of held) answer();
      });
      const store = createMemoryTaskStore({ now: () => Date.now() });
      const scope = freshScope();
      for (let i = 0; i < tries; i += 1) {
        await subscribe(store, scope, await finishTask(store, scope), 'billing');
      }
      const sender = createCompletionSender({ store, destinations: destinations(r.origin) });
      senders.push(sender);

      const { records } = await sender.runOnce();
      expect(records.map((record) => record.outcome)).toEqual(Array(tries).fill('delivered'));
      // process.emitWarning emits on a later tick.
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings.map((warning) => warning.message)).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });
});

describe('deliverEvent', () => {
  it('takes a 101 Switching Protocols as a failed try with its status, not a timeout', async () => {
    // With Upgrade headers Node hands a 101 to 'upgrade', not 'response'; unheard, the socket
    // is dropped silently and the try waited out its whole deadline as a "timeout".
    const r = await startRawReceiver((socket) => {
      socket.once('data', () =>
        socket.write(
          'HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n',
        ),
      );
    });
    open.push(r);
    const event = encodeCompletionEvent(
      buildCompletionEvent({
        scope: { tenant_id: 'acme', namespace: 'prod' },
        queue: 'email',
        task_id: 'tsk_1',
        run_id: 'run_1',
        state: 'succeeded',
        event_id: 'evt_1',
        time: Date.UTC(2026, 10, 29, 12),
      }),
    );
    const destination = destinations(r.origin, 2_000).get('billing');
    if (destination === undefined) throw new Error('no destination');

    expect(await deliverEvent({ destination, event })).toEqual({
      kind: 'retry',
      reason: 'status',
      error: 'status 101',
      status: 101,
    });
  });
});
