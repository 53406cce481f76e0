import type { AttemptRow } from '@ledgence/core';
import { describe, expect, it } from 'vitest';
import { attemptFromDb, lastRenewalColumn, settlementColumn } from './codec.js';

const owner = {
  scope: { tenant_id: 'acme', namespace: 'prod' },
  task_id: 'tsk_01',
  attempt_id: 'att_01',
  lease_id: 'lse_01',
  generation: 1,
  worker_session_id: 'ses_01',
  consumer_id: 3,
};

const settled: AttemptRow = {
  tenant_id: 'acme',
  namespace: 'prod',
  task_id: 'tsk_01',
  attempt_id: 'att_01',
  ordinal: 1,
  lease_id: 'lse_01',
  generation: 1,
  worker_session_id: 'ses_01',
  consumer_id: 3,
  state: 'succeeded',
  claimed_at: 1_000,
  deadline: 61_000,
  authority_deadline: 91_000,
  lease_expires_at: 31_000,
  renew_sequence: 1,
  last_renewal: { owner, sequence: 1, intent: 'dispatch' },
  dispatch_allowed: true,
  quiescence: 'confirmed',
  settlement: {
    command: {
      owner,
      operation_id: 'op_01',
      report: {
        kind: 'completed',
        report: {
          context: { identity: { task_id: 'tsk_01', attempt_id: 'att_01' } },
          outcome: { kind: 'success', output: { sent: true, note: 'nul \u0000 kept' } },
          started_at: 2_000,
          finished_at: 3_000,
        },
      },
      quiescence: 'confirmed',
      processing_trace: null,
    },
    receipt: { operation_id: 'op_01', task_id: 'tsk_01', attempt_id: 'att_01', accepted_at: 3_500 },
  },
  settlement_digest: 'a'.repeat(64),
  pending: null,
  finished_at: 3_500,
};

/** The row as the database hands it back: JSON columns parsed, bigints as text. */
function stored(
  row: AttemptRow,
  columns: { last_renewal: string | null; settlement: string | null },
) {
  return {
    ...row,
    claimed_at: String(row.claimed_at),
    deadline: String(row.deadline),
    last_renewal: columns.last_renewal === null ? null : JSON.parse(columns.last_renewal),
    settlement: columns.settlement === null ? null : JSON.parse(columns.settlement),
  };
}

describe('attempt columns without what the row already says', () => {
  it('store neither the owner nor the receipt ids, and read back the same row', () => {
    const renewal = lastRenewalColumn(settled);
    const settlement = settlementColumn(settled);
    for (const text of [renewal, settlement]) {
      expect(text).not.toContain('lse_01');
      expect(text).not.toContain('ses_01');
    }
    expect(JSON.parse(renewal ?? 'null')).toEqual({ sequence: 1, intent: 'dispatch' });
    expect(JSON.parse(settlement ?? 'null').accepted_at).toBe(3_500);
    expect(attemptFromDb(stored(settled, { last_renewal: renewal, settlement }))).toStrictEqual(
      settled,
    );
  });

  it('read rows written whole (before the change) as they were', () => {
    const whole = {
      last_renewal: JSON.stringify(settled.last_renewal),
      settlement: JSON.stringify(settled.settlement),
    };
    expect(attemptFromDb(stored(settled, whole))).toStrictEqual(settled);
  });

  it('store a value whole when its owner is not the row owner, so nothing is lost', () => {
    const other = { ...owner, lease_id: 'lse_other' };
    const row: AttemptRow = {
      ...settled,
      last_renewal: { owner: other, sequence: 1, intent: 'keep_alive' },
      settlement: settled.settlement && {
        ...settled.settlement,
        command: { ...settled.settlement.command, owner: other },
      },
    };
    const columns = { last_renewal: lastRenewalColumn(row), settlement: settlementColumn(row) };
    expect(columns.last_renewal).toContain('lse_other');
    expect(columns.settlement).toContain('lse_other');
    expect(attemptFromDb(stored(row, columns))).toStrictEqual(row);
  });

  it('keep SQL NULL for an attempt not yet renewed or settled', () => {
    const fresh: AttemptRow = { ...settled, last_renewal: null, settlement: null };
    expect(lastRenewalColumn(fresh)).toBeNull();
    expect(settlementColumn(fresh)).toBeNull();
    expect(attemptFromDb(stored(fresh, { last_renewal: null, settlement: null }))).toStrictEqual(
      fresh,
    );
  });
});
