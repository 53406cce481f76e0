import type { Assignment, Authority, LeaseOwner } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { clockTick, initialLease, nextRenew, renewRetryDelay } from './lease.js';

const owner: LeaseOwner = {
  scope: { tenant_id: 'acme', namespace: 'prod' },
  task_id: 't1',
  attempt_id: 'a1',
  lease_id: 'l1',
  generation: 1,
  worker_session_id: 's1',
  consumer_id: 0,
};

function authority(overrides: Partial<Authority> = {}): Authority {
  return {
    owner,
    expires_at: 0,
    remaining_ms: 1_000,
    execution_remaining_ms: 60_000,
    renew_sequence: 0,
    cancel_requested: false,
    dispatch_allowed: false,
    ...overrides,
  };
}

describe('renew retry delay', () => {
  it('never retries an unanswered dispatch renew without delay once the local expiry has passed', () => {
    const fresh = initialLease({ authority: authority() } as Assignment, 0);
    const sent = nextRenew(fresh, 'dispatch');
    if (sent === null) throw new Error('no renew');
    // Still held past its local expiry: only the server's answer ends it.
    expect(clockTick(sent.lease, 5_000).lease.lost).toBeNull();
    expect(renewRetryDelay(150, 250, sent.lease, 5_000)).toBe(150);
    expect(renewRetryDelay(5_000, 250, sent.lease, 5_000)).toBe(250);
  });
});
