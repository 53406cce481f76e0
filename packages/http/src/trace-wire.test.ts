/**
 * W3C Trace Context through the HTTP app (DESIGN §4 `TraceContext`): "Empty and whitespace-only
 * list members are allowed. Vendors MUST accept empty `tracestate` headers but SHOULD avoid
 * sending them" (§3.3.1). A tracestate with no member is accepted and kept as none; until
 * 2026-12-05 it was a 400, so a client copying the tracestate it received lost its submit.
 */
import { type AcquireReply, type TaskSnapshot, validateCloudEvent } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { expectJson } from './testdata/expect.js';
import {
  ACME_PROD,
  acquireBody,
  assignTask,
  createHarness,
  KEYS,
  openSession,
  scopePath,
  settleBody,
  submitBody,
} from './testdata/harness.js';

const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

describe('W3C Trace Context: empty tracestate (DESIGN §4 TraceContext)', () => {
  // W3C Trace Context §3.3.1 (tracestate Header Field Values): "Empty and whitespace-only list
  // members are allowed. Vendors MUST accept empty `tracestate` headers but SHOULD avoid sending
  // them." The ABNF: `list-member = OWS`. A client that copies the tracestate it received into
  // `origin_trace` must not have its task refused for it.
  for (const [name, tracestate] of [
    ['an empty tracestate', ''],
    ['a whitespace-only tracestate', ' '],
    ['a tracestate of empty members only', ' , ,'],
  ] as const) {
    it(`a submit whose origin_trace carries ${name} is accepted, and the attempt's CloudEvent is valid`, async () => {
      const h = createHarness();
      const body = {
        ...submitBody(ACME_PROD, `k-empty-ts-${name}`),
        origin_trace: { traceparent: TRACEPARENT, tracestate },
      };
      const res = await h.call(`${scopePath(ACME_PROD)}/tasks`, { key: KEYS.both, json: body });
      const task = await expectJson<TaskSnapshot>(res, 201);
      expect(task.origin_trace).toEqual({ traceparent: TRACEPARENT });
      // The task is then dispatchable: its invocation event passes the CloudEvent rules.
      const session = await openSession(h);
      const reply = await expectJson<AcquireReply>(
        await h.call('/v1/worker/acquire', { key: KEYS.both, json: acquireBody(session, 0, 1) }),
        200,
      );
      expect(reply.disposition).toBe('assigned');
      if (reply.disposition !== 'assigned') return;
      expect(reply.assignment.event.traceparent).toBe(TRACEPARENT);
      expect('tracestate' in reply.assignment.event).toBe(false);
      expect(() => validateCloudEvent(reply.assignment.event)).not.toThrow();
    });
  }
});

describe('W3C Trace Context: empty tracestate in a settle processing_trace', () => {
  it('a settle whose processing_trace carries an empty tracestate is recorded, not refused', async () => {
    const h = createHarness();
    const { assignment } = await assignTask(h);
    const body = {
      ...settleBody(assignment),
      processing_trace: { traceparent: TRACEPARENT, tracestate: '' },
    };
    const res = await h.call('/v1/worker/settle', { key: KEYS.both, json: body });
    // A refused settlement leaves the attempt open until its lease expires: the work is redone.
    expect(res.status).toBe(200);
  });
});
