/**
 * register() checks what it is given, as it checks the handler, so a
 * misconfiguration fails at startup rather than in every task.
 */
import { NAME_MAX_BYTES } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import type { StandardSchemaV1 } from './standard-schema.js';
import { Worker } from './worker.js';

function worker(): Worker {
  return new Worker({
    url: 'http://127.0.0.1:9',
    tenant: 't',
    namespace: 'n',
    queue: 'q',
    concurrency: 1,
  });
}

describe('Worker.register', () => {
  it('refuses a program name no task can carry, saying what to fix (found by review r45a)', () => {
    const cases: [string, RegExp][] = [
      ['', /program is required/],
      ['send-email\n', /program .*\(trim it\)/],
      [' send-email', /program .*\(trim it\)/],
      ['a\u0000b', /program /],
      ['x'.repeat(NAME_MAX_BYTES + 1), /program .*128/],
      ['a\ud800', /program must be well-formed text/],
    ];
    for (const [program, says] of cases) {
      expect(() => worker().register(program, () => null), JSON.stringify(program)).toThrow(says);
    }
    expect(() => worker().register('x'.repeat(NAME_MAX_BYTES), () => null)).not.toThrow();
    expect(() => worker().register('é'.repeat(NAME_MAX_BYTES / 2), () => null)).not.toThrow();
  });

  it('refuses a schema without the Standard Schema interface (a zod 3 schema before 3.24, say)', () => {
    const legacy = {
      parse: (v: unknown) => v,
      safeParse: (v: unknown) => ({ success: true, data: v }),
    };
    expect(() =>
      worker().register('p', () => null, { schema: legacy as unknown as StandardSchemaV1 }),
    ).toThrow(TypeError);
    expect(() =>
      worker().register('p', () => null, {
        schema: { '~standard': { version: 1 } } as unknown as StandardSchemaV1,
      }),
    ).toThrow(/Standard Schema/);
  });

  it('takes a Standard Schema that is a function (as arktype types are)', () => {
    const validate = (value: unknown) => ({ value });
    const type = Object.assign((v: unknown) => v, {
      '~standard': { version: 1 as const, vendor: 'fn', validate },
    });
    expect(() => worker().register('p', () => null, { schema: type })).not.toThrow();
  });

  it('refuses a second handler for the same program', () => {
    const w = worker().register('p', () => null);
    expect(() => w.register('p', () => null)).toThrow(/already registered/);
  });
});
