/**
 * Completion reports sent together (the sender's reportsTogether over the Postgres
 * store's reportDeliveries), with real senders, a real receiver on 127.0.0.1 and one real
 * PostgreSQL. A receiver holds every POST until the test releases them all at once, so the tries
 * end in one turn and are reported in one store call.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  type CompletionSender,
  type CompletionSenderOptions,
  createCompletionSender,
  createDestination,
  type DeliveryRecord,
} from '@ledgence/callbacks';
import type { CompletionSubscription, Scope } from '@ledgence/contracts';
import type { DeliveryReport } from '@ledgence/core';
import { freshScope, submitCommand } from '@ledgence/core/testing';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { createMigratedTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import postgres from 'postgres';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';

const KEY = Buffer.alloc(32, 0x46);
const LEASE_MS = 20_000;

let db: TestDatabase;
let replicaA: PostgresTaskStore;
let replicaB: PostgresTaskStore;
let receiver: Server;
let origin: string;
let offset = 0;
let scope: Scope;
/** POSTs held, and every webhook id posted. */
const held: { id: string; response: ServerResponse }[] = [];
const posted: string[] = [];

beforeAll(async () => {
  db = await createMigratedTestDatabase('callbacks_batch');
  const options = { url: db.url, max: 4, clockOffsetMs: () => offset };
  replicaA = createPostgresTaskStore(options);
  replicaB = createPostgresTaskStore(options);
  receiver = createServer((request: IncomingMessage, response: ServerResponse) => {
    const id = String(request.headers['webhook-id']);
    posted.push(id);
    request.resume();
    request.on('end', () => held.push({ id, response }));
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  origin = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
});

afterAll(async () => {
  for (const { response } of held.splice(0)) response.writeHead(204).end();
  await new Promise<void>((resolve) => {
    receiver.closeAllConnections();
    receiver.close(() => resolve());
  });
  await replicaA.close();
  await replicaB.close();
  await db.drop();
});

beforeEach(async () => {
  scope = freshScope();
  posted.length = 0;
  // Leasing is global: what an earlier test left due is delivered, out of the way.
  const sql = postgres(db.url, { max: 1, onnotice: () => {} });
  await sql`
    update completion_deliveries set state = 'delivered', next_attempt_at = null,
      finished_at = 0, delivered_at = 0
    where state in ('due', 'delivering')`;
  await sql.end();
});

async function until(check: () => boolean, what: string, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** Answers every held POST in one synchronous loop. */
function releaseAll(status = 204): void {
  for (const { response } of held.splice(0)) response.writeHead(status).end();
}

function senderOf(
  store: Pick<PostgresTaskStore, 'leaseDeliveries' | 'reportDeliveries'>,
  options: Partial<CompletionSenderOptions> = {},
): CompletionSender {
  return createCompletionSender({
    store,
    destinations: new Map([
      [
        'billing',
        createDestination({
          alias: 'billing',
          url: `${origin}/hooks`,
          secret: KEY,
          timeoutMs: 15_000,
        }),
      ],
    ]),
    leaseMs: LEASE_MS,
    retryBaseMs: 1,
    ...options,
  });
}

async function dueDeliveries(count: number): Promise<CompletionSubscription[]> {
  const out: CompletionSubscription[] = [];
  for (let i = 0; i < count; i += 1) {
    const { snapshot } = await replicaA.submit(submitCommand(scope));
    await replicaA.cancel(scope, snapshot.task_id);
    const { subscription } = await replicaA.subscribe(scope, snapshot.task_id, {
      subscription_key: `key_${i}`,
      destination: 'billing',
    });
    out.push(subscription);
  }
  return out;
}

async function listed(subscriptions: CompletionSubscription[]): Promise<CompletionSubscription[]> {
  return Promise.all(
    subscriptions.map(async (s) => {
      const [found] = await replicaA.listSubscriptions(scope, s.task_id);
      if (found === undefined) throw new Error('not listed');
      return found;
    }),
  );
}

describe('reports sent together, on PostgreSQL', () => {
  it('two replicas reporting the same rows at once after a lease takeover: the new owner records every row, the old one is stale, no report fails', async () => {
    const subscriptions = await dueDeliveries(30);
    const calls: { replica: string; size: number }[] = [];
    const counting = (name: string, store: PostgresTaskStore) => ({
      leaseDeliveries: store.leaseDeliveries.bind(store),
      reportDeliveries: (reports: readonly DeliveryReport[]) => {
        calls.push({ replica: name, size: reports.length });
        return store.reportDeliveries(reports);
      },
    });
    const a = senderOf(counting('a', replicaA));
    const b = senderOf(counting('b', replicaB));
    const passA = a.runOnce();
    await until(() => held.length === 30, 'A posted all 30');
    // A's leases run out (store time); B takes every row as try 2.
    offset += LEASE_MS + 1;
    const passB = b.runOnce();
    await until(() => held.length === 60, 'B posted all 30');
    releaseAll();
    const [ra, rb] = await Promise.all([passA, passB]);
    expect(ra.leased).toBe(30);
    expect(rb.leased).toBe(30);
    const outcomes = (records: readonly DeliveryRecord[]) =>
      records.reduce<Record<string, number>>((acc, r) => {
        acc[r.outcome] = (acc[r.outcome] ?? 0) + 1;
        return acc;
      }, {});
    expect(outcomes(ra.records)).toEqual({ stale: 30 });
    expect(outcomes(rb.records)).toEqual({ delivered: 30 });
    // Batched: fewer store calls than reports.
    expect(calls.length).toBeLessThan(60);
    for (const s of await listed(subscriptions)) {
      expect(s).toMatchObject({ state: 'delivered', attempts: 2 });
    }
  });

  it('a batch whose COMMIT was made but its answer lost: every try keeps its outcome (not stale), each recorded once', async () => {
    const subscriptions = await dueDeliveries(20);
    const calls: number[] = [];
    let lost = 0;
    const sender = senderOf({
      leaseDeliveries: replicaA.leaseDeliveries.bind(replicaA),
      reportDeliveries: async (reports) => {
        calls.push(reports.length);
        const answer = await replicaA.reportDeliveries(reports);
        if (lost === 0 && reports.length > 1) {
          lost += 1;
          throw new Error('connection lost with the COMMIT sent');
        }
        return answer;
      },
    });
    const pass = sender.runOnce();
    await until(() => held.length === 20, 'all 20 posted');
    releaseAll();
    const { records } = await pass;
    expect(lost).toBe(1);
    expect(records.map((r) => r.outcome)).toEqual(records.map(() => 'delivered'));
    for (const s of await listed(subscriptions)) {
      expect(s).toMatchObject({ state: 'delivered', attempts: 1 });
    }
    expect(posted).toHaveLength(20);
  });

  it('a batch that failed without committing: each report is retried within its lease and recorded once', async () => {
    const subscriptions = await dueDeliveries(20);
    let failed = 0;
    const sender = senderOf({
      leaseDeliveries: replicaA.leaseDeliveries.bind(replicaA),
      reportDeliveries: async (reports) => {
        if (failed === 0 && reports.length > 1) {
          failed += 1;
          throw new Error('database down');
        }
        return replicaA.reportDeliveries(reports);
      },
    });
    const pass = sender.runOnce();
    await until(() => held.length === 20, 'all 20 posted');
    releaseAll(503);
    const { records } = await pass;
    expect(failed).toBe(1);
    expect(records.map((r) => r.outcome)).toEqual(records.map(() => 'retry'));
    for (const s of await listed(subscriptions)) {
      expect(s).toMatchObject({ state: 'due', attempts: 1, last_status_code: 503 });
    }
  });

  it('stop() with a window of hanging tries and a signal already aborted: every row is reported due, none left delivering', async () => {
    const subscriptions = await dueDeliveries(40);
    const sender = senderOf(replicaA, { batchSize: 40 });
    const pass = sender.runOnce();
    await until(() => held.length === 40, 'all 40 posted');
    const controller = new AbortController();
    controller.abort();
    await sender.stop({ signal: controller.signal });
    const { records } = await pass;
    expect(records.map((r) => r.outcome)).toEqual(records.map(() => 'retry'));
    for (const s of await listed(subscriptions)) {
      expect(s).toMatchObject({ state: 'due', attempts: 1, last_error: 'aborted' });
    }
    releaseAll();
  });
});
