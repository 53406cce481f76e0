import { describe, expect, it } from 'vitest';
import { canonicalJson } from './canonical.js';
import {
  buildCompletionEvent,
  buildTaskEvent,
  type CompletionEventInput,
  cloudEventTime,
  completionResultRef,
  isValidExtensionName,
  queueSource,
  type TaskEventInput,
  validateAssignmentIdentity,
  validateCloudEvent,
  validateCompletionEvent,
} from './cloudevent.js';
import { ContractError } from './errors.js';
import { COMPLETION_EVENT_MAX_BYTES, NAME_MAX_BYTES, SCOPE_TEXT_MAX_BYTES } from './limits.js';
import {
  assignment,
  cloudEvent,
  completionEvent,
  program,
  scope,
  T1,
  T2,
  trace,
} from './schemas/testdata/examples.js';
import { utf8ByteLength } from './text.js';

function errorOf(fn: () => unknown): ContractError {
  try {
    fn();
  } catch (error) {
    expect(error).toBeInstanceOf(ContractError);
    return error as ContractError;
  }
  throw new Error('expected a ContractError, nothing was thrown');
}

const taskInput: TaskEventInput = {
  scope,
  queue: 'email',
  task_id: 'tsk_01',
  run_id: 'run_01',
  attempt_id: 'att_01',
  attempt: 1,
  program,
  data: cloudEvent.data,
  time: T1,
  trace,
  activation_id: 'tsk_01',
};

const completionInput: CompletionEventInput = {
  scope,
  queue: 'email',
  task_id: 'tsk_01',
  run_id: 'run_01',
  state: 'succeeded',
  event_id: 'evt_01',
  time: T2,
};

describe('buildTaskEvent', () => {
  it('builds the DESIGN §4 invocation event', () => {
    expect(buildTaskEvent(taskInput)).toStrictEqual(cloudEvent);
  });

  it('omits activation and trace attributes when absent', () => {
    const { activation_id: _a, trace: _t, ...plain } = taskInput;
    const event = buildTaskEvent(plain);
    expect(Object.keys(event)).not.toContain('ldgactivationid');
    expect(Object.keys(event)).not.toContain('traceparent');
    expect(Object.keys(event)).not.toContain('tracestate');
    expect(buildTaskEvent({ ...plain, trace: null })).toStrictEqual(event);
    const noState = buildTaskEvent({ ...plain, trace: { traceparent: trace.traceparent } });
    expect(noState.traceparent).toBe(trace.traceparent);
    expect(Object.keys(noState)).not.toContain('tracestate');
  });

  it('id is the attempt id; type and content type are fixed; time is RFC 3339 UTC', () => {
    const event = buildTaskEvent(taskInput);
    expect(event.id).toBe(taskInput.attempt_id);
    expect(event.type).toBe('dev.ledgence.task.attempt');
    expect(event.datacontenttype).toBe('application/json');
    expect(event.time).toBe('2024-05-01T12:00:01.000Z');
    expect(buildTaskEvent({ ...taskInput, time: 0 }).time).toBe('1970-01-01T00:00:00.000Z');
  });

  it('URI-encodes each segment of the source', () => {
    const event = buildTaskEvent({
      ...taskInput,
      scope: { tenant_id: 'a/b c', namespace: 'ünï' },
      queue: 'q?x#y',
    });
    expect(event.source).toBe('/v1/tenants/a%2Fb%20c/namespaces/%C3%BCn%C3%AF/queues/q%3Fx%23y');
    expect(event.ldgtenant).toBe('a/b c');
    expect(event.ldgqueue).toBe('q?x#y');
  });

  it('passes its own validator', () => {
    expect(validateCloudEvent(buildTaskEvent(taskInput))).toStrictEqual(cloudEvent);
  });

  it('rejects attributes that break their rules', () => {
    expect(errorOf(() => buildTaskEvent({ ...taskInput, attempt: 0 })).path).toBe('$.ldgattempt');
    expect(errorOf(() => buildTaskEvent({ ...taskInput, queue: '' })).path).toBe('$.ldgqueue');
    expect(errorOf(() => buildTaskEvent({ ...taskInput, time: -1 })).path).toBe('$.time');
    expect(errorOf(() => buildTaskEvent({ ...taskInput, time: 8.64e15 + 1 })).path).toBe('$.time');
    // Year 10000 is beyond RFC 3339's four-digit years.
    expect(errorOf(() => buildTaskEvent({ ...taskInput, time: 253_402_300_800_000 })).path).toBe(
      '$.time',
    );
  });
});

