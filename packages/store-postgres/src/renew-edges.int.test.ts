/**
 * Renewals at their edges, against the real store: replays after later
 * renewals, after expiry, settlement and cancel; a settlement awaiting quiescence; the
 * authority deadline; the dispatch grant recorded once across replays in separate calls.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  CONFIG,
  claimedTask,
  type Harness,
  harness,
  outcomeCode,
  renewCommand,
  SCOPE,
  successCommand,
} from './testdata/fixtures.js';

let h: Harness;
beforeAll(async () => {
  h = await harness('renew_edges');
});
afterAll(() => h.close());

async function dispatchAuthorizations(taskId: string): Promise<number> {
  const history = await h.store.history(SCOPE, taskId, 0);
  return history.filter((e) => e.event.reason === 'dispatch_authorized').length;
}

describe('renew sequences at the edges', () => {
  it('an old sequence after a later one is sequence_conflict; the last replays without extending', async () => {
    const a = await claimedTask(h, 'old-seq');
    const o = a.lease.owner;
    await h.store.renew(renewCommand(o, 1, 'dispatch'));
    const second = await h.store.renew(renewCommand(o, 2));
    expect(await outcomeCode(h.store.renew(renewCommand(o, 1, 'dispatch')))).toBe(
      'sequence_conflict',
    );
    h.advance(300);
    const replay = await h.store.renew(renewCommand(o, 2));
    expect(replay.expires_at).toBe(second.expires_at);
    expect(replay.remaining_ms).toBeLessThanOrEqual(second.remaining_ms - 300);
    // The same sequence with the other intent is a conflict, not a replay.
    expect(await outcomeCode(h.store.renew(renewCommand(o, 2, 'dispatch')))).toBe('conflict');
    expect(await dispatchAuthorizations(o.task_id)).toBe(1);
  });

  it('a replay after the lease expired, or after a confirmed settlement, is ownership_lost', async () => {
    const a = await claimedTask(h, 'after-expiry');
    const o = a.lease.owner;
    await h.store.renew(renewCommand(o, 1, 'dispatch'));
    h.advance(CONFIG.leaseDurationMs + 10);
    expect(await outcomeCode(h.store.renew(renewCommand(o, 1, 'dispatch')))).toBe('ownership_lost');
    const b = await claimedTask(h, 'after-settle');
    await h.store.renew(renewCommand(b.lease.owner, 1, 'dispatch'));
    await h.store.settle(successCommand(b, 'after-settle'));
    expect(await outcomeCode(h.store.renew(renewCommand(b.lease.owner, 1, 'dispatch')))).toBe(
      'ownership_lost',
    );
  });

  it('a dispatch replayed after cancel was requested shows the cancel and records no second grant', async () => {
    const a = await claimedTask(h, 'cancel-replay');
    const o = a.lease.owner;
    const granted = await h.store.renew(renewCommand(o, 1, 'dispatch'));
    expect(granted.dispatch_allowed).toBe(true);
    expect(await h.store.cancel(SCOPE, o.task_id)).toBe('active');
    const replay = await h.store.renew(renewCommand(o, 1, 'dispatch'));
    expect(replay).toMatchObject({ cancel_requested: true, renew_sequence: 1 });
    const next = await h.store.renew(renewCommand(o, 2));
    expect(next.cancel_requested).toBe(true);
    expect(await dispatchAuthorizations(o.task_id)).toBe(1);
  });

  it('a dispatch asked first after cancel was requested is not granted and records nothing', async () => {
    const a = await claimedTask(h, 'cancel-first');
    const o = a.lease.owner;
    await h.store.cancel(SCOPE, o.task_id);
    const refused = await h.store.renew(renewCommand(o, 1, 'dispatch'));
    expect(refused).toMatchObject({ dispatch_allowed: false, cancel_requested: true });
    expect(await dispatchAuthorizations(o.task_id)).toBe(0);
  });

  it('renewing an attempt awaiting quiescence neither shortens its lease nor grants dispatch', async () => {
    const a = await claimedTask(h, 'quiescence');
    const o = a.lease.owner;
    // Never dispatched, then settled unconfirmed: the lease is held to the authority deadline.
    await h.store.settle(successCommand(a, 'quiescence', { ok: 1 }, 'unconfirmed'));
    const held = await h.store.renew(renewCommand(o, 1, 'dispatch'));
    expect(held.dispatch_allowed).toBe(false);
    expect(held.expires_at).toBe(a.attempt_deadline + CONFIG.cleanupGraceMs);
    const keep = await h.store.renew(renewCommand(o, 2));
    expect(keep.expires_at).toBe(held.expires_at);
    expect(await dispatchAuthorizations(o.task_id)).toBe(0);
  });

  it('a heartbeat never extends past the authority deadline, and one after it is ownership_lost', async () => {
    const a = await claimedTask(h, 'deadline', { timeout_ms: 1_000 });
    const o = a.lease.owner;
    const authorityDeadline = a.attempt_deadline + CONFIG.cleanupGraceMs;
    await h.store.renew(renewCommand(o, 1, 'dispatch'));
    h.advance(1_500);
    const late = await h.store.renew(renewCommand(o, 2));
    expect(late.expires_at).toBe(authorityDeadline);
    expect(late.execution_remaining_ms).toBe(0);
    expect(late.remaining_ms).toBeLessThanOrEqual(500);
    h.advance(late.remaining_ms + 10);
    expect(await outcomeCode(h.store.renew(renewCommand(o, 3)))).toBe('ownership_lost');
  });

  it('the lease a renewal grants is counted from store time', async () => {
    const a = await claimedTask(h, 'store-time');
    const o = a.lease.owner;
    h.advance(700);
    const renewed = await h.store.renew(renewCommand(o, 1, 'dispatch'));
    const [row] =
      await h.sql`select lease_expires_at from attempts where attempt_id = ${o.attempt_id}`;
    expect(Number(row?.lease_expires_at)).toBe(renewed.expires_at);
    expect(renewed.expires_at).toBeGreaterThanOrEqual(a.lease.expires_at + 700);
    expect(renewed.remaining_ms).toBeLessThanOrEqual(CONFIG.leaseDurationMs);
  });
});
