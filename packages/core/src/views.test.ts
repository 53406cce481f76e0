/**
 * The bound a submission's status is checked against at the edge (TASK_STATUS_MAX_BYTES, with
 * the contracts' `taskStatusMaxBytes`), held to the status the core really answers: the task a
 * submission creates, with every field that changes over its life at its widest.
 */
import {
  ContractError,
  NAME_MAX_BYTES,
  type SubmitCommand,
  TASK_STATUS_MAX_BYTES,
  TaskStateSchema,
  taskStatusMaxBytes,
  utf8ByteLength,
  validateSubmitCommand,
} from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import { DEFAULT_LIFECYCLE_CONFIG } from './config.js';
import { newId } from './ids.js';
import { submitTask } from './submit.js';
import { freshScope, submitCommand, submitCommandWithStatusBytes } from './testing/fixtures.js';
import { taskStatus } from './views.js';

const scope = freshScope();
const encodedBytes = (value: unknown): number => utf8ByteLength(JSON.stringify(value));

/**
 * The compact size of the largest status of the task `command` creates: ids as long as a name
 * may be, each state in turn, and every timestamp and the attempt count at 2^53−1.
 */
function widestStatusBytes(command: SubmitCommand): number {
  const id = 'x'.repeat(NAME_MAX_BYTES);
  const { task } = submitTask(
    null,
    command,
    0,
    { task_id: id, run_id: id },
    DEFAULT_LIFECYCLE_CONFIG,
  );
  const widest = Number.MAX_SAFE_INTEGER;
  const sizes = TaskStateSchema.options.map((state) =>
    encodedBytes(
      taskStatus({
        ...task,
        state,
        submitted_at: widest,
        available_at: widest,
        terminal_at: widest,
        cancel_requested_at: widest,
        attempt_count: widest,
      }),
    ),
  );
  return Math.max(...sizes);
}

describe('taskStatusMaxBytes against the status the core answers', () => {
  it.each([
    ['the fixture defaults', submitCommand(scope)],
    ['no labels (an empty object is omitted)', submitCommand(scope, { labels: {} })],
    [
      'a versioned program and max_attempts at 100',
      submitCommand(scope, {
        program: { name: 'p', version: '1.2.3' },
        retry: { max_attempts: 100, delay_ms: 0 },
      }),
    ],
    [
      'labels JSON escapes and multi-byte text',
      submitCommand(scope, {
        queue: 'q"\\',
        labels: { 'a"b': 'c\\d', é: '😀 ünï-cødé' },
      }),
    ],
    ['labels at their largest', submitCommandWithStatusBytes(scope, TASK_STATUS_MAX_BYTES)],
  ])('is the compact size of the widest status, for %s', (_name, command) => {
    expect(taskStatusMaxBytes(command.input)).toBe(widestStatusBytes(command));
  });

  it('widens ids to what the server issues: at most NAME_MAX_BYTES, nothing JSON escapes', () => {
    for (const id of [newId('task'), newId('run')]) {
      expect(utf8ByteLength(id)).toBeLessThanOrEqual(NAME_MAX_BYTES);
      expect(JSON.stringify(id)).toBe(`"${id}"`);
    }
  });

  it('accepts a submission whose widest status is exactly TASK_STATUS_MAX_BYTES; one byte more is payload_too_large', () => {
    const atLimit = submitCommandWithStatusBytes(scope, TASK_STATUS_MAX_BYTES);
    expect(widestStatusBytes(validateSubmitCommand(atLimit))).toBe(TASK_STATUS_MAX_BYTES);

    const over = submitCommandWithStatusBytes(scope, TASK_STATUS_MAX_BYTES + 1);
    expect(widestStatusBytes(over)).toBe(TASK_STATUS_MAX_BYTES + 1);
    let error: unknown;
    try {
      validateSubmitCommand(over);
    } catch (thrown) {
      error = thrown;
    }
    expect(error).toBeInstanceOf(ContractError);
    expect(error).toMatchObject({
      code: 'payload_too_large',
      reason: 'status_too_large',
      path: '$.input',
    });
  });
});
