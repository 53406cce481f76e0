import * as v from 'valibot';
import { describe, expect, it } from 'vitest';
import {
  DEFAULT_MAX_ATTEMPTS,
  DEFAULT_RETRY_DELAY_MS,
  DEFAULT_RETRY_MAX_DELAY_MS,
  DEFAULT_TIMEOUT_MS,
  KEY_MAX_BYTES,
  LABEL_KEY_MAX_BYTES,
  LABEL_VALUE_MAX_BYTES,
  MAX_ATTEMPTS_LIMIT,
  MAX_CONCURRENCY_LIMIT,
  MAX_LABELS,
  MAX_SUBMIT_DELAY_MS,
  MAX_TIMEOUT_MS,
  MIN_TIMEOUT_MS,
  NAME_MAX_BYTES,
  PRIORITY_MAX,
  PRIORITY_MIN,
  RETRY_MAX_DELAY_MS,
  SCOPE_TEXT_MAX_BYTES,
  TASK_CURSOR_MAX_BYTES,
  TASK_LIST_MAX_LIMIT,
} from '../limits.js';
import {
  applySubmitDefaults,
  RetryPolicySchema,
  SubmitCommandSchema,
  type SubmitTask,
  SubmitTaskSchema,
  TaskListQuerySchema,
  TaskPageSchema,
  TaskResultSchema,
  TaskSnapshotSchema,
  TaskStatusSchema,
} from './index.js';
import { submitCommand, submitTask, taskSnapshot, taskStatus } from './testdata/examples.js';

/** A minimal valid task: only the required fields. */
const minimal: SubmitTask = {
  tenant_id: 'acme',
  namespace: 'prod',
  queue: 'email',
  program: { name: 'send-email' },
  data: { to: 'a@example.com' },
};

const task = (patch: Record<string, unknown>) => ({ ...minimal, ...patch });
const accepts = (value: unknown) => v.safeParse(SubmitTaskSchema, value).success;

/** The dotted path and message of the first issue. */
function firstIssue(schema: v.GenericSchema, value: unknown): [string, string] | undefined {
  const result = v.safeParse(schema, value);
  const issue = result.issues?.[0];
  if (issue === undefined) return undefined;
  return [issue.path?.map((item) => String(item.key)).join('.') ?? '', issue.message];
}