describe('cloudEventTime', () => {
  it('writes store timestamps as toISOString does', () => {
    expect(cloudEventTime(T2)).toBe('2024-05-01T12:00:30.000Z');
    expect(errorOf(() => cloudEventTime(1.5)).code).toBe('invalid_input');
  });
});

describe('buildCompletionEvent', () => {
  it('builds the DESIGN §8 completion event', () => {
    expect(buildCompletionEvent(completionInput)).toStrictEqual(completionEvent);
  });

  it('is deterministic: the same inputs give the same bytes', () => {
    expect(canonicalJson(buildCompletionEvent(completionInput))).toBe(
      canonicalJson(buildCompletionEvent({ ...completionInput })),
    );
  });

  it('references the result path with URI-encoded segments', () => {
    const event = buildCompletionEvent({
      ...completionInput,
      scope: { tenant_id: 'a b', namespace: 'n/s' },
      task_id: 'tsk?1',
    });
    expect(event.data.result_ref).toBe('/v1/tenants/a%20b/namespaces/n%2Fs/tasks/tsk%3F1/result');
    expect(event.subject).toBe('tsk?1');
    expect(completionResultRef(scope, 'tsk_01')).toBe(
      '/v1/tenants/acme/namespaces/prod/tasks/tsk_01/result',
    );
    expect(queueSource(scope, 'email')).toBe('/v1/tenants/acme/namespaces/prod/queues/email');
  });

  it('fits COMPLETION_EVENT_MAX_BYTES with maximal ordinary names', () => {
    const event = buildCompletionEvent({
      ...completionInput,
      scope: {
        tenant_id: 't'.repeat(SCOPE_TEXT_MAX_BYTES),
        namespace: 'n'.repeat(SCOPE_TEXT_MAX_BYTES),
      },
      queue: 'q'.repeat(NAME_MAX_BYTES),
      task_id: 'k'.repeat(NAME_MAX_BYTES),
      run_id: 'r'.repeat(NAME_MAX_BYTES),
      event_id: 'e'.repeat(NAME_MAX_BYTES),
    });
    expect(utf8ByteLength(canonicalJson(event))).toBeLessThanOrEqual(COMPLETION_EVENT_MAX_BYTES);
  });

  it('refuses an event that would encode beyond COMPLETION_EVENT_MAX_BYTES', () => {
    // Quotes are valid identifier text but double in JSON and triple in a URI.
    const q = (bytes: number) => '"'.repeat(bytes);
    const error = errorOf(() =>
      buildCompletionEvent({
        ...completionInput,
        scope: { tenant_id: q(SCOPE_TEXT_MAX_BYTES), namespace: q(SCOPE_TEXT_MAX_BYTES) },
        queue: q(NAME_MAX_BYTES),
        task_id: q(NAME_MAX_BYTES),
        run_id: q(NAME_MAX_BYTES),
        event_id: q(NAME_MAX_BYTES),
      }),
    );
    expect(error.code).toBe('payload_too_large');
  });

  it('accepts terminal states only', () => {
    for (const state of ['succeeded', 'failed', 'cancelled'] as const) {
      expect(buildCompletionEvent({ ...completionInput, state }).data.state).toBe(state);
    }
    const active = { ...completionInput, state: 'active' } as unknown as CompletionEventInput;
    expect(errorOf(() => buildCompletionEvent(active)).path).toBe('$.data.state');
  });

  it('passes its own validator', () => {
    expect(validateCompletionEvent(buildCompletionEvent(completionInput))).toStrictEqual(
      completionEvent,
    );
  });
});

