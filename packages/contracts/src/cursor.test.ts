import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { decodeTaskCursor, encodeTaskCursor } from './cursor.js';
import { ContractError } from './errors.js';
import { TASK_CURSOR_MAX_BYTES } from './limits.js';
import type { TaskFilters } from './schemas/index.js';
import { textProblem } from './text.js';

const scope = { tenant_id: 'acme', namespace: 'prod' };
const filters: TaskFilters = { state: 'queued', queue: 'email', labels: { team: 'a', env: 'b' } };
const position = { submitted_at: 1_764_400_000_000, task_id: 'tsk_0192' };

function rejectionOf(run: () => unknown): ContractError {
  try {
    run();
  } catch (error) {
    if (error instanceof ContractError) return error;
    throw error;
  }
  throw new Error('expected a ContractError');
}

describe('task cursors', () => {
  it('round-trip the position for the same scope and filters', () => {
    const cursor = encodeTaskCursor(scope, filters, position);
    expect(cursor).toMatch(/^[A-Za-z0-9_-]+$/);
    expect(cursor.length).toBeLessThanOrEqual(TASK_CURSOR_MAX_BYTES);
    expect(decodeTaskCursor(cursor, scope, filters)).toEqual(position);
  });

  it('ignore key order and omitted-versus-absent filters', () => {
    const cursor = encodeTaskCursor(scope, filters, position);
    const reordered: TaskFilters = {
      labels: { env: 'b', team: 'a' },
      queue: 'email',
      state: 'queued',
      program: undefined,
    };
    expect(decodeTaskCursor(cursor, scope, reordered)).toEqual(position);
  });

  it('reject a cursor replayed with other filters', () => {
    const cursor = encodeTaskCursor(scope, filters, position);
    for (const other of [
      { ...filters, state: 'active' as const },
      { ...filters, labels: { team: 'a' } },
      { state: 'queued' as const, queue: 'email' },
      { ...filters, submitted_from: 0 },
    ]) {
      const error = rejectionOf(() => decodeTaskCursor(cursor, scope, other));
      expect(error.code).toBe('invalid_input');
      expect(error.reason).toBe('invalid_cursor');
      expect(error.path).toBe('query.cursor');
    }
  });

  it('reject a cursor replayed in another scope', () => {
    const cursor = encodeTaskCursor(scope, filters, position);
    for (const other of [
      { tenant_id: 'acme', namespace: 'staging' },
      { tenant_id: 'globex', namespace: 'prod' },
    ]) {
      expect(rejectionOf(() => decodeTaskCursor(cursor, other, filters)).reason).toBe(
        'invalid_cursor',
      );
    }
  });

  it('reject malformed, tampered and oversized cursors with a clear error', () => {
    const good = encodeTaskCursor(scope, filters, position);
    const forged = (payload: unknown) =>
      Buffer.from(JSON.stringify(payload), 'utf8').toString('base64url');
    const binding = JSON.parse(Buffer.from(good, 'base64url').toString('utf8'))[1];
    const bad = [
      '',
      'not base64!',
      'x'.repeat(TASK_CURSOR_MAX_BYTES + 1),
      Buffer.from('not json').toString('base64url'),
      forged({ v: 1 }),
      forged([2, binding, position.submitted_at, position.task_id]),
      forged([1, binding, -1, position.task_id]),
      forged([1, binding, 1.5, position.task_id]),
      forged([1, binding, position.submitted_at, '']),
      forged([1, binding, position.submitted_at, 7]),
      forged([1, 'forged-binding', position.submitted_at, position.task_id]),
    ];
    for (const cursor of bad) {
      const error = rejectionOf(() => decodeTaskCursor(cursor, scope, filters));
      expect(error.code).toBe('invalid_input');
      expect(error.reason).toBe('invalid_cursor');
    }
  });

  it('round-trip arbitrary positions (property)', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }),
        // Task ids are identifier text, so only strings the text rule accepts.
        fc.string({ minLength: 1, maxLength: 40 }).filter((s) => textProblem(s, 128) === undefined),
        (submittedAt, taskId) => {
          const at = { submitted_at: submittedAt, task_id: taskId };
          const cursor = encodeTaskCursor(scope, filters, at);
          expect(decodeTaskCursor(cursor, scope, filters)).toEqual(at);
        },
      ),
    );
  });
});