describe('RetryPolicy', () => {
  const retry = (policy: Record<string, unknown>) => v.safeParse(RetryPolicySchema, policy).success;

  it('a given policy without backoff is fixed and needs no max_delay_ms', () => {
    expect(retry({ max_attempts: 3, delay_ms: 1000 })).toBe(true);
    expect(retry({ max_attempts: 3, delay_ms: 0 })).toBe(true);
  });

  it('fixed must not set a nonzero max_delay_ms (0 is allowed)', () => {
    expect(retry({ max_attempts: 3, delay_ms: 10, backoff: 'fixed', max_delay_ms: 0 })).toBe(true);
    expect(retry({ max_attempts: 3, delay_ms: 10, max_delay_ms: 0 })).toBe(true);
    expect(
      firstIssue(RetryPolicySchema, { max_attempts: 3, delay_ms: 10, max_delay_ms: 5 }),
    ).toEqual(['max_delay_ms', 'must be absent or 0 with fixed backoff']);
    expect(retry({ max_attempts: 3, delay_ms: 10, backoff: 'fixed', max_delay_ms: 5 })).toBe(false);
  });

  it('decodes every spelling of a fixed policy to the canonical one, without backoff or max_delay_ms (a3s is_fixed / is_zero)', () => {
    for (const policy of [
      { max_attempts: 3, delay_ms: 10 },
      { max_attempts: 3, delay_ms: 10, backoff: 'fixed' },
      { max_attempts: 3, delay_ms: 10, max_delay_ms: 0 },
      { max_attempts: 3, delay_ms: 10, backoff: 'fixed', max_delay_ms: 0 },
      { max_attempts: 3, delay_ms: 10, backoff: null, max_delay_ms: null },
    ]) {
      expect(v.parse(RetryPolicySchema, policy)).toStrictEqual({ max_attempts: 3, delay_ms: 10 });
    }
    const exponential = { max_attempts: 3, delay_ms: 10, backoff: 'exponential', max_delay_ms: 10 };
    expect(v.parse(RetryPolicySchema, exponential)).toStrictEqual(exponential);
  });

  it('exponential needs 1 <= delay_ms <= max_delay_ms <= RETRY_MAX_DELAY_MS', () => {
    const exp = (delay_ms: number, max_delay_ms?: number) =>
      retry({ max_attempts: 3, delay_ms, backoff: 'exponential', max_delay_ms });
    expect(exp(1, 1)).toBe(true);
    expect(exp(100, 100)).toBe(true);
    expect(exp(1, RETRY_MAX_DELAY_MS)).toBe(true);
    expect(exp(RETRY_MAX_DELAY_MS, RETRY_MAX_DELAY_MS)).toBe(true);
    expect(exp(0, 100)).toBe(false);
    expect(exp(101, 100)).toBe(false);
    expect(exp(1, RETRY_MAX_DELAY_MS + 1)).toBe(false);
    expect(exp(100)).toBe(false);
    expect(
      firstIssue(RetryPolicySchema, { max_attempts: 3, delay_ms: 10, backoff: 'exponential' }),
    ).toEqual(['max_delay_ms', 'is required with exponential backoff']);
    expect(
      firstIssue(RetryPolicySchema, {
        max_attempts: 3,
        delay_ms: 0,
        backoff: 'exponential',
        max_delay_ms: 10,
      }),
    ).toEqual(['delay_ms', 'must be at least 1 with exponential backoff']);
    expect(
      firstIssue(RetryPolicySchema, {
        max_attempts: 3,
        delay_ms: 20,
        backoff: 'exponential',
        max_delay_ms: 10,
      }),
    ).toEqual(['max_delay_ms', 'must be at least delay_ms']);
  });

  it('max_attempts is 1..MAX_ATTEMPTS_LIMIT and delay_ms 0..RETRY_MAX_DELAY_MS', () => {
    expect(retry({ max_attempts: 1, delay_ms: 0 })).toBe(true);
    expect(retry({ max_attempts: MAX_ATTEMPTS_LIMIT, delay_ms: RETRY_MAX_DELAY_MS })).toBe(true);
    expect(retry({ max_attempts: 0, delay_ms: 0 })).toBe(false);
    expect(retry({ max_attempts: MAX_ATTEMPTS_LIMIT + 1, delay_ms: 0 })).toBe(false);
    expect(retry({ max_attempts: 3, delay_ms: RETRY_MAX_DELAY_MS + 1 })).toBe(false);
    expect(retry({ max_attempts: 3, delay_ms: -1 })).toBe(false);
    expect(retry({ max_attempts: 3, delay_ms: 1, backoff: 'linear' })).toBe(false);
  });

  it('a null backoff or max_delay_ms is absent', () => {
    expect(
      v.parse(RetryPolicySchema, {
        max_attempts: 2,
        delay_ms: 5,
        backoff: null,
        max_delay_ms: null,
      }),
    ).toStrictEqual({ max_attempts: 2, delay_ms: 5 });
  });
});

