/**
 * Group commit must not change answers (DESIGN §7.1): the same commands through the single
 * operations and through the batch operations give identical replies, modulo generated ids and
 * store times.
 */
import type { Assignment, LeaseOwner, Scope } from '@ledgence/contracts';
import type { ItemResult } from '@ledgence/core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { PostgresTaskStore } from './store.js';
import {
  acquireCommand,
  failureCommand,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
  successCommand,
} from './testdata/fixtures.js';

let single: Harness;
let grouped: Harness;
beforeAll(async () => {
  [single, grouped] = await Promise.all([harness('single'), harness('grouped')]);
});
afterAll(() => Promise.all([single.close(), grouped.close()]));

type Mode = 'single' | 'batch';

async function each<C, R>(
  mode: Mode,
  commands: readonly C[],
  one: (command: C) => Promise<R>,
  many: (commands: readonly C[]) => Promise<ItemResult<R>[]>,
): Promise<unknown[]> {
  const answer = (r: ItemResult<R>) => (r.ok ? { ok: r.value } : { error: r.error.code });
  if (mode === 'batch') return (await many(commands)).map(answer);
  const out: unknown[] = [];
  for (const command of commands) {
    try {
      out.push({ ok: await one(command) });
    } catch (error) {
      out.push({ error: (error as { code?: string }).code ?? String(error) });
    }
  }
  return out;
}

/** The scenario, recording every reply. */
async function scenario(store: PostgresTaskStore, mode: Mode): Promise<unknown[]> {
  const log: unknown[] = [];
  log.push(
    await each(
      mode,
      [
        submitCommand('e0', { queue: 'eq', priority: 5 }),
        submitCommand('e1', { queue: 'eq', priority: 1 }),
        submitCommand('e2', { queue: 'eq', retry: { max_attempts: 3, delay_ms: 1000 } }),
        submitCommand('e0', { queue: 'eq', priority: 5 }),
        submitCommand('e1', { queue: 'eq', priority: 2 }),
        submitCommand('later', { queue: 'eq', delay_ms: 60_000 }),
      ],
      (c) => store.submit(c),
      (c) => store.submitBatch(c),
    ),
  );
  const session = await store.openSession({ scope: SCOPE, queue: 'eq', concurrency: 4 });
  const polls = [0, 1, 2, 3].map((slot) => acquireCommand(session.id, slot, 1, 'eq'));
  const acquired = await each(
    mode,
    [...polls, acquireCommand(session.id, 9, 1, 'eq')],
    (c) => store.acquire(c, { recordEmpty: true }),
    (c) => store.acquireBatch(c, { recordEmpty: true }),
  );
  log.push(acquired);
  const assignments = acquired.flatMap((a) => {
    const reply = (a as { ok?: { reply: { disposition: string; assignment?: Assignment } } }).ok
      ?.reply;
    return reply?.disposition === 'assigned' && reply.assignment ? [reply.assignment] : [];
  });
  expect(assignments).toHaveLength(3);
  log.push(
    await each(
      mode,
      polls,
      (c) => store.acquire(c, { recordEmpty: true }),
      (c) => store.acquireBatch(c, { recordEmpty: true }),
    ),
  );
  const [a0, a1, a2] = assignments as [Assignment, Assignment, Assignment];
  const foreign: LeaseOwner = {
    ...a0.lease.owner,
    scope: { tenant_id: 'other', namespace: 'prod' } satisfies Scope,
  };
  log.push(
    await each(
      mode,
      [
        renewCommand(a0.lease.owner, 1, 'dispatch'),
        renewCommand(a1.lease.owner, 1, 'dispatch'),
        renewCommand(a2.lease.owner, 1, 'dispatch'),
        renewCommand(a0.lease.owner, 1, 'dispatch'),
        renewCommand(a1.lease.owner, 1, 'keep_alive'),
        renewCommand(a2.lease.owner, 5),
        renewCommand(foreign, 1),
      ],
      (c) => store.renew(c),
      (c) => store.renewBatch(c),
    ),
  );
  log.push(
    await each(
      mode,
      [
        successCommand(a0, 'op-a0', { n: 0 }),
        failureCommand(a1, 'op-a1'),
        successCommand(a2, 'op-a2', [2], 'unconfirmed'),
        successCommand(a0, 'op-a0', { n: 0 }),
        successCommand(a0, 'op-other'),
        successCommand(a1, 'op-a1b'),
      ],
      (c) => store.settle(c),
      (c) => store.settleBatch(c),
    ),
  );
  log.push(await store.confirmQuiescence(a2.lease.owner));
  for (const a of assignments) {
    log.push(await store.history(SCOPE, a.lease.owner.task_id, 0));
    log.push(await store.result(SCOPE, a.lease.owner.task_id));
  }
  return log;
}

const ID = /\b(tsk|run|att|lse|ses)_[0-9a-f]{32}\b/g;
const TIME_KEYS = /(_at|_ms|^expires_at|deadline|^time|^at)$/;

/** Ids become their order of appearance; store times and durations become 'T'. */
function normalise(value: unknown): unknown {
  const ids = new Map<string, string>();
  const walk = (v: unknown, key?: string): unknown => {
    if (typeof v === 'number' && key !== undefined && TIME_KEYS.test(key)) return 'T';
    if (typeof v === 'string') {
      if (key === 'time') return 'T';
      return v.replace(ID, (id) => {
        if (!ids.has(id)) ids.set(id, `${id.slice(0, 3)}#${ids.size}`);
        return ids.get(id) as string;
      });
    }
    if (Array.isArray(v)) return v.map((x) => walk(x));
    if (v !== null && typeof v === 'object') {
      return Object.fromEntries(
        Object.keys(v)
          .sort()
          .map((k) => [k, walk((v as Record<string, unknown>)[k], k)]),
      );
    }
    return v;
  };
  return walk(value);
}

it('grouped and single execution give identical replies', async () => {
  const [one, many] = await Promise.all([
    scenario(single.store, 'single'),
    scenario(grouped.store, 'batch'),
  ]);
  expect(normalise(many)).toEqual(normalise(one));
  // A sanity check that the scenario exercised rejections too.
  expect(JSON.stringify(one)).toMatch(/sequence_conflict/);
  expect(JSON.stringify(one)).toMatch(/"conflict"/);
  expect(JSON.stringify(one)).toMatch(/not_found/);
  expect(JSON.stringify(one)).toMatch(/invalid_input/);
});