describe('isValidExtensionName', () => {
  it.each(['ldgtenant', 'a', 'x1', 'a'.repeat(20), 'datacontenttype'])('accepts %s', (name) => {
    expect(isValidExtensionName(name)).toBe(true);
  });

  it.each(['', 'ldgTenant', 'ldg_tenant', 'ldg-tenant', 'a'.repeat(21), 'é', 'a b'])(
    'rejects %j',
    (name) => {
      expect(isValidExtensionName(name)).toBe(false);
    },
  );
});

describe('validateCloudEvent', () => {
  it('returns the typed event', () => {
    expect(validateCloudEvent(cloudEvent)).toStrictEqual(cloudEvent);
  });

  it('checks the CloudEvents 1.0 required attributes', () => {
    expect(errorOf(() => validateCloudEvent(null)).path).toBe('$');
    expect(errorOf(() => validateCloudEvent([])).path).toBe('$');
    expect(errorOf(() => validateCloudEvent({ ...cloudEvent, specversion: '0.3' })).path).toBe(
      '$.specversion',
    );
    for (const name of ['id', 'source', 'type']) {
      const { [name]: _omitted, ...without } = cloudEvent as unknown as Record<string, unknown>;
      expect(errorOf(() => validateCloudEvent(without)).path).toBe(`$.${name}`);
      expect(errorOf(() => validateCloudEvent({ ...cloudEvent, [name]: '' })).path).toBe(
        `$.${name}`,
      );
    }
  });

  it('enforces the attribute naming rule before the schema', () => {
    for (const name of ['ldgTaskId', 'ldg_extra', 'averyveryverylongattributename']) {
      const error = errorOf(() => validateCloudEvent({ ...cloudEvent, [name]: 'x' }));
      expect(error.reason).toBe('invalid_attribute_name');
    }
  });

  it('rejects well-named attributes outside the DESIGN list (strict)', () => {
    const error = errorOf(() => validateCloudEvent({ ...cloudEvent, ldgextra: 'x' }));
    expect(error.reason).toBe('schema');
    expect(error.path).toBe('$.ldgextra');
    expect(error.message).toBe('$.ldgextra is not an allowed field');
  });

  it('rejects a completion event as an attempt event and vice versa', () => {
    expect(errorOf(() => validateCloudEvent(completionEvent)).code).toBe('invalid_input');
    expect(errorOf(() => validateCompletionEvent(cloudEvent)).code).toBe('invalid_input');
  });
});

describe('validateAssignmentIdentity', () => {
  const withoutActivation = () => {
    const { ldgactivationid: _a, ...event } = assignment.event;
    const { workflow_activation_id: _w, ...rest } = assignment;
    return { ...rest, event };
  };

  it('accepts an activation whose marker, event and lease agree', () => {
    expect(() => validateAssignmentIdentity(assignment)).not.toThrow();
  });

  it('accepts an ordinary task with neither marker', () => {
    expect(() => validateAssignmentIdentity(withoutActivation())).not.toThrow();
  });

  it('rejects a marker the event does not carry, and the reverse', () => {
    const plain = withoutActivation();
    const markerOnly = { ...plain, workflow_activation_id: 'tsk_01' };
    expect(errorOf(() => validateAssignmentIdentity(markerOnly)).reason).toBe('identity_mismatch');
    const eventOnly = { ...plain, event: { ...plain.event, ldgactivationid: 'tsk_01' } };
    expect(errorOf(() => validateAssignmentIdentity(eventOnly)).reason).toBe('identity_mismatch');
  });

  it('rejects markers that differ, or that are not the leased task', () => {
    const differ = { ...assignment, workflow_activation_id: 'other' };
    expect(errorOf(() => validateAssignmentIdentity(differ)).message).toBe(
      'workflow assignment identity mismatch',
    );
    const notLeased = {
      ...assignment,
      workflow_activation_id: 'act_9',
      event: { ...assignment.event, ldgactivationid: 'act_9' },
    };
    expect(errorOf(() => validateAssignmentIdentity(notLeased)).reason).toBe('identity_mismatch');
  });
});