describe('SubmitTask rules', () => {
  it('accepts the minimal task', () => {
    expect(accepts(minimal)).toBe(true);
  });

  it('available_at and delay_ms are exclusive', () => {
    expect(accepts(task({ available_at: 1 }))).toBe(true);
    expect(accepts(task({ delay_ms: 1 }))).toBe(true);
    expect(firstIssue(SubmitTaskSchema, task({ available_at: 1, delay_ms: 1 }))).toEqual([
      'delay_ms',
      'must not be given together with available_at',
    ]);
    // null is absent, so it does not count as "given".
    expect(accepts(task({ available_at: null, delay_ms: 1 }))).toBe(true);
    expect(accepts(task({ available_at: 1, delay_ms: null }))).toBe(true);
  });

  it('delay_ms is 0..MAX_SUBMIT_DELAY_MS', () => {
    expect(accepts(task({ delay_ms: 0 }))).toBe(true);
    expect(accepts(task({ delay_ms: MAX_SUBMIT_DELAY_MS }))).toBe(true);
    expect(accepts(task({ delay_ms: MAX_SUBMIT_DELAY_MS + 1 }))).toBe(false);
    expect(accepts(task({ delay_ms: -1 }))).toBe(false);
  });

  it('concurrency_limit requires concurrency_key; a key alone is fine', () => {
    expect(firstIssue(SubmitTaskSchema, task({ concurrency_limit: 2 }))).toEqual([
      'concurrency_limit',
      'requires concurrency_key',
    ]);
    expect(accepts(task({ concurrency_key: 'k' }))).toBe(true);
    expect(accepts(task({ concurrency_key: 'k', concurrency_limit: 1 }))).toBe(true);
    expect(accepts(task({ concurrency_key: 'k', concurrency_limit: MAX_CONCURRENCY_LIMIT }))).toBe(
      true,
    );
    expect(accepts(task({ concurrency_key: 'k', concurrency_limit: 0 }))).toBe(false);
    expect(
      accepts(task({ concurrency_key: 'k', concurrency_limit: MAX_CONCURRENCY_LIMIT + 1 })),
    ).toBe(false);
    expect(accepts(task({ concurrency_key: null, concurrency_limit: 2 }))).toBe(false);
  });

  it('priority is an integer in PRIORITY_MIN..PRIORITY_MAX', () => {
    expect(accepts(task({ priority: PRIORITY_MIN }))).toBe(true);
    expect(accepts(task({ priority: PRIORITY_MAX }))).toBe(true);
    expect(accepts(task({ priority: 0 }))).toBe(true);
    expect(accepts(task({ priority: PRIORITY_MIN - 1 }))).toBe(false);
    expect(accepts(task({ priority: PRIORITY_MAX + 1 }))).toBe(false);
    expect(accepts(task({ priority: 0.5 }))).toBe(false);
    expect(accepts(task({ priority: '1' }))).toBe(false);
  });

  it('timeout_ms is MIN_TIMEOUT_MS..MAX_TIMEOUT_MS', () => {
    expect(accepts(task({ timeout_ms: MIN_TIMEOUT_MS }))).toBe(true);
    expect(accepts(task({ timeout_ms: MAX_TIMEOUT_MS }))).toBe(true);
    expect(accepts(task({ timeout_ms: MIN_TIMEOUT_MS - 1 }))).toBe(false);
    expect(accepts(task({ timeout_ms: MAX_TIMEOUT_MS + 1 }))).toBe(false);
    expect(accepts(task({ timeout_ms: 0 }))).toBe(false);
  });

  it('labels: at most MAX_LABELS pairs with bounded keys and values', () => {
    const many = (n: number) =>
      Object.fromEntries(Array.from({ length: n }, (_, i) => [`label-${i}`, 'x']));
    expect(accepts(task({ labels: many(MAX_LABELS) }))).toBe(true);
    expect(accepts(task({ labels: many(MAX_LABELS + 1) }))).toBe(false);
    expect(accepts(task({ labels: { ['k'.repeat(LABEL_KEY_MAX_BYTES)]: 'v' } }))).toBe(true);
    expect(accepts(task({ labels: { ['k'.repeat(LABEL_KEY_MAX_BYTES + 1)]: 'v' } }))).toBe(false);
    expect(accepts(task({ labels: { k: 'v'.repeat(LABEL_VALUE_MAX_BYTES) } }))).toBe(true);
    expect(accepts(task({ labels: { k: 'v'.repeat(LABEL_VALUE_MAX_BYTES + 1) } }))).toBe(false);
    expect(firstIssue(SubmitTaskSchema, task({ labels: { team: '' } }))).toEqual([
      'labels.team',
      'must not be empty',
    ]);
  });

  it('text fields: exactly max bytes accepted, one more rejected', () => {
    const scope = 's'.repeat(SCOPE_TEXT_MAX_BYTES);
    const name = 'n'.repeat(NAME_MAX_BYTES);
    expect(accepts(task({ tenant_id: scope, namespace: scope, queue: name }))).toBe(true);
    expect(accepts(task({ tenant_id: `${scope}s` }))).toBe(false);
    expect(accepts(task({ namespace: `${scope}s` }))).toBe(false);
    expect(accepts(task({ queue: `${name}n` }))).toBe(false);
    expect(accepts(task({ program: { name, version: name } }))).toBe(true);
    expect(accepts(task({ program: { name: `${name}n` } }))).toBe(false);
    expect(accepts(task({ program: { name: 'p', version: `${name}n` } }))).toBe(false);
    expect(accepts(task({ concurrency_key: `${name}n` }))).toBe(false);
    const key = 'k'.repeat(KEY_MAX_BYTES);
    expect(v.safeParse(SubmitCommandSchema, { idempotency_key: key, input: minimal }).success).toBe(
      true,
    );
    expect(
      v.safeParse(SubmitCommandSchema, { idempotency_key: `${key}k`, input: minimal }).success,
    ).toBe(false);
  });

  it('data is required but may be JSON null; program is always an object', () => {
    const { data: _data, ...withoutData } = minimal;
    expect(accepts(withoutData)).toBe(false);
    expect(v.parse(SubmitTaskSchema, task({ data: null })).data).toBeNull();
    expect(accepts(task({ program: 'send-email' }))).toBe(false);
  });

  it('normalises every null optional field to absent, so replays compare equal', () => {
    const spelledWithNulls = task({
      retry: null,
      timeout_ms: null,
      available_at: null,
      delay_ms: null,
      priority: null,
      concurrency_key: null,
      concurrency_limit: null,
      labels: null,
      program: { name: 'send-email', version: null },
    });
    const output = v.parse(SubmitTaskSchema, spelledWithNulls);
    expect(output).toStrictEqual(minimal);
    expect(Object.keys(output).sort()).toEqual(Object.keys(minimal).sort());
    const command = v.parse(SubmitCommandSchema, {
      idempotency_key: 'k',
      input: spelledWithNulls,
      origin_trace: null,
    });
    expect(command).toStrictEqual({ idempotency_key: 'k', input: minimal });
  });

  it('rejects unknown fields at every level', () => {
    expect(accepts(task({ extra: 1 }))).toBe(false);
    expect(accepts(task({ program: { name: 'x', extra: 1 } }))).toBe(false);
    expect(accepts(task({ retry: { max_attempts: 1, delay_ms: 0, extra: 1 } }))).toBe(false);
    expect(v.safeParse(SubmitCommandSchema, { ...submitCommand, extra: null }).success).toBe(false);
  });
});

