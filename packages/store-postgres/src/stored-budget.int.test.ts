/**
 * Rows that an earlier version (or a replica with a shorter
 * lease safety margin) stored must still reach an end under the current rules.
 *
 * Since ada6190 a submit whose timeout_ms is not above the lease safety margin is refused,
 * because dispatch could never be granted to it and an attempt never granted dispatch does not
 * count against max_attempts (DESIGN §4.1 "Attempt counting"). Tasks accepted before — by
 * 05049ff and earlier, which the server upgrades in place — are still in the database after the
 * upgrade. The same rows appear when an operator raises LEDGENCE_LEASE_SAFETY_MARGIN_MS.
 * Real PostgreSQL, the real store; the worker's side is what the SDK does on a refused dispatch
 * (settle `timed_out`, retryable: worker lease.ts dispatchDecision).
 */
import type { Assignment } from '@ledgence/contracts';
import { lifecycleConfig } from '@ledgence/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresTaskStore } from './store.js';
import {
  acquireCommand,
  type Harness,
  harness,
  renewCommand,
  SCOPE,
  submitCommand,
} from './testdata/fixtures.js';

// The current defaults' margin (LEASE_SAFETY_MARGIN_MS, 5 s) with short leases.
const CURRENT = lifecycleConfig({
  leaseDurationMs: 2_000,
  cleanupGraceMs: 1_000,
  leaseSafetyMarginMs: 5_000,
  sessionValidityMs: 60_000,
});

let h: Harness;
beforeAll(async () => {
  h = await harness('stored_budget', CURRENT);
});
afterAll(() => h.close());

describe('a task stored before the submit-time budget check', () => {
  it('ends within its retry budget instead of being re-queued forever', async () => {
    // What 05049ff (or a replica with a 500 ms margin) accepted and stored.
    const earlier = createPostgresTaskStore({
      url: h.db.url,
      config: lifecycleConfig({ ...CURRENT, leaseSafetyMarginMs: 500 }),
    });
    let taskId: string;
    try {
      const { snapshot } = await earlier.submit(
        submitCommand('stored-before-upgrade', {
          queue: 'legacy',
          timeout_ms: 3_000,
          retry: { max_attempts: 2, delay_ms: 0 },
        }),
      );
      taskId = snapshot.task_id;
    } finally {
      await earlier.close();
    }

    // The upgraded server's worker: claim, ask dispatch, and on a refusal settle as the SDK does.
    const session = await h.store.openSession({ scope: SCOPE, queue: 'legacy', concurrency: 1 });
    let sequence = 0;
    let claims = 0;
    let granted = false;
    for (; claims < 10; claims += 1) {
      const status = await h.store.status(SCOPE, taskId);
      if (status.state !== 'queued') break;
      sequence += 1;
      const { reply } = await h.store.acquire(acquireCommand(session.id, 0, sequence, 'legacy'), {
        recordEmpty: true,
      });
      if (reply.disposition !== 'assigned')
        throw new Error(`claim ${claims}: ${reply.disposition}`);
      const assignment: Assignment = reply.assignment;
      const authority = await h.store.renew(renewCommand(assignment.lease.owner, 1, 'dispatch'));
      if (authority.dispatch_allowed) {
        granted = true; // the handler would run: not stuck
        break;
      }
      await h.store.settle({
        owner: assignment.lease.owner,
        operation_id: `refused-${claims}`,
        report: {
          kind: 'failed',
          report: {
            kind: 'timed_out',
            message: 'dispatch was refused: too little execution budget remained',
            retryable: true,
          },
        },
        quiescence: 'confirmed',
        processing_trace: null,
      });
    }
    const final = await h.store.status(SCOPE, taskId);
    // Either its handler runs, or it fails within max_attempts (2) claims; it must not be
    // handed out and refused again and again (the server re-queued it with attempt_count 533
    // after 15 s of a real Worker, before this rule).
    expect({
      ended: granted ? 'dispatched' : final.state,
      withinBudget: final.attempt_count <= 2,
    }).toMatchObject({ ended: expect.stringMatching(/^(dispatched|failed)$/), withinBudget: true });
  });
});
