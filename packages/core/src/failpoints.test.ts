import { describe, expect, it } from 'vitest';
import {
  createFailpoints,
  FAILPOINT_NAMES,
  FAILPOINT_STORE_OPERATIONS,
  FailpointError,
  FailpointSpecError,
  NO_FAILPOINTS,
  parseFailpoints,
} from './failpoints.js';

describe('parseFailpoints', () => {
  it('reads entries with actions and counts, ignoring whitespace', () => {
    expect(
      parseFailpoints(' settle.after_commit=crash , submit.before_commit = error * 2'),
    ).toEqual([
      { name: 'settle.after_commit', action: 'crash', count: undefined },
      { name: 'submit.before_commit', action: 'error', count: 2 },
    ]);
    expect(parseFailpoints('')).toEqual([]);
    expect(parseFailpoints('  ')).toEqual([]);
  });

  it.each([
    [
      'settle.after_comit=crash',
      /unknown failpoint "settle\.after_comit"; known: submit\.before_commit/,
    ],
    ['settle.after_commit=explode', /unknown action "explode"/],
    ['settle.after_commit=crash*0', /count must be a whole number/],
    ['settle.after_commit', /not a failpoint entry/],
    ['renew.after_reply=crash,renew.after_reply=off', /given twice/],
    ['recovery.after_reply=crash', /unknown failpoint/],
  ])('refuses %s', (spec, message) => {
    expect(() => parseFailpoints(spec)).toThrow(FailpointSpecError);
    expect(() => parseFailpoints(spec)).toThrow(message);
  });

  it('names the commit points of fourteen operations, the reply points of six routes and three delivery points', () => {
    expect(FAILPOINT_NAMES).toHaveLength(14 * 2 + 6 + 3);
  });

  it('names a before-commit and an after-commit point for every store operation', () => {
    for (const op of FAILPOINT_STORE_OPERATIONS) {
      expect(FAILPOINT_NAMES).toContain(`${op}.before_commit`);
      expect(FAILPOINT_NAMES).toContain(`${op}.after_commit`);
    }
  });
});

describe('createFailpoints', () => {
  it('is the shared disabled instance when nothing is armed', () => {
    expect(createFailpoints([])).toBe(NO_FAILPOINTS);
    expect(createFailpoints(parseFailpoints('settle.after_commit=off'))).toBe(NO_FAILPOINTS);
    expect(NO_FAILPOINTS.enabled).toBe(false);
    expect(() => NO_FAILPOINTS.hit('settle.after_commit')).not.toThrow();
  });

  it('fires only the armed point, on its first `count` hits, reporting each firing', () => {
    const fired: string[] = [];
    const points = createFailpoints(parseFailpoints('submit.before_commit=error*2'), {
      onFire: (name, action) => fired.push(`${name}:${action}`),
    });
    expect(points.enabled).toBe(true);
    points.hit('settle.after_commit');
    expect(() => points.hit('submit.before_commit')).toThrow(FailpointError);
    expect(() => points.hit('submit.before_commit')).toThrow(
      'failpoint submit.before_commit fired',
    );
    points.hit('submit.before_commit');
    expect(fired).toEqual(['submit.before_commit:error', 'submit.before_commit:error']);
  });

  it('crashes through the given crash function, and never goes on past it', () => {
    let crashes = 0;
    const points = createFailpoints(parseFailpoints('acquire.after_reply=crash'), {
      crash: () => {
        crashes += 1;
      },
    });
    expect(() => points.hit('acquire.after_reply')).toThrow(FailpointError);
    expect(crashes).toBe(1);
  });
});