describe('applySubmitDefaults', () => {
  it('fills the DESIGN §4.1 defaults for an absent retry, priority and timeout', () => {
    const resolved = applySubmitDefaults(minimal);
    expect(resolved.retry).toStrictEqual({
      max_attempts: DEFAULT_MAX_ATTEMPTS,
      delay_ms: DEFAULT_RETRY_DELAY_MS,
      backoff: 'exponential',
      max_delay_ms: DEFAULT_RETRY_MAX_DELAY_MS,
    });
    expect(resolved.retry).toStrictEqual({
      max_attempts: 3,
      delay_ms: 1000,
      backoff: 'exponential',
      max_delay_ms: 60_000,
    });
    expect(resolved.priority).toBe(0);
    expect(resolved.timeout_ms).toBe(DEFAULT_TIMEOUT_MS);
    expect(resolved.timeout_ms).toBe(300_000);
  });

  it('a given retry without backoff becomes fixed; given values are kept', () => {
    const resolved = applySubmitDefaults({
      ...minimal,
      retry: { max_attempts: 7, delay_ms: 250 },
      priority: -5,
      timeout_ms: 2_000,
    });
    expect(resolved.retry).toStrictEqual({ max_attempts: 7, delay_ms: 250, backoff: 'fixed' });
    expect(resolved.priority).toBe(-5);
    expect(resolved.timeout_ms).toBe(2_000);
    expect(applySubmitDefaults(submitTask).retry).toStrictEqual(submitTask.retry);
  });

  it('does not mutate its argument, and its result is still a valid SubmitTask', () => {
    const input = structuredClone({ ...minimal, retry: { max_attempts: 2, delay_ms: 1 } });
    const before = structuredClone(input);
    const resolved = applySubmitDefaults(Object.freeze(input));
    expect(input).toStrictEqual(before);
    expect(resolved).not.toBe(input);
    expect(v.safeParse(SubmitTaskSchema, resolved).success).toBe(true);
    expect(v.safeParse(SubmitTaskSchema, applySubmitDefaults(minimal)).success).toBe(true);
  });
});

