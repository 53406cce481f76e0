/**
 * Completion senders of replicas whose destinations differ, over one real PostgreSQL (DESIGN §8):
 * during a rolling configuration change one replica has an alias and another does not yet (or no
 * longer). Each replica is its own store (pool) and sender, as in the server; a real receiver on
 * 127.0.0.1 answers. Store time moves with a test offset, never by sleeping.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  type CompletionSender,
  type CompletionSenderOptions,
  createCompletionSender,
  createDestination,
  type Destinations,
  UNCONFIGURED_GRACE_LEASES,
} from '@ledgence/callbacks';
import {
  COMPLETION_MAX_ATTEMPTS,
  type CompletionSubscription,
  type Scope,
} from '@ledgence/contracts';
import { freshScope, submitCommand } from '@ledgence/core/testing';
import { createPostgresTaskStore, type PostgresTaskStore } from '@ledgence/store-postgres';
import { createMigratedTestDatabase, type TestDatabase } from '@ledgence/store-postgres/testing';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';

const KEY = Buffer.alloc(32, 0x42);
const LEASE_MS = 10_000;
/** The senders' default wait before they take a delivery to an alias they lack. */
const GRACE_MS = UNCONFIGURED_GRACE_LEASES * LEASE_MS;
/** The longest retry delay of a try with `retryBaseMs: 1` (1..2^(n−1) ms, n ≤ 12). */
const MAX_DELAY_MS = 2 ** (COMPLETION_MAX_ATTEMPTS - 1);

let db: TestDatabase;
let replicaA: PostgresTaskStore;
let replicaB: PostgresTaskStore;
let receiver: Server;
let origin: string;
const posted: string[] = [];
let offset = 0;
let scope: Scope;

beforeAll(async () => {
  db = await createMigratedTestDatabase('callback_aliases');
  const options = { url: db.url, max: 2, clockOffsetMs: () => offset };
  replicaA = createPostgresTaskStore(options);
  replicaB = createPostgresTaskStore(options);
  receiver = createServer((request, response) => {
    posted.push(String(request.headers['webhook-id']));
    request.resume();
    request.on('end', () => response.writeHead(204).end());
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  origin = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise<void>((resolve) => {
    receiver.closeAllConnections();
    receiver.close(() => resolve());
  });
  await replicaA.close();
  await replicaB.close();
  await db.drop();
});

beforeEach(() => {
  scope = freshScope();
  posted.length = 0;
});

function destinations(...aliases: string[]): Destinations {
  return new Map(
    aliases.map((alias) => [
      alias,
      createDestination({ alias, url: `${origin}/hooks/${alias}`, secret: KEY }),
    ]),
  );
}

/** A replica's sender with the given aliases configured. */
function senderOf(
  store: PostgresTaskStore,
  aliases: string[],
  options: Partial<CompletionSenderOptions> = {},
): CompletionSender {
  return createCompletionSender({
    store,
    destinations: destinations(...aliases),
    leaseMs: LEASE_MS,
    retryBaseMs: 1,
    ...options,
  });
}

/** A cancelled task subscribed to `alias` (its delivery due at once), through replica A. */
async function dueDelivery(alias: string): Promise<CompletionSubscription> {
  const { snapshot } = await replicaA.submit(submitCommand(scope));
  await replicaA.cancel(scope, snapshot.task_id);
  const { subscription } = await replicaA.subscribe(scope, snapshot.task_id, {
    subscription_key: `key_${alias}`,
    destination: alias,
  });
  return subscription;
}

async function current(subscription: CompletionSubscription): Promise<CompletionSubscription> {
  const [found] = await replicaA.listSubscriptions(scope, subscription.task_id);
  if (found === undefined) throw new Error('subscription not listed');
  return found;
}

describe('a rolling change of the destinations', () => {
  it('a replica without the alias does not lease its deliveries: no try is spent on them', async () => {
    const withAlias = senderOf(replicaA, ['billing']);
    const without = senderOf(replicaB, ['audit']);
    const subscription = await dueDelivery('billing');

    // B, not yet configured with `billing`, polls first (as likely as not in production).
    expect(await without.runOnce()).toEqual({ leased: 0, records: [] });
    const { records } = await withAlias.runOnce();

    expect(records).toMatchObject([{ outcome: 'delivered', attempt: 1 }]);
    expect(await current(subscription)).toMatchObject({ state: 'delivered', attempts: 1 });
    expect(await current(subscription)).not.toHaveProperty('last_error');
    expect(posted).toEqual([subscription.event_id]);
  });
});

describe('an alias no replica has (removed from the configuration)', () => {
  it('is tried once due for the wait, each try failing as unconfigured, until exhausted', async () => {
    const a = senderOf(replicaA, ['billing']);
    const b = senderOf(replicaB, ['audit']);
    const subscription = await dueDelivery('retired');

    for (let attempt = 1; attempt <= COMPLETION_MAX_ATTEMPTS; attempt += 1) {
      // Due (the last try's delay is over), but not yet for the wait: both leave it.
      offset += MAX_DELAY_MS + GRACE_MS / 2;
      expect((await a.runOnce()).leased + (await b.runOnce()).leased).toBe(0);
      offset += GRACE_MS / 2;
      const { records } = await (attempt % 2 === 1 ? a : b).runOnce();
      expect(records).toMatchObject([
        {
          outcome: attempt < COMPLETION_MAX_ATTEMPTS ? 'retry' : 'exhausted',
          reason: 'unconfigured',
          attempt,
        },
      ]);
    }

    // The user sees why, on the subscription.
    expect(await current(subscription)).toMatchObject({
      state: 'exhausted',
      attempts: COMPLETION_MAX_ATTEMPTS,
      last_error: 'destination not configured',
    });
    expect(posted).toEqual([]);
  });
});