describe('reply types', () => {
  it('TaskSnapshot lineage ids come in pairs', () => {
    const { root_workflow_id: _root, ...parentOnly } = taskSnapshot;
    expect(v.safeParse(TaskSnapshotSchema, parentOnly).success).toBe(false);
    const { parent_workflow_id: _parent, ...rootOnly } = taskSnapshot;
    expect(v.safeParse(TaskSnapshotSchema, rootOnly).success).toBe(false);
    const { parent_workflow_id: _p, root_workflow_id: _r, ...neither } = taskSnapshot;
    expect(v.safeParse(TaskSnapshotSchema, neither).success).toBe(true);
  });

  it('present-with-null fields are required; skip_serializing_if fields may not be null', () => {
    const { terminal_at: _t, ...noTerminal } = taskStatus;
    expect(v.safeParse(TaskStatusSchema, noTerminal).success).toBe(false);
    expect(v.safeParse(TaskStatusSchema, { ...taskStatus, labels: null }).success).toBe(false);
    expect(v.safeParse(TaskStatusSchema, { ...taskStatus, workflow_id: null }).success).toBe(false);
    expect(v.safeParse(TaskSnapshotSchema, { ...taskSnapshot, origin_trace: null }).success).toBe(
      true,
    );
    const { origin_trace: _o, ...noTrace } = taskSnapshot;
    expect(v.safeParse(TaskSnapshotSchema, noTrace).success).toBe(false);
  });

  it('TaskResult tells pending apart from a successful null output', () => {
    const pending = v.parse(TaskResultSchema, {
      status: taskStatus,
      outcome: { state: 'pending' },
    });
    const nullOutput = v.parse(TaskResultSchema, {
      status: taskStatus,
      outcome: { state: 'succeeded', output: null },
    });
    expect(pending.outcome).toStrictEqual({ state: 'pending' });
    expect(nullOutput.outcome).toStrictEqual({ state: 'succeeded', output: null });
    expect(
      v.safeParse(TaskResultSchema, { status: taskStatus, outcome: { state: 'succeeded' } })
        .success,
    ).toBe(false);
    expect(
      v.safeParse(TaskResultSchema, {
        status: taskStatus,
        outcome: { state: 'pending', output: 1 },
      }).success,
    ).toBe(false);
  });

  it('TaskPage holds at most TASK_LIST_MAX_LIMIT tasks', () => {
    const page = (n: number) => ({ tasks: Array.from({ length: n }, () => taskStatus) });
    expect(v.safeParse(TaskPageSchema, page(0)).success).toBe(true);
    expect(v.safeParse(TaskPageSchema, page(TASK_LIST_MAX_LIMIT)).success).toBe(true);
    expect(v.safeParse(TaskPageSchema, page(TASK_LIST_MAX_LIMIT + 1)).success).toBe(false);
  });
});

describe('TaskListQuery', () => {
  const query = (patch: Record<string, unknown>) =>
    v.safeParse(TaskListQuerySchema, { filters: {}, ...patch }).success;

  it('limit is 1..TASK_LIST_MAX_LIMIT', () => {
    expect(query({ limit: 1 })).toBe(true);
    expect(query({ limit: TASK_LIST_MAX_LIMIT })).toBe(true);
    expect(query({ limit: 0 })).toBe(false);
    expect(query({ limit: TASK_LIST_MAX_LIMIT + 1 })).toBe(false);
  });

  it('cursor is base64url of at most TASK_CURSOR_MAX_BYTES', () => {
    expect(query({ cursor: 'A'.repeat(TASK_CURSOR_MAX_BYTES) })).toBe(true);
    expect(query({ cursor: 'A'.repeat(TASK_CURSOR_MAX_BYTES + 1) })).toBe(false);
    expect(query({ cursor: 'a/b' })).toBe(false);
    expect(query({ cursor: '' })).toBe(false);
  });

  it('filters are required and must be an object (an empty array is not)', () => {
    expect(v.safeParse(TaskListQuerySchema, {}).success).toBe(false);
    expect(query({ filters: [] })).toBe(false);
    expect(query({ filters: { state: 'pending' } })).toBe(false);
    expect(query({ filters: { nope: 1 } })).toBe(false);
  });

  it('normalises null filters and options away', () => {
    expect(
      v.parse(TaskListQuerySchema, {
        filters: { state: null, labels: null, queue: 'email' },
        limit: null,
        cursor: null,
      }),
    ).toStrictEqual({ filters: { queue: 'email' } });
  });
});
